-- plugin_done: record that one plugin finished, with its small result.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV: 3 per message: ownership prefix 'P|owner|fence|', plugin name, result
-- Returns per message 0 (recorded) or -1 (lease lost: nothing changed).
--
-- The results live inside the record string, so they need no key of their own, vanish with the
-- record on complete (one GETDEL) and share its TTL (KEEPTTL).
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 3
  local pfx = ARGV[a + 1]
  local v = redis.call('GET', KEYS[i])
  local f = (v and string.sub(v, 1, #pfx) == pfx) and rec_split(v) or nil
  if f then
    f.plugins = plugins_put(f.plugins, ARGV[a + 2], ARGV[a + 3])
    redis.call('SET', KEYS[i], rec_join(f), 'KEEPTTL')
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
