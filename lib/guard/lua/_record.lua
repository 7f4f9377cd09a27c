-- Shared by every script: lib/guard/lua/embed.cmake puts this file in front of each of them, after
-- the layout's constants generated from lib/guard/guard_record.def (F_* record field positions, N_*
-- admin names, OWNER_LEN, FENCE_DIGITS, LEASE_DIGITS, INFLIGHT_LEN).
--
-- Layout v4 (lib/guard/guard_record.def, docs/guard.md §2): a message's state is its field in the
-- DONE bucket of its claim (a DONE tag, an in-flight value 'I<owner><fence><lease>', or 'R'
-- for "see the record"), its record string (written by scripts only) and its sub-marker hash.
--
-- Every script that works on messages declares all their keys (Redis Cluster routes, and
-- migrates, by declared keys): per message KPM = NB + 2 keys, the NB DONE buckets of the time
-- buckets TB_HI, TB_HI - 1, ... (newest first), then the record, then the sub-marker hash. The
-- client picks TB_HI and NB from its estimate of this server's clock, with a margin; a script
-- checks that the buckets live at this server's time are among them and refuses the call with
-- a WXGSKEW error otherwise (the client then samples the clock again).
--
-- ARGV of such a script starts with NB, TB_HI, the bucket width and the retention (ms).

local function rec_split(v)
  local f = {}
  local pos = 1
  for i = 1, F_COUNT do
    local e = string.find(v, '|', pos, true)
    if not e then
      return nil
    end
    f[i] = string.sub(v, pos, e - 1)
    pos = e + 1
  end
  local rlen = tonumber(f[F_RLEN]) or 0
  local klen = tonumber(f[F_KLEN]) or 0
  f.reason = string.sub(v, pos, pos + rlen - 1)
  f.key = string.sub(v, pos + rlen, pos + rlen + klen - 1)
  return f
end

-- The reason may have changed since the split, so its length is written anew.
local function rec_join(f)
  f[F_RLEN] = #f.reason
  f[F_KLEN] = #f.key
  return table.concat(f, '|', 1, F_COUNT) .. '|' .. f.reason .. f.key
end

-- A record that cannot be split was not written by this layout: refuse rather than guess a fence.
local function rec_bad(key)
  return redis.error_reply('ERR wxguard: unreadable in-flight record ' .. key)
end

local function fmt(n)
  return string.format('%d', n)
end

-- A new record's fields (all strings).
local function rec_new(st, owner, fence, tag, attempt, exp, lease, claimed, key)
  local f = {}
  f[F_ST], f[F_OWNER], f[F_FENCE], f[F_TAG] = st, owner, fmt(fence), tag
  f[F_ATTEMPT], f[F_EXP], f[F_LEASE], f[F_CLAIMED] = fmt(attempt), fmt(exp), fmt(lease), fmt(claimed)
  f[F_FAILS], f[F_FAILED], f[F_RLEN], f[F_REARMED], f[F_KLEN] = '0', '0', '0', '0', '0'
  f.reason, f.key = '', key
  return f
end

-- In-flight values: the fence and OWNER_DIGITS digits of the owner token, written as one
-- integer (lib/guard/guard_record.def). The fence of an in-flight value is the end of its lease, in
-- server µs: a reader needs nobody's configuration to tell a live lease from an expired one.
local function owner_digits(owner)
  return string.format('%0' .. OWNER_DIGITS .. 'd', tonumber(string.sub(owner, 1, 3), 16) % 1000)
end

-- The owner token of an in-flight value: derived from its fence (the first OWNER_LEN hex digits
-- of the SHA-1 of the fence in decimal), so that the value names its owner in full to any
-- reader (inspect) although it holds only OWNER_DIGITS digits of it. lib/guard/guard_native.c
-- derives it the same way.
local function inf_owner_of(fence_s)
  return string.sub(redis.sha1hex(fence_s), 1, OWNER_LEN)
end

local function inf_make(fence)
  local s = fmt(fence)
  return s .. owner_digits(inf_owner_of(s))
end

local function is_inflight(v)
  return #v >= FENCE_MIN_DIGITS + OWNER_DIGITS and string.find(v, '^%d+$') ~= nil
end

local function is_pointer(v)
  return v == 'R'
end

-- A spent value: an integer that is neither a marker nor an in-flight value, which only a
-- native complete's increments leave (lib/guard/guard_record.def): negative below every
-- marker on an empty field, a marker or a spent value; positive and shorter than an in-flight
-- value on another claim's in-flight value (a stale owner's complete after a purge or lost
-- data, whose repair never ran). A complete runs after every plugin ran, so the message was
-- completed; its tag is unknown.
local function is_spent(v)
  if #v <= 6 then
    return false
  end
  if #v < FENCE_MIN_DIGITS + OWNER_DIGITS then
    return string.find(v, '^%-?%d+$') ~= nil
  end
  return string.find(v, '^%-%d+$') ~= nil
end

-- A DONE marker is a payload tag: an integer of at most six characters ('-32768'); a spent
-- value counts as DONE too.
local function is_done(v)
  return (#v <= 6 and string.find(v, '^%-?%d+$') ~= nil) or is_spent(v)
end

local function inf_fence(v)
  return tonumber(string.sub(v, 1, #v - OWNER_DIGITS))
end

local function inf_owner(v)
  return inf_owner_of(string.sub(v, 1, #v - OWNER_DIGITS))
end

local function inf_mine(v, owner, fence)
  return string.sub(v, #v - OWNER_DIGITS + 1) == owner_digits(owner) and
           string.sub(v, 1, #v - OWNER_DIGITS) == fence
end

local function inf_lease(v)
  return math.floor(inf_fence(v) / 1000)
end

-- The finished plugins of a message as a flat list {name, result, ...}.
local function plugins_of(pk)
  return redis.call('HGETALL', pk)
end

local function server_time()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- (Scripts that work on no message -- layout, peek -- take other arguments: these are then 0.)
local NB = tonumber(ARGV[1]) or 0
local TB_HI = tonumber(ARGV[2]) or 0
local WIDTH = tonumber(ARGV[3]) or 1
local RETENTION = tonumber(ARGV[4]) or 0
local KPM = NB + 2

-- The live time buckets at server time `now` (newest, oldest), or nil when they are not all
-- among the declared ones.
local function live(now)
  local bmax = math.floor(now / WIDTH)
  local bmin = math.floor((now - RETENTION) / WIDTH)
  if bmax > TB_HI or bmin < TB_HI - NB + 1 then
    return nil
  end
  return bmax, bmin
end

local function skew()
  return redis.error_reply('WXGSKEW the client\'s clock estimate does not cover this server\'s time')
end

-- Message i's keys: its bucket of time bucket b, its record, its sub-markers.
local function bucket_key(i, b)
  return KEYS[(i - 1) * KPM + 1 + (TB_HI - b)]
end

local function record_key(i)
  return KEYS[(i - 1) * KPM + NB + 1]
end

local function plugins_key(i)
  return KEYS[(i - 1) * KPM + NB + 2]
end

-- The newest live bucket holding message i's field: b, value (nil, nil when none). `skip`
-- (may be nil) is a value to pass over, with the bucket it was seen in returned third: a claim's
-- own in-flight value written natively a moment before.
local function find(i, field, bmax, bmin, skip)
  local seen = nil
  for b = bmax, bmin, -1 do
    local v = redis.call('HGET', bucket_key(i, b), field)
    if v then
      if skip and v == skip then
        seen = b
      else
        return b, v, seen
      end
    end
  end
  return nil, nil, seen
end

-- The record as a flat name/value list for the admin tool (inspect, peek): finished plugins as
-- 'p:<name>' fields; the owner and lease only while PROCESSING, the failure only once failed.
local function rec_fields(f, plugins)
  local fields = {N_ST, f[F_ST], N_FENCE, f[F_FENCE], N_ATTEMPT, f[F_ATTEMPT], N_TAG, f[F_TAG],
                  N_CLAIMED, f[F_CLAIMED]}
  if f.key ~= '' then
    fields[#fields + 1] = N_KEY
    fields[#fields + 1] = f.key
  end
  if f[F_ST] == 'P' then
    fields[#fields + 1] = N_OWNER
    fields[#fields + 1] = f[F_OWNER]
    fields[#fields + 1] = N_LEASE
    fields[#fields + 1] = f[F_LEASE]
  end
  if f[F_FAILED] ~= '0' then
    fields[#fields + 1] = N_FAILS
    fields[#fields + 1] = f[F_FAILS]
    fields[#fields + 1] = N_FAILED
    fields[#fields + 1] = f[F_FAILED]
    fields[#fields + 1] = N_REASON
    fields[#fields + 1] = f.reason
  end
  if f[F_REARMED] ~= '0' then
    fields[#fields + 1] = N_REARMED
    fields[#fields + 1] = f[F_REARMED]
  end
  for j = 1, #plugins, 2 do
    fields[#fields + 1] = N_PLUGINS .. plugins[j]
    fields[#fields + 1] = plugins[j + 1]
  end
  return fields
end

-- Writes a DONE marker `tag` for message i found in bucket b at server time now: in b when b
-- is the newest live bucket, else moved to the newest (so that a marker lives between the
-- retention and the retention plus one width after it was written, as docs/guard.md §3.3
-- says). The sentinel field '_' tells a bucket this write created: only then is its expiry set.
local function write_done(i, field, tag, b, bmax)
  if b and b ~= bmax then
    redis.call('HDEL', bucket_key(i, b), field)
  end
  local bk = bucket_key(i, bmax)
  if redis.call('HSET', bk, field, tag, '_', '') == 2 then
    redis.call('PEXPIREAT', bk, (bmax + 1) * WIDTH + RETENTION)
  end
end
