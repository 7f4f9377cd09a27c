-- claim: take messages that are absent, FAILED, or PROCESSING with an expired lease.
--
-- KEYS[1]   the in-flight record of the first message (declared for Redis Cluster: every key
--           of one call is in that record's slot)
-- ARGV[1..4] lease ms, in-flight TTL ms, DONE retention ms, bucket width ms
-- then ONE value per message, packed by the client (lib/guard.c) because Redis spends about as
--   much CPU converting a script argument as running a command: four length bytes (stem,
--   record, field, tag), then the DONE bucket stem, the in-flight record name, the marker field,
--   the head of a new record 'P|owner|1|tag', and the idempotency key as 'klen|key' (kept in a
--   new record so that the admin tool can name it)
--
-- Per message it returns one of
--   1                                           CLAIMED, new record: fence 1, attempt 1, nothing
--                                               finished (the common answer, as an integer:
--                                               Redis converts a nested reply at a high cost)
--   2 / 3                                       DUPLICATE, same / other payload
--   {1, fence, attempt, {plugin, result, ...}}  CLAIMED again (FAILED or expired lease)
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
-- A new record is the client's head 'P|owner|1|tag', then this tail: attempt 1, expiry, lease,
-- claimed, no failure, no reason, never rearmed; then the client's 'klen|key' and no plugins.
local tail = '|1|' .. exp_s .. '|' .. lease_s .. '|' .. now_s .. '|0|0|0|0|'
local out = {}
for i = 1, #ARGV - 4 do
  local b = ARGV[4 + i]
  local sl, rl, fl, tl = string.byte(b, 1, 4)
  local stem = string.sub(b, 5, 4 + sl)
  local p = 5 + sl + rl
  local field = string.sub(b, p, p + fl - 1)
  -- the head 'P|owner|1|tag' spans [q, e]; the key part follows it
  local q = p + fl
  local e = q + 36 + tl
  local tag = string.sub(b, q + 37, e)
  local res = nil
  for j = 1, nb do
    local v = redis.call('HGET', stem .. sfx[j], field)
    if v then
      res = (v == tag) and 2 or 3
      break
    end
  end
  if not res then
    local rk = string.sub(b, 5 + sl, 4 + sl + rl)
    local old = redis.call('SET', rk, string.sub(b, q, e) .. tail .. string.sub(b, e + 1), 'NX',
                           'GET', 'PXAT', exp_s)
    if not old then
      res = 1
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
        f[1], f[2], f[3], f[4], f[5] = 'P', string.sub(b, q + 2, q + 33), fence, tag, attempt
        f[6], f[7], f[8] = exp_s, lease_s, now_s
        redis.call('SET', rk, rec_join(f), 'PXAT', exp_s)
        res = {1, fence, attempt, plugins_list(f.plugins)}
      end
    end
  end
  out[i] = res
end
return out
