-- layout: stamp (or check) the compact-marker geometry shared by every guard on this prefix.
--
-- KEYS[1]   the layout key
-- ARGV[1]   the geometry string; ARGV[2] TTL ms (retention plus two bucket widths)
-- Returns the stored geometry: equal to ARGV[1] when this handle may proceed. A handle with a
-- different geometry would look for markers in buckets that were never written, so it must stop.
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return ARGV[1]
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return cur
