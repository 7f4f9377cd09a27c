-- Shared by every script: lib/lua/embed.cmake puts this file in front of each of them.
--
-- The in-flight record of a message (PROCESSING or FAILED) is ONE string, so that a claim, a
-- complete or a renewal is one plain SET / GETDEL instead of several hash commands:
--
--   st|owner|fence|tag|attempt|exp|lease|claimed|fails|failed|rlen|rearmed|klen|<reason><key><plugins>
--
-- st       'P' (PROCESSING) or 'F' (FAILED)
-- owner    the claim's owner token (32 hex digits), '' when FAILED
-- fence    fencing token; tag: payload tag; attempt: claims so far
-- exp      the key's absolute expiry (server ms): every write sets the key with PXAT exp, so a
--          value taken out with GETDEL can be put back with exactly the TTL it had
-- lease    lease end (server ms), 0 when FAILED; claimed: time of the last claim
-- fails    the caller's attempt count at the last fail; failed: time of the last fail/release
-- rlen     length of the failure reason that follows (any bytes)
-- rearmed  time of the last rearm (admin redrive), 0 when never
-- klen     length of the idempotency key that follows the reason (any bytes): the admin tool
--          names and selects records by it. Only the claim that creates a record writes it (the
--          client sends 'klen|key' ready-made, so the hot path formats nothing); every later
--          write carries it over unchanged.
-- plugins  finished plugins, each as name|len|<len bytes of result>
--
-- Owner and fence come first, so a transition checks ownership by comparing one prefix
-- 'P|owner|fence|' that the client sends ready-made. Numbers here stay below 2^53 (ms clocks,
-- counters), so Lua's number formatting writes them exactly.
local function rec_split(v)
  local f = {}
  local pos = 1
  for i = 1, 13 do
    local e = string.find(v, '|', pos, true)
    if not e then
      return nil
    end
    f[i] = string.sub(v, pos, e - 1)
    pos = e + 1
  end
  local rlen = tonumber(f[11]) or 0
  local klen = tonumber(f[13]) or 0
  f.reason = string.sub(v, pos, pos + rlen - 1)
  f.key = string.sub(v, pos + rlen, pos + rlen + klen - 1)
  f.plugins = string.sub(v, pos + rlen + klen)
  return f
end

-- The key is never changed after the split, so its length field f[13] is written back as read.
local function rec_join(f)
  return f[1] .. '|' .. f[2] .. '|' .. f[3] .. '|' .. f[4] .. '|' .. f[5] .. '|' .. f[6] .. '|' ..
           f[7] .. '|' .. f[8] .. '|' .. f[9] .. '|' .. f[10] .. '|' .. #f.reason .. '|' ..
           f[12] .. '|' .. f[13] .. '|' .. f.reason .. f.key .. f.plugins
end

-- A record that cannot be split was not written by this layout: refuse rather than guess a fence.
local function rec_bad(key)
  return redis.error_reply('ERR wxguard: unreadable in-flight record ' .. key)
end

-- The plugins part as a flat list {name, result, ...}.
local function plugins_list(s)
  local out = {}
  local pos = 1
  while pos <= #s do
    local e1 = string.find(s, '|', pos, true)
    if not e1 then
      break
    end
    local e2 = string.find(s, '|', e1 + 1, true)
    if not e2 then
      break
    end
    local n = tonumber(string.sub(s, e1 + 1, e2 - 1)) or 0
    out[#out + 1] = string.sub(s, pos, e1 - 1)
    out[#out + 1] = string.sub(s, e2 + 1, e2 + n)
    pos = e2 + n + 1
  end
  return out
end

-- The plugins part with `name` set to `result` (replaced in place when already present).
local function plugins_put(s, name, result)
  local l = plugins_list(s)
  local parts = {}
  local found = false
  for j = 1, #l, 2 do
    local r = l[j + 1]
    if l[j] == name then
      r = result
      found = true
    end
    parts[#parts + 1] = l[j] .. '|' .. #r .. '|' .. r
  end
  if not found then
    parts[#parts + 1] = name .. '|' .. #result .. '|' .. result
  end
  return table.concat(parts)
end

-- The record as a flat name/value list for the admin tool (inspect, peek): finished plugins as
-- 'p:<name>' fields; the owner and lease only while PROCESSING, the failure only once failed.
local function rec_fields(f)
  local fields = {'st', f[1], 'fence', f[3], 'attempt', f[5], 'ph', f[4], 'claimed', f[8]}
  if f.key ~= '' then
    fields[#fields + 1] = 'k'
    fields[#fields + 1] = f.key
  end
  if f[1] == 'P' then
    fields[#fields + 1] = 'owner'
    fields[#fields + 1] = f[2]
    fields[#fields + 1] = 'lease'
    fields[#fields + 1] = f[7]
  end
  if f[10] ~= '0' then
    fields[#fields + 1] = 'fails'
    fields[#fields + 1] = f[9]
    fields[#fields + 1] = 'failed'
    fields[#fields + 1] = f[10]
    fields[#fields + 1] = 'reason'
    fields[#fields + 1] = f.reason
  end
  if f[12] ~= '0' then
    fields[#fields + 1] = 'rearmed'
    fields[#fields + 1] = f[12]
  end
  local p = plugins_list(f.plugins)
  for j = 1, #p, 2 do
    fields[#fields + 1] = 'p:' .. p[j]
    fields[#fields + 1] = p[j + 1]
  end
  return fields
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

