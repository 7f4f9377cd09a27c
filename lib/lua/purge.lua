-- purge: an operator deletes the in-flight record of one message.
--
-- KEYS[1]   the in-flight record
-- Returns 1 when the record was deleted, 0 when there was none, -1 when it is a live claim
-- (PROCESSING with its lease not yet expired), which is never deleted.
local rec = redis.call('HMGET', KEYS[1], 'st', 'lease')
if not rec[1] then
  return 0
end
if rec[1] == 'P' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if rec[2] and tonumber(rec[2]) > now then
    return -1
  end
end
redis.call('DEL', KEYS[1])
return 1
