-- Shared by every script: lib/lua/embed.cmake puts this file in front of each of them, after
-- the record's constants generated from lib/guard_record.def (F_* field positions, N_* admin
-- names, L_* argument length bytes, OWNER_LEN).
--
-- The in-flight record of a message (PROCESSING or FAILED) is ONE string, so that a claim, a
-- complete or a renewal is one plain SET / GETDEL instead of several hash commands. Its fields,
-- their order and their meaning are defined in lib/guard_record.def; scripts name them F_ST,
-- F_OWNER, ... and never by number. rec_split gives the fields as f[F_*] plus f.reason, f.key
-- and f.plugins; rec_join writes them back.
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
  f.plugins = string.sub(v, pos + rlen + klen)
  return f
end

-- The reason may have changed since the split, so its length is written anew; the key never
-- changes, so its length f[F_KLEN] is written back as read.
local function rec_join(f)
  f[F_RLEN] = #f.reason
  return table.concat(f, '|', 1, F_COUNT) .. '|' .. f.reason .. f.key .. f.plugins
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
  local p = plugins_list(f.plugins)
  for j = 1, #p, 2 do
    fields[#fields + 1] = N_PLUGINS .. p[j]
    fields[#fields + 1] = p[j + 1]
  end
  return fields
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

