-- release: an operator clears a PROCESSING claim whose owner is known to be dead.
--
-- KEYS[1]   the in-flight record
-- ARGV[1]   FAILED retention ms
-- Returns 1 when a claim was cleared, 0 when the message was not PROCESSING. The fencing counter
-- stays, so the next claim gets a higher fence and the old owner is refused as lease lost.
local v = redis.call('GET', KEYS[1])
-- the state F_ST is the record's first field
if not v or string.sub(v, 1, 2) ~= 'P|' then
  return 0
end
local f = rec_split(v)
if not f then
  return rec_bad(KEYS[1])
end
local now = server_ms()
local exp_s = string.format('%d', now + tonumber(ARGV[1]))
f[F_ST], f[F_OWNER], f[F_EXP], f[F_LEASE] = 'F', '', exp_s, '0'
f[F_FAILED], f.reason = string.format('%d', now), 'released'
redis.call('SET', KEYS[1], rec_join(f), 'PXAT', exp_s)
return 1
