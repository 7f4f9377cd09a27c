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
  fields = {'st', f[1], 'fence', f[3], 'attempt', f[5], 'ph', f[4], 'claimed', f[8]}
  if f[1] == 'P' then
    table.insert(fields, 'owner')
    table.insert(fields, f[2])
    table.insert(fields, 'lease')
    table.insert(fields, f[7])
  end
  if f[10] ~= '0' then
    table.insert(fields, 'fails')
    table.insert(fields, f[9])
    table.insert(fields, 'failed')
    table.insert(fields, f[10])
    table.insert(fields, 'reason')
    table.insert(fields, f.reason)
  end
  local p = plugins_list(f.plugins)
  for j = 1, #p, 2 do
    table.insert(fields, 'p:' .. p[j])
    table.insert(fields, p[j + 1])
  end
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
