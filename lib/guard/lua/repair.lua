-- repair: the second step of a native complete whose HINCRBY found the field holding something
-- other than its claim's value (lib/guard/guard_native.c, complete_native).
--
-- KEYS      KPM per message (see _record.lua): its NB buckets, its record, its sub-markers
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- then 5 per message: the marker field, the time bucket the HINCRBY went to, what it left there
--   ('' when it changed nothing: the increment would have overflowed), what the field held
--   before it (computed by the client: Lua's numbers cannot hold an in-flight value exactly),
--   and the payload tag
-- Returns per message 0 (DONE written), 1 (already DONE) or -1 (lease lost: not the caller's).
--
-- Why a script: the repair must change the field only if it still holds what the increment
-- left. A native second round trip would undo blindly: a repair that never arrived leaves the
-- sum of two claims' values, which nothing recognised (every claim BUSY until the bucket
-- expired), and one arriving after another complete had rewritten the field would turn a DONE
-- marker back into an expired in-flight value, which the next claim would take over
-- (docs/guard.md §4.1). Here, atomically:
--   the field still holds what the increment left: the value before it decides --
--     an in-flight value (another claim's: a stale complete after a purge or lost data) is put
--       back, lease lost;
--     a marker is put back, already DONE (a retried complete whose first attempt ran);
--     a spent value is replaced by the marker, already DONE;
--     nothing (or a marker 0, which reads the same) becomes the marker, DONE written;
--   anything else: someone changed the field since; it is left as it is and read -- DONE
--     (a spent value included: another complete ran on top) answers already DONE, anything
--     else lease lost.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local out = {}
for i = 1, #KEYS / KPM do
  local a = 4 + (i - 1) * 5
  local field, tb, left, before, tag = ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3],
                                       ARGV[a + 4], ARGV[a + 5]
  local res = -1
  if tb <= TB_HI and tb > TB_HI - NB then
    local bk = bucket_key(i, tb)
    local v = redis.call('HGET', bk, field)
    if left == '' then
      before = v
    end
    if left ~= '' and v ~= left then
      res = (v and is_done(v)) and 1 or -1
    elseif before == nil or before == '0' then
      if redis.call('HSET', bk, field, tag) == 1 then
        redis.call('PEXPIREAT', bk, (tb + 1) * WIDTH + RETENTION, 'NX')
      end
      res = 0
    elseif is_spent(before) then
      redis.call('HSET', bk, field, tag)
      res = 1
    else
      if v ~= before then
        redis.call('HSET', bk, field, before)
      end
      res = is_done(before) and 1 or -1
    end
  end
  out[i] = res
end
return out
