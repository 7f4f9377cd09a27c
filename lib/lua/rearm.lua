-- rearm: let a FAILED message run again with a fresh retry budget (the redrive of a
-- dead-lettered message).
--
-- KEYS[1]   the in-flight record
-- Returns 1 when the record was FAILED and its attempt counter now restarts, 0 otherwise.
-- The fencing counter, the finished plugins, the key and the absolute expiry stay as they are.
local v = redis.call('GET', KEYS[1])
-- the state F_ST is the record's first field
if not v or string.sub(v, 1, 2) ~= 'F|' then
  return 0
end
local f = rec_split(v)
if not f then
  return rec_bad(KEYS[1])
end
f[F_ATTEMPT], f[F_REARMED] = '0', string.format('%d', server_ms())
redis.call('SET', KEYS[1], rec_join(f), 'PXAT', f[F_EXP])
return 1
