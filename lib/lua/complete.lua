-- complete: move messages from their in-flight record to a compact DONE marker.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV[1..2] DONE retention ms, bucket width ms
-- then 4 per message: owner token, fence, DONE bucket stem, marker field
-- Returns per message 0 (DONE written), 1 (no record, but the message is already DONE) or
-- -1 (lease lost: nothing changed).
--
-- A bucket covers one time-bucket width and expires as a whole `retention` after the end of its
-- width, so a marker lives between retention and retention + width.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
local bmin = math.floor((now - retention) / width)
local bmax = math.floor(now / width)
-- Suffixes formatted once per call (see claim.lua).
local sfx = {}
for b = bmax, bmin, -1 do
  sfx[#sfx + 1] = string.format('%d', b)
end
local expire_at = string.format('%d', (bmax + 1) * width + retention)
local out = {}
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local stem, field = ARGV[a + 3], ARGV[a + 4]
  local rec = redis.call('HMGET', KEYS[i], 'st', 'owner', 'fence', 'ph')
  if rec[1] == 'P' and rec[2] == ARGV[a + 1] and rec[3] == ARGV[a + 2] then
    local bk = stem .. sfx[1]
    redis.call('HSET', bk, field, rec[4] or '0')
    redis.call('PEXPIREAT', bk, expire_at)
    redis.call('DEL', KEYS[i])
    out[i] = 0
  else
    out[i] = -1
    if not rec[1] then
      for j = 1, #sfx do
        if redis.call('HEXISTS', stem .. sfx[j], field) == 1 then
          out[i] = 1
          break
        end
      end
    end
  end
end
return out
