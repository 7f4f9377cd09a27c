-- renew: extend the lease of messages still owned by the caller.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV[1..2] lease ms, in-flight TTL ms; then 2 per message: owner token, fence
-- Returns per message 0 (renewed) or -1 (lease lost: nothing changed).
--
-- A lease that expired without anyone else claiming the message can still be renewed: the owner
-- token and fence still match, so nobody else has run it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local lease_until = string.format('%d', now + lease)
local out = {}
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 2
  local rec = redis.call('HMGET', KEYS[i], 'st', 'owner', 'fence')
  if rec[1] == 'P' and rec[2] == ARGV[a + 1] and rec[3] == ARGV[a + 2] then
    redis.call('HSET', KEYS[i], 'lease', lease_until)
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
