-- claim: take messages that are absent, FAILED, released, or PROCESSING with an expired lease.
--
-- KEYS      KPM per message (see _record.lua): its NB buckets, its record, its sub-markers
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- ARGV[5..6] lease ms, in-flight TTL ms (a record's life after a takeover)
-- then 5 per message: the marker field, the new owner token, the payload tag, the idempotency
--   key, and `mine`: the in-flight value this claim already wrote natively (lib/guard/guard_native.c
--   sends the claims whose native steps met another state here), or ''
--
-- Per message it returns one of
--   -fence                                      CLAIMED, new: the fence (negative), attempt 1,
--                                               nothing finished; the owner token is the one
--                                               the in-flight value derives from its fence
--                                               (_record.lua's inf_owner_of), not ARGV's
--   2 / 3                                       DUPLICATE, same / other payload
--   {1, fence, attempt, {plugin, result, ...}}  CLAIMED again (FAILED, released, or an expired
--                                               lease), with the plugins already finished
--   {3, ms_left}                                BUSY
--   {4, ms}                                     BUSY on a field value this layout does not
--                                               write (retry after ms; an operator clears it)
--
-- The live buckets are probed newest first: a message DONE anywhere in the retention is a
-- duplicate whatever else exists. A message without any state gets an in-flight value in the
-- newest bucket; one whose in-flight value's lease expired, or whose record is FAILED or
-- released, is taken over: its state moves to (or stays in) its record and its field becomes
-- the pointer 'R', so that a late native complete of the old owner can only turn the pointer
-- into a truthful DONE marker, never overwrite the new owner's state (docs/guard.md §4).
--
-- Fencing tokens come from this server's clock in microseconds: a new message's fence is the
-- end of its lease (server time + lease), a takeover's the larger of the old fence + 1 and the
-- server time, so a fence is
-- greater than every fence handed out for the message before, also when Redis forgot the
-- message in between (docs/guard.md §3.4).
local now, now_us = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local lease = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local lease_until = now + lease
local expire_at = (bmax + 1) * WIDTH + RETENTION
local out = {}
for i = 1, #KEYS / KPM do
  local a = 6 + (i - 1) * 5
  local field, owner, tag, key, mine = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local b, v, mine_at = find(i, field, bmax, bmin, mine ~= '' and mine or nil)
  -- A DONE marker in an older bucket wins over whatever a newer one holds: an in-flight value
  -- left there by a native claim whose second round trip never came (it wrote the newest bucket,
  -- saw the marker, and the script that takes the value back never ran) must not be taken over
  -- as if the message had never been done.
  if v and not is_done(v) then
    for ob = b - 1, bmin, -1 do
      local ov = redis.call('HGET', bucket_key(i, ob), field)
      if ov and is_done(ov) then
        b, v = ob, ov
        break
      end
    end
  end
  local res
  if not v then
    if mine_at then
      -- Our native claim was right after all: the state it met is gone.
      res = -inf_fence(mine)
    else
      local bk = bucket_key(i, bmax)
      -- The fence of an in-flight value is its lease's end (µs).
      local fence = now_us + lease * 1000
      if redis.call('HSET', bk, field, inf_make(fence)) == 1 then
        redis.call('PEXPIREAT', bk, expire_at)
      end
      res = -fence
    end
  elseif is_done(v) then
    res = (v == tag or is_spent(v)) and 2 or 3
  elseif is_inflight(v) then
    local until_ = inf_lease(v)
    if until_ > now then
      res = {3, until_ - now}
    else
      -- An expired lease: the state moves to the record, the field becomes a pointer.
      local fence = math.max(inf_fence(v) + 1, now_us)
      local f = rec_new('P', owner, fence, tag, 2, now + ttl, lease_until, now, key)
      redis.call('SET', record_key(i), rec_join(f), 'PXAT', now + ttl)
      redis.call('HSET', bucket_key(i, b), field, 'R')
      redis.call('PEXPIRE', plugins_key(i), ttl)
      res = {1, fence, 2, plugins_of(plugins_key(i))}
    end
  elseif not is_pointer(v) then
    -- Neither a marker, a spent or in-flight value nor a pointer: not written by this layout
    -- (every integer a native complete leaves is one of those). Never acknowledged: BUSY,
    -- flagged so that the caller says so (wxg_guard_claim_t.unreadable), until the admin
    -- tool's purge deletes it (lib/guard/lua/purge.lua).
    res = {4, 1000}
  else
    local rk = record_key(i)
    local old = redis.call('GET', rk)
    local f = old and rec_split(old) or nil
    if old and not f then
      return rec_bad(rk)
    end
    local until_ = f and tonumber(f[F_LEASE]) or 0
    if f and f[F_ST] == 'P' and until_ > now then
      res = {3, until_ - now}
    else
      -- FAILED, released, an expired lease, or a record that expired before its pointer: the
      -- fence and attempt continue from the record, the last failure and the key stay. Without
      -- the record (a FAILED retention shorter than the lease lets it expire first), the fence is
      -- the end of the new lease, as a new message's: every earlier fence of the message is at
      -- most the end of an earlier lease, so it is still the highest.
      local fence = now_us + lease * 1000
      local attempt = 1
      if f then
        fence = math.max((tonumber(f[F_FENCE]) or 0) + 1, now_us)
        attempt = (tonumber(f[F_ATTEMPT]) or 0) + 1
      else
        f = rec_new('P', owner, fence, tag, attempt, now + ttl, lease_until, now, key)
      end
      f[F_ST], f[F_OWNER], f[F_FENCE], f[F_TAG] = 'P', owner, fmt(fence), tag
      f[F_ATTEMPT], f[F_EXP], f[F_LEASE], f[F_CLAIMED] = fmt(attempt), fmt(now + ttl),
                                                         fmt(lease_until), fmt(now)
      redis.call('SET', rk, rec_join(f), 'PXAT', now + ttl)
      redis.call('PEXPIRE', plugins_key(i), ttl)
      res = {1, fence, attempt, plugins_of(plugins_key(i))}
    end
  end
  -- A native in-flight value that did not win is taken back.
  if mine_at and (type(res) ~= 'number' or res >= 0) then
    redis.call('HDEL', bucket_key(i, mine_at), field)
  end
  out[i] = res
end
return out
