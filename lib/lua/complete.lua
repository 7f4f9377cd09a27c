-- complete: move messages from their in-flight record to a compact DONE marker.
--
-- KEYS[1]   the in-flight record of the first message (declared for Redis Cluster)
-- ARGV[1..2] DONE retention ms, bucket width ms
-- then ONE value per message, packed by the client (see claim.lua for why): the length bytes
--   L_STEM .. L_FIELD (lib/guard_record.def), then the DONE bucket stem, the in-flight record
--   name, the marker field and the ownership prefix 'P|owner|fence|' (F_ST .. F_FENCE)
-- Returns per message 0 (DONE written), 1 (no record, but the message is already DONE) or
-- -1 (lease lost: nothing changed).
--
-- GETDEL takes the record out in one call; when it is not the caller's (rare: the lease was
-- lost) it is put back unchanged, with the absolute expiry it carries, before anything else runs.
-- The marker goes into the newest bucket together with a one-byte sentinel field '_': HSET
-- answers 2 only when both were new, i.e. when this call created the bucket, and only then is
-- the bucket's expiry set. A bucket covers one width and expires as a whole `retention` after
-- the end of its width, so a marker lives between retention and retention + width.
local now = server_ms()
local retention = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
local bmin = math.floor((now - retention) / width)
local bmax = math.floor(now / width)
local sfx = {}
for b = bmax, bmin, -1 do
  sfx[#sfx + 1] = string.format('%d', b)
end
local newest = sfx[1]
local expire_at = string.format('%d', (bmax + 1) * width + retention)
local out = {}
for i = 1, #ARGV - 2 do
  local b = ARGV[2 + i]
  -- one string.byte reads the length bytes, in their order in lib/guard_record.def
  local sl, rl, fl = string.byte(b, L_STEM, L_FIELD)
  local s0 = L_FIELD + 1
  local rk = string.sub(b, s0 + sl, s0 + sl + rl - 1)
  local p = s0 + sl + rl
  local pfx = string.sub(b, p + fl)
  local v = redis.call('GETDEL', rk)
  if v and string.sub(v, 1, #pfx) == pfx then
    -- the payload tag F_TAG follows the ownership prefix
    local e = string.find(v, '|', #pfx + 1, true)
    local bk = string.sub(b, s0, s0 + sl - 1) .. newest
    if redis.call('HSET', bk, string.sub(b, p, p + fl - 1), string.sub(v, #pfx + 1, e - 1), '_',
                  '') == 2 then
      redis.call('PEXPIREAT', bk, expire_at)
    end
    out[i] = 0
  elseif v then
    -- Not the caller's record: put it back as it was. (A record this layout cannot read keeps
    -- a TTL too: the retention.)
    local f = rec_split(v)
    if f and tonumber(f[F_EXP]) then
      redis.call('SET', rk, v, 'PXAT', f[F_EXP])
    else
      redis.call('SET', rk, v, 'PX', retention)
    end
    out[i] = -1
  else
    -- No record: a retried complete whose first attempt ran finds its marker; anything else
    -- (expired record, never claimed) is lease lost.
    out[i] = -1
    local stem, field = string.sub(b, s0, s0 + sl - 1), string.sub(b, p, p + fl - 1)
    for j = 1, #sfx do
      if redis.call('HEXISTS', stem .. sfx[j], field) == 1 then
        out[i] = 1
        break
      end
    end
  end
end
return out
