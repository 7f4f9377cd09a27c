-- purge: an operator deletes the in-flight record of one message.
--
-- KEYS[1]   the in-flight record
-- Returns 1 when the record was deleted, 0 when there was none, -1 when it is a live claim
-- (PROCESSING with its lease not yet expired), which is never deleted.
-- The record goes with GETDEL rather than DEL so that the guard's ACL needs no extra command.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local f = rec_split(v)
if not f then
  return rec_bad(KEYS[1])
end
if f[F_ST] == 'P' and (tonumber(f[F_LEASE]) or 0) > server_ms() then
  return -1
end
redis.call('GETDEL', KEYS[1])
return 1
