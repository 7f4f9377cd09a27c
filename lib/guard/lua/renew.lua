-- renew: extend the lease of messages still owned by the caller.
--
-- KEYS      KPM per message (see _record.lua)
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- ARGV[5..6] lease ms, in-flight TTL ms; then 3 per message: the marker field, the owner token
--   and fence as 'owner|fence', the idempotency key (a record made here keeps it)
-- Returns per message 0 (renewed) or -1 (lease lost: nothing changed).
--
-- A lease that expired without anyone else claiming the message can still be renewed: the owner
-- token and fence still match, so nobody else has run it.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local lease_until = now + tonumber(ARGV[5])
local exp = now + tonumber(ARGV[6])
local out = {}
for i = 1, #KEYS / KPM do
  local a = 6 + (i - 1) * 3
  local field, who = ARGV[a + 1], ARGV[a + 2]
  local owner = string.sub(who, 1, OWNER_LEN)
  local fence = string.sub(who, OWNER_LEN + 2)
  local b, v = find(i, field, bmax, bmin, nil)
  local res = -1
  if v and is_inflight(v) then
    -- An in-flight value's lease follows from its fence: a longer one needs the record.
    if inf_mine(v, owner, fence) then
      local f = rec_new('P', owner, inf_fence(v), '0', 1, exp, lease_until, now, ARGV[a + 3])
      redis.call('SET', record_key(i), rec_join(f), 'PXAT', exp)
      redis.call('HSET', bucket_key(i, b), field, 'R')
      redis.call('PEXPIRE', plugins_key(i), exp - now)
      res = 0
    end
  elseif v and is_pointer(v) then
    local rk = record_key(i)
    local old = redis.call('GET', rk)
    local f = old and rec_split(old) or nil
    if f and f[F_ST] == 'P' and f[F_OWNER] == owner and f[F_FENCE] == fence then
      f[F_EXP], f[F_LEASE] = fmt(exp), fmt(lease_until)
      redis.call('SET', rk, rec_join(f), 'PXAT', exp)
      redis.call('PEXPIRE', plugins_key(i), exp - now)
      res = 0
    end
  end
  out[i] = res
end
return out
