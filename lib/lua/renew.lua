-- renew: extend the lease of messages still owned by the caller.
--
-- KEYS[i]   the in-flight record of message i
-- ARGV[1..2] lease ms, in-flight TTL ms; then 1 per message: ownership prefix 'P|owner|fence|'
-- Returns per message 0 (renewed) or -1 (lease lost: nothing changed).
--
-- A lease that expired without anyone else claiming the message can still be renewed: the owner
-- token and fence still match, so nobody else has run it.
local now = server_ms()
local exp_s = string.format('%d', now + tonumber(ARGV[2]))
local lease_s = string.format('%d', now + tonumber(ARGV[1]))
local out = {}
for i = 1, #KEYS do
  local pfx = ARGV[2 + i]
  local v = redis.call('GET', KEYS[i])
  local f = (v and string.sub(v, 1, #pfx) == pfx) and rec_split(v) or nil
  if f then
    f[F_EXP], f[F_LEASE] = exp_s, lease_s
    redis.call('SET', KEYS[i], rec_join(f), 'PXAT', exp_s)
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
