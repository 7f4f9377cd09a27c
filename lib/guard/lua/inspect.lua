-- inspect: everything known about one message, for the admin tool. Read-only.
--
-- KEYS      the message's KPM keys (see _record.lua)
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms; ARGV[5] the marker field
-- Returns {server ms, the state as a flat name/value list (a record's fields, or an in-flight
-- value's), its PTTL (the record's, or for an in-flight value its bucket's), DONE bucket key or
-- '', marker value or '', bucket PTTL}. Finished plugins appear as 'p:<name>' fields.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local field = ARGV[5]
local b, v = find(1, field, bmax, bmin, nil)
local fields, pttl = {}, -2
local bk, mv, bttl = '', '', -2
local plugins = plugins_of(plugins_key(1))
if v and is_inflight(v) then
  fields = {N_ST, 'P', N_FENCE, fmt(inf_fence(v)), N_ATTEMPT, '1', N_OWNER, inf_owner(v), N_LEASE,
            fmt(inf_lease(v))}
  for j = 1, #plugins, 2 do
    fields[#fields + 1] = N_PLUGINS .. plugins[j]
    fields[#fields + 1] = plugins[j + 1]
  end
  pttl = redis.call('PTTL', bucket_key(1, b))
elseif v and is_pointer(v) then
  local rk = record_key(1)
  local old = redis.call('GET', rk)
  if old then
    local f = rec_split(old)
    if not f then
      return rec_bad(rk)
    end
    fields = rec_fields(f, plugins)
    pttl = redis.call('PTTL', rk)
  end
elseif v and is_done(v) then
  bk, mv = bucket_key(1, b), v
  bttl = redis.call('PTTL', bk)
end
return {now, fields, pttl, bk, mv, bttl}
