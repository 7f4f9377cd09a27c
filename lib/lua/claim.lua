-- claim: take messages that are absent, FAILED, or PROCESSING with an expired lease.
--
-- KEYS[i]   the in-flight record of message i (a string, see _record.lua)
-- ARGV[1..4] lease ms, in-flight TTL ms, DONE retention ms, bucket width ms
-- then 5 values per message: owner token, DONE bucket stem, marker field, payload tag, and the
--   idempotency key as 'klen|key' (kept in a new record so that the admin tool can name it)
--
-- Per message it returns one of
--   {1, fence, attempt, {plugin, result, ...}}  CLAIMED
--   {2, mismatch}                               DUPLICATE (mismatch = 1 when the payload differs)
--   {3, ms_left}                                BUSY
--
-- The DONE buckets are probed FIRST, newest first: a message DONE anywhere in the retention is a
-- duplicate whatever else exists, and no claim after DONE can start a record at fence 1. Then one
-- SET NX GET both creates a brand-new record (fence 1, attempt 1) and, when a record exists,
-- returns it for the rare path: BUSY while its lease is live, else a re-claim with fence + 1.
-- The lease is compared with this server's clock, never with the key's TTL, so the record and its
-- fencing counter outlive an expired lease.
local now = server_ms()
local lease = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local width = tonumber(ARGV[4])
local bmin = math.floor((now - retention) / width)
local bmax = math.floor(now / width)
-- Formatting numbers in Lua costs about as much as a redis.call, so everything numeric is
-- formatted once per call, not per message.
local sfx = {}
for b = bmax, bmin, -1 do
  sfx[#sfx + 1] = string.format('%d', b)
end
local nb = #sfx
local exp_s = string.format('%d', now + ttl)
local lease_s = string.format('%d', now + lease)
local now_s = string.format('%d', now)
-- A new record is 'P|' owner '|1|' tag, then this tail: attempt 1, expiry, lease, claimed, no
-- failure, no reason, never rearmed; then the client's 'klen|key' and no plugins.
local tail = '|1|' .. exp_s .. '|' .. lease_s .. '|' .. now_s .. '|0|0|0|0|'
-- Shared reply tables: Redis converts each occurrence on its own.
local NEW = {1, 1, 1, {}}
local DUP_SAME = {2, 0}
local DUP_OTHER = {2, 1}
local out = {}
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 5
  local stem, field, tag = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local res = nil
  for j = 1, nb do
    local v = redis.call('HGET', stem .. sfx[j], field)
    if v then
      res = (v == tag) and DUP_SAME or DUP_OTHER
      break
    end
  end
  if not res then
    local rk = KEYS[i]
    local owner = ARGV[a + 1]
    local old = redis.call('SET', rk, 'P|' .. owner .. '|1|' .. tag .. tail .. ARGV[a + 5], 'NX',
                           'GET', 'PXAT', exp_s)
    if not old then
      res = NEW
    else
      local f = rec_split(old)
      if not f then
        return rec_bad(rk)
      end
      local lease_until = tonumber(f[7]) or 0
      if f[1] == 'P' and lease_until > now then
        res = {3, lease_until - now}
      else
        -- FAILED, released, or an expired lease: the fence and attempt continue from the record,
        -- the finished plugins, the last failure and the key stay.
        local fence = (tonumber(f[3]) or 0) + 1
        local attempt = (tonumber(f[5]) or 0) + 1
        f[1], f[2], f[3], f[4], f[5] = 'P', owner, fence, tag, attempt
        f[6], f[7], f[8] = exp_s, lease_s, now_s
        redis.call('SET', rk, rec_join(f), 'PXAT', exp_s)
        res = {1, fence, attempt, plugins_list(f.plugins)}
      end
    end
  end
  out[i] = res
end
return out
