-- purge: an operator deletes the in-flight state of one message (its record, its sub-markers,
-- and its field when that is not DONE). DONE markers and spent values stay.
--
-- KEYS      the message's KPM keys (see _record.lua)
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms; ARGV[5] the marker field
-- Returns 1 when something was deleted, 0 when there was nothing, -1 when it is a live claim
-- (PROCESSING with its lease not yet expired), which is never deleted.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local field = ARGV[5]
local b, v = find(1, field, bmax, bmin, nil)
local rk = record_key(1)
local old = redis.call('GET', rk)
local f = old and rec_split(old) or nil
if old and not f then
  return rec_bad(rk)
end
if v and is_inflight(v) and inf_lease(v) > now then
  return -1
end
if v and is_pointer(v) and f and f[F_ST] == 'P' and (tonumber(f[F_LEASE]) or 0) > now then
  return -1
end
local n = redis.call('DEL', rk, plugins_key(1))
-- Any field that is not DONE goes: an in-flight value, a pointer, or a value this layout does
-- not write (claims answer BUSY on it until it is purged).
if v and not is_done(v) then
  n = n + redis.call('HDEL', bucket_key(1, b), field)
end
return n > 0 and 1 or 0
