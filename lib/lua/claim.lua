-- claim: take messages that are absent, FAILED, or PROCESSING with an expired lease.
--
-- KEYS[i]   the in-flight record of message i (a hash)
-- ARGV[1..4] lease ms, in-flight TTL ms, DONE retention ms, bucket width ms
-- then 5 values per message: owner token, DONE bucket stem, marker field, payload tag,
--   idempotency key (kept in the record so that the admin tool can name it)
--
-- Per message it returns one of
--   {1, fence, attempt, {plugin, result, ...}}  CLAIMED
--   {2, mismatch}                               DUPLICATE (mismatch = 1 when the payload differs)
--   {3, ms_left}                                BUSY
--
-- The lease is compared with this server's clock, never with the key's TTL, so the record and its
-- fencing counter outlive an expired lease. Every live time bucket of the message's selector is
-- checked, newest first, in this same call: a message DONE anywhere in the retention is a
-- duplicate.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local width = tonumber(ARGV[4])
local bmin = math.floor((now - retention) / width)
local bmax = math.floor(now / width)
-- Formatting numbers in Lua costs far more than a redis.call, so the bucket suffixes are built
-- once per call; the per-message fence and attempt go to redis.call as numbers, which Redis
-- writes as exact integers.
local sfx = {}
for b = bmax, bmin, -1 do
  sfx[#sfx + 1] = string.format('%d', b)
end
local lease_until = string.format('%d', now + lease)
local now_s = string.format('%d', now)
local out = {}
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 5
  local rk = KEYS[i]
  local rec = redis.call('HMGET', rk, 'st', 'lease', 'fence', 'attempt')
  local res = nil
  if rec[1] == 'P' and rec[2] and tonumber(rec[2]) > now then
    res = {3, tonumber(rec[2]) - now}
  elseif not rec[1] then
    -- No in-flight record: DONE messages live only in the compact buckets.
    local stem, field = ARGV[a + 2], ARGV[a + 3]
    for j = 1, #sfx do
      local v = redis.call('HGET', stem .. sfx[j], field)
      if v then
        res = {2, (v ~= ARGV[a + 4]) and 1 or 0}
        break
      end
    end
  end
  if not res then
    -- Equivalent to HINCRBY inside this atomic call, folded into one HSET.
    local fence = (tonumber(rec[3]) or 0) + 1
    local attempt = (tonumber(rec[4]) or 0) + 1
    redis.call('HSET', rk, 'st', 'P', 'owner', ARGV[a + 1], 'lease', lease_until,
               'claimed', now_s, 'fence', fence, 'attempt', attempt, 'ph', ARGV[a + 4],
               'k', ARGV[a + 5])
    redis.call('PEXPIRE', rk, ttl)
    local done = {}
    if rec[1] then
      -- A retry: report the plugins that already finished, with their results.
      local all = redis.call('HGETALL', rk)
      for j = 1, #all, 2 do
        if string.sub(all[j], 1, 2) == 'p:' then
          done[#done + 1] = string.sub(all[j], 3)
          done[#done + 1] = all[j + 1]
        end
      end
    end
    res = {1, fence, attempt, done}
  end
  out[i] = res
end
return out
