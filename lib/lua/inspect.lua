-- inspect: everything known about one message, for the admin tool. Read-only.
--
-- KEYS[1]   the in-flight record
-- ARGV      DONE retention ms, bucket width ms, DONE bucket stem, marker field
-- Returns {server ms, record fields as a flat name/value list, record PTTL, bucket key or '',
--          marker value or '', bucket PTTL}. Finished plugins appear as 'p:<name>' fields.
local now = server_ms()
local retention = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
local bmin = math.floor((now - retention) / width)
local bmax = math.floor(now / width)
local fields = {}
local v = redis.call('GET', KEYS[1])
if v then
  local f = rec_split(v)
  if not f then
    return rec_bad(KEYS[1])
  end
  fields = rec_fields(f)
end
local pttl = redis.call('PTTL', KEYS[1])
local bk, mv, bttl = '', '', -2
for b = bmax, bmin, -1 do
  local k = ARGV[3] .. string.format('%d', b)
  local x = redis.call('HGET', k, ARGV[4])
  if x then
    bk, mv, bttl = k, x, redis.call('PTTL', k)
    break
  end
end
return {now, fields, pttl, bk, mv, bttl}
