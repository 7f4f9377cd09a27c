-- rearm: let a FAILED message run again with a fresh retry budget (the redrive of a
-- dead-lettered message).
--
-- KEYS      the message's KPM keys (see _record.lua); only its record is read
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- Returns 1 when the record was FAILED and its attempt counter now restarts, 0 otherwise.
-- The fencing counter, the finished plugins, the key and the absolute expiry stay as they are.
local rk = record_key(1)
local v = redis.call('GET', rk)
-- the state F_ST is the record's first field
if not v or string.sub(v, 1, 2) ~= 'F|' then
  return 0
end
local f = rec_split(v)
if not f then
  return rec_bad(rk)
end
local now = server_time()
f[F_ATTEMPT], f[F_REARMED] = '0', fmt(now)
redis.call('SET', rk, rec_join(f), 'PXAT', f[F_EXP])
return 1
