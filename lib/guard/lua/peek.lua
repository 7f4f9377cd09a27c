-- peek: read records by their Redis names, for the admin tool's scan. Read-only.
--
-- KEYS      per record: its name (found by SCAN), then its sub-marker hash
-- Returns per record {server ms, its fields as a flat name/value list (empty when the record is
-- gone since SCAN saw it), its PTTL}, with the fields named as inspect names them.
local now = server_time()
local out = {}
for i = 1, #KEYS / 2 do
  local rk = KEYS[2 * i - 1]
  local fields = {}
  local v = redis.call('GET', rk)
  if v then
    local f = rec_split(v)
    if not f then
      return rec_bad(rk)
    end
    fields = rec_fields(f, plugins_of(KEYS[2 * i]))
  end
  out[i] = {now, fields, redis.call('PTTL', rk)}
end
return out
