-- wrk script for bench/ingest_hostile.sh: POSTs generic callbacks to wxguard-ingest, unsigned
-- (the receiver runs without ingest.hmac.secret). Every request carries a new message id and one
-- of 64 conversations, so the records are distinct messages spread over 64 Kafka keys.
local counter = 0
local thread_id = 0
local next_thread = 0

function setup(thread)
  thread:set("thread_id", next_thread)
  next_thread = next_thread + 1
end

function init(args)
  counter = 0
end

local template = '{"account":"wxid_benchbot00002","msg_id":"%s","conversation":"wxid_peer%04d",' ..
  '"sender":"wxid_peer%04d","create_time":1705043418,"type":"text",' ..
  '"content":"bench message %d"}'

function request()
  counter = counter + 1
  -- 74 + thread (5 digits) + counter (12 digits): 19 digits, unique per thread and request.
  local id = string.format("74%05d%012d", thread_id, counter)
  local body = string.format(template, id, counter % 64, counter % 64, counter)
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
