-- rearm: let a FAILED message run again with a fresh retry budget (the redrive of a
-- dead-lettered message).
--
-- KEYS[1]   the in-flight record
-- Returns 1 when the record was FAILED and its attempt counter now restarts, 0 otherwise.
-- The fencing counter, the finished plugins and the TTL stay as they are.
if redis.call('HGET', KEYS[1], 'st') ~= 'F' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'attempt', '0', 'rearmed', string.format('%d', now))
return 1
