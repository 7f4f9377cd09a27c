-- fail: mark messages FAILED and drop the lease so that a retry can claim them at once.
--
-- KEYS      KPM per message (see _record.lua)
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- ARGV[5]   FAILED retention ms; then 6 per message: the marker field, 'owner|fence', the
--   payload tag, the idempotency key, the reason, the caller's attempt count
-- Returns per message 0 (FAILED written) or -1 (lease lost: nothing changed).
-- The fencing counter and the finished plugins stay; an in-flight value becomes a record (the
-- admin tool lists FAILED messages by their records) and its field the pointer 'R'.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local exp = now + tonumber(ARGV[5])
local out = {}
for i = 1, #KEYS / KPM do
  local a = 5 + (i - 1) * 6
  local field, who, tag, key = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local owner = string.sub(who, 1, OWNER_LEN)
  local fence = string.sub(who, OWNER_LEN + 2)
  local b, v = find(i, field, bmax, bmin, nil)
  local f = nil
  if v and is_inflight(v) then
    if inf_mine(v, owner, fence) then
      f = rec_new('P', owner, inf_fence(v), tag, 1, exp, 0, now, key)
      redis.call('HSET', bucket_key(i, b), field, 'R')
    end
  elseif v and is_pointer(v) then
    local old = redis.call('GET', record_key(i))
    f = old and rec_split(old) or nil
    if f and not (f[F_ST] == 'P' and f[F_OWNER] == owner and f[F_FENCE] == fence) then
      f = nil
    end
  end
  if f then
    f[F_ST], f[F_OWNER], f[F_EXP], f[F_LEASE] = 'F', '', fmt(exp), '0'
    f[F_FAILS], f[F_FAILED], f.reason = ARGV[a + 6], fmt(now), ARGV[a + 5]
    redis.call('SET', record_key(i), rec_join(f), 'PXAT', exp)
    redis.call('PEXPIREAT', plugins_key(i), exp)
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
