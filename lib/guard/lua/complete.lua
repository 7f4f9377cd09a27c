-- complete: turn messages into compact DONE markers.
--
-- KEYS      KPM per message (see _record.lua): its NB buckets, its record, its sub-markers
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- then 4 per message: the marker field, the owner token, the fence, the payload tag ('' for a
--   ticket made by hand: the record's, or 0)
-- Returns per message 0 (DONE written), 1 (already DONE: a retried complete whose first
-- attempt ran) or -1 (lease lost: not the caller's any more, nothing changed).
--
-- The message's field is found in the live buckets: an in-flight value of the caller's owner
-- and fence, or a pointer to a record of the caller's, becomes the DONE marker (moved to the
-- newest bucket, write_done); the record and the sub-markers go.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local out = {}
for i = 1, #KEYS / KPM do
  local a = 4 + (i - 1) * 4
  local field, owner, fence, tag = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local b, v = find(i, field, bmax, bmin, nil)
  local res = -1
  if not v then
    res = -1
  elseif is_inflight(v) then
    if inf_mine(v, owner, fence) then
      write_done(i, field, tag ~= '' and tag or '0', b, bmax)
      redis.call('DEL', plugins_key(i))
      res = 0
    end
  elseif is_pointer(v) then
    local old = redis.call('GET', record_key(i))
    local f = old and rec_split(old) or nil
    if f and f[F_ST] == 'P' and f[F_OWNER] == owner and f[F_FENCE] == fence then
      write_done(i, field, tag ~= '' and tag or f[F_TAG], b, bmax)
      redis.call('DEL', record_key(i), plugins_key(i))
      res = 0
    end
  elseif is_done(v) then
    res = 1
  end
  out[i] = res
end
return out
