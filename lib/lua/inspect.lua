-- inspect: everything known about one message, for the admin tool. Read-only.
--
-- KEYS[1]   the in-flight record
-- ARGV      DONE retention ms, bucket width ms, DONE bucket stem, marker field
-- Returns {server ms, record fields (flat), record PTTL, bucket key or '', marker value or '',
--          bucket PTTL}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[1])
local width = tonumber(ARGV[2])
local bmin = math.floor((now - retention) / width)
local bmax = math.floor(now / width)
local fields = redis.call('HGETALL', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
local bk, v, bttl = '', '', -2
for b = bmax, bmin, -1 do
  local k = ARGV[3] .. string.format('%d', b)
  local x = redis.call('HGET', k, ARGV[4])
  if x then
    bk, v, bttl = k, x, redis.call('PTTL', k)
    break
  end
end
return {now, fields, pttl, bk, v, bttl}
