-- claim: take messages that are absent, FAILED, or PROCESSING with an expired lease.
--
-- KEYS[1]   the in-flight record of the first message (declared for Redis Cluster: every key
--           of one call is in that record's slot)
-- ARGV[1..4] lease ms, in-flight TTL ms, DONE retention ms, bucket width ms
-- then ONE value per message, packed by the client (lib/guard_lua.c) because Redis spends about
--   as much CPU converting a script argument as running a command: the length bytes L_STEM ..
--   L_TAG (lib/guard_record.def), then the DONE bucket stem, the in-flight record name, the
--   marker field, the head of a new record 'P|owner|1|tag' (its fields F_ST .. F_TAG), and the
--   idempotency key as 'klen|key' (F_KLEN and the key, kept in a new record so that the admin
--   tool can name it)
--
-- Per message it returns one of
--   -fence                                      CLAIMED, new record: the fence (negative),
--                                               attempt 1, nothing finished (the common answer,
--                                               as an integer: Redis converts a nested reply at
--                                               a high cost)
--   2 / 3                                       DUPLICATE, same / other payload
--   {1, fence, attempt, {plugin, result, ...}}  CLAIMED again (FAILED or expired lease)
--   {3, ms_left}                                BUSY
--
-- The DONE buckets are probed FIRST, newest first: a message DONE anywhere in the retention is a
-- duplicate whatever else exists. Then one SET NX GET both creates a brand-new record (attempt 1)
-- and, when a record exists, returns it for the rare path: BUSY while its lease is live, else a
-- re-claim.
--
-- Fencing tokens come from this server's clock in microseconds: a new record's fence is the
-- server time, a re-claim's the larger of the old fence + 1 and the server time. So a fence is
-- greater than every fence handed out for the message before, also when Redis forgot the
-- message in between (a restart without persistence, a failover that lost writes, a purge, a
-- retention that ran out): a store that kept an older fence never refuses the new writer
-- (docs/guard.md §3.4). The client's head carries a placeholder fence that is replaced here.
-- The lease is compared with this server's clock, never with the key's TTL, so the record and its
-- fencing counter outlive an expired lease.
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local now_us = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
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
local fence_mid = string.format('%d', now_us) .. '|'
local new_answer = -now_us
-- A new record is the client's head 'P|owner|1|tag' (F_ST .. F_TAG), then this tail, the fields
-- between F_TAG and F_KLEN: attempt 1, expiry, lease, claimed, no failure, no reason, never
-- rearmed; then the client's 'klen|key' and no plugins.
local t = {}
t[F_ATTEMPT], t[F_EXP], t[F_LEASE], t[F_CLAIMED] = '1', exp_s, lease_s, now_s
t[F_FAILS], t[F_FAILED], t[F_RLEN], t[F_REARMED] = '0', '0', '0', '0'
local tail = '|' .. table.concat(t, '|', F_TAG + 1, F_KLEN - 1) .. '|'
-- The head's length without the tag: 'P|', the owner, '|1|' (the placeholder fence); the part
-- kept of it is 'P|owner|'.
local head = #'P|' + OWNER_LEN + #'|1|'
local keep = #'P|' + OWNER_LEN + #'|'
local out = {}
for i = 1, #ARGV - 4 do
  local b = ARGV[4 + i]
  -- one string.byte reads the length bytes, in their order in lib/guard_record.def
  local sl, rl, fl, tl = string.byte(b, L_STEM, L_TAG)
  local s0 = L_TAG + 1
  local stem = string.sub(b, s0, s0 + sl - 1)
  local p = s0 + sl + rl
  local field = string.sub(b, p, p + fl - 1)
  -- the head 'P|owner|1|tag' spans [q, e]; the key part follows it
  local q = p + fl
  local e = q + head + tl - 1
  local tag = string.sub(b, q + head, e)
  local res = nil
  for j = 1, nb do
    local v = redis.call('HGET', stem .. sfx[j], field)
    if v then
      res = (v == tag) and 2 or 3
      break
    end
  end
  if not res then
    local rk = string.sub(b, s0 + sl, s0 + sl + rl - 1)
    local old = redis.call('SET', rk, string.sub(b, q, q + keep - 1) .. fence_mid .. tag .. tail ..
                           string.sub(b, e + 1), 'NX', 'GET', 'PXAT', exp_s)
    if not old then
      res = new_answer
    else
      local f = rec_split(old)
      if not f then
        return rec_bad(rk)
      end
      local lease_until = tonumber(f[F_LEASE]) or 0
      if f[F_ST] == 'P' and lease_until > now then
        res = {3, lease_until - now}
      else
        -- FAILED, released, or an expired lease: the fence and attempt continue from the record,
        -- the finished plugins, the last failure and the key stay.
        local fence = math.max((tonumber(f[F_FENCE]) or 0) + 1, now_us)
        local attempt = (tonumber(f[F_ATTEMPT]) or 0) + 1
        f[F_ST], f[F_OWNER] = 'P', string.sub(b, q + #'P|', q + #'P|' + OWNER_LEN - 1)
        -- Fences pass 2^47: they are formatted as integers here, never by Lua's default number
        -- format (14 significant digits).
        f[F_FENCE], f[F_TAG], f[F_ATTEMPT] = string.format('%d', fence), tag, attempt
        f[F_EXP], f[F_LEASE], f[F_CLAIMED] = exp_s, lease_s, now_s
        redis.call('SET', rk, rec_join(f), 'PXAT', exp_s)
        res = {1, fence, attempt, plugins_list(f.plugins)}
      end
    end
  end
  out[i] = res
end
return out
