-- plugin_done: record that one plugin finished, with its small result.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV: 4 per message: owner token, fence, plugin name, result
-- Returns per message 0 (recorded) or -1 (lease lost: nothing changed).
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 4
  local rec = redis.call('HMGET', KEYS[i], 'st', 'owner', 'fence')
  if rec[1] == 'P' and rec[2] == ARGV[a + 1] and rec[3] == ARGV[a + 2] then
    redis.call('HSET', KEYS[i], 'p:' .. ARGV[a + 3], ARGV[a + 4])
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
