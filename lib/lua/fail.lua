-- fail: mark messages FAILED and drop the lease so that a retry can claim them at once.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV[1]   FAILED retention ms; then 3 per message: ownership prefix 'P|owner|fence|', reason,
--           attempts
-- Returns per message 0 (FAILED written) or -1 (lease lost: nothing changed).
-- The fencing counter and the finished plugins stay in the record.
local now = server_ms()
local now_s = string.format('%d', now)
local exp_s = string.format('%d', now + tonumber(ARGV[1]))
local out = {}
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 3
  local pfx = ARGV[a + 1]
  local v = redis.call('GET', KEYS[i])
  local f = (v and string.sub(v, 1, #pfx) == pfx) and rec_split(v) or nil
  if f then
    f[F_ST], f[F_OWNER], f[F_EXP], f[F_LEASE] = 'F', '', exp_s, '0'
    f[F_FAILS], f[F_FAILED], f.reason = ARGV[a + 3], now_s, ARGV[a + 2]
    redis.call('SET', KEYS[i], rec_join(f), 'PXAT', exp_s)
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
