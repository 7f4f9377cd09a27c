-- peek: read in-flight records by their Redis names, for the admin tool's scan. Read-only.
--
-- KEYS[i]   an in-flight record name found by SCAN
-- Returns per record {server ms, record fields as a flat name/value list (empty when the record
-- is gone since SCAN saw it), record PTTL}, with the fields named as inspect names them.
local now = server_ms()
local out = {}
for i = 1, #KEYS do
  local fields = {}
  local v = redis.call('GET', KEYS[i])
  if v then
    local f = rec_split(v)
    if not f then
      return rec_bad(KEYS[i])
    end
    fields = rec_fields(f)
  end
  out[i] = {now, fields, redis.call('PTTL', KEYS[i])}
end
return out
