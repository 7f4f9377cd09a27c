-- release: an operator clears a PROCESSING claim whose owner is known to be dead.
--
-- KEYS      the message's KPM keys (see _record.lua)
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- ARGV[5..7] FAILED retention ms, the marker field, the idempotency key
-- Returns 1 when a claim was cleared, 0 when the message was not PROCESSING. The fencing counter
-- stays (an in-flight value becomes a record), so the next claim gets a higher fence, and the
-- field becomes the pointer 'R', so the old owner can never take it back.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local exp = now + tonumber(ARGV[5])
local field = ARGV[6]
local b, v = find(1, field, bmax, bmin, nil)
local rk = record_key(1)
local f = nil
if v and is_inflight(v) then
  f = rec_new('P', '', inf_fence(v), '0', 1, exp, 0, now, ARGV[7])
  redis.call('HSET', bucket_key(1, b), field, 'R')
elseif v and is_pointer(v) then
  local old = redis.call('GET', rk)
  f = old and rec_split(old) or nil
  if old and not f then
    return rec_bad(rk)
  end
  if f and f[F_ST] ~= 'P' then
    f = nil
  end
end
if not f then
  return 0
end
f[F_ST], f[F_OWNER], f[F_EXP], f[F_LEASE] = 'F', '', fmt(exp), '0'
f[F_FAILED], f.reason = fmt(now), 'released'
redis.call('SET', rk, rec_join(f), 'PXAT', exp)
redis.call('PEXPIREAT', plugins_key(1), exp)
return 1
