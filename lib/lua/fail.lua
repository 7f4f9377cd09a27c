-- fail: mark messages FAILED and drop the lease so that a retry can claim them at once.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV[1]   FAILED retention ms; then 4 per message: owner token, fence, reason, attempts
-- Returns per message 0 (FAILED written) or -1 (lease lost: nothing changed).
-- The fencing counter and the finished plugins stay in the record.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 4
  local rec = redis.call('HMGET', KEYS[i], 'st', 'owner', 'fence')
  if rec[1] == 'P' and rec[2] == ARGV[a + 1] and rec[3] == ARGV[a + 2] then
    redis.call('HSET', KEYS[i], 'st', 'F', 'reason', ARGV[a + 3], 'fails', ARGV[a + 4],
               'failed', now)
    redis.call('HDEL', KEYS[i], 'owner', 'lease')
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
