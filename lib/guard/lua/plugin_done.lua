-- plugin_done: record that one plugin finished, with its small result (the script form; the
-- native design writes the same sub-marker with HSETNX, lib/guard/guard_native.c).
--
-- KEYS      KPM per message (see _record.lua)
-- ARGV[1..4] NB, TB_HI, bucket width ms, DONE retention ms
-- ARGV[5]   in-flight TTL ms; then 4 per message: the marker field, 'owner|fence', the plugin's
--   name, its result
-- Returns per message 0 (recorded) or -1 (lease lost: nothing changed).
--
-- The first result recorded for a plugin stays (HSETNX): a sub-marker is never overwritten.
local now = server_time()
local bmax, bmin = live(now)
if not bmax then
  return skew()
end
local ttl = tonumber(ARGV[5])
local out = {}
for i = 1, #KEYS / KPM do
  local a = 5 + (i - 1) * 4
  local field, who = ARGV[a + 1], ARGV[a + 2]
  local owner = string.sub(who, 1, OWNER_LEN)
  local fence = string.sub(who, OWNER_LEN + 2)
  local _, v = find(i, field, bmax, bmin, nil)
  local mine = false
  if v and is_inflight(v) then
    mine = inf_mine(v, owner, fence)
  elseif v and is_pointer(v) then
    local old = redis.call('GET', record_key(i))
    local f = old and rec_split(old) or nil
    mine = f ~= nil and f[F_ST] == 'P' and f[F_OWNER] == owner and f[F_FENCE] == fence
  end
  if mine then
    local pk = plugins_key(i)
    redis.call('HSETNX', pk, ARGV[a + 3], ARGV[a + 4])
    if redis.call('PTTL', pk) < ttl then
      redis.call('PEXPIRE', pk, ttl)
    end
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
