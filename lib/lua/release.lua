-- release: an operator clears a PROCESSING claim whose owner is known to be dead.
--
-- KEYS[1]   the in-flight record
-- ARGV[1]   FAILED retention ms
-- Returns 1 when a claim was cleared, 0 when the message was not PROCESSING. The fencing counter
-- stays, so the next claim gets a higher fence and the old owner is refused as lease lost.
if redis.call('HGET', KEYS[1], 'st') ~= 'P' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'st', 'F', 'reason', 'released', 'failed', now)
redis.call('HDEL', KEYS[1], 'owner', 'lease')
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
