-- wrk script for bench/ingest.sh: POSTs wkteam-style text callbacks to wxguard-ingest.
-- Every request carries a new server id (newMsgId) and one of 64 senders, so the records are
-- distinct messages spread over 64 conversations (64 Kafka keys), as a gateway would send them.
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

local template = '{"wcId":"wxid_benchbot00001","account":"13800000000","messageType":"60001",' ..
  '"data":{"fromUser":"wxid_benchuser%04d","toUser":"wxid_benchbot00001","msgId":%d,' ..
  '"newMsgId":%s,"timestamp":1705043418,"content":"bench message %d","self":false}}'

function request()
  counter = counter + 1
  -- 7300000000000000000 + thread * 10^12 + counter: 19 digits, unique per thread and request.
  local id = string.format("73%05d%012d", thread_id, counter)
  local body = string.format(template, counter % 64, counter, id, counter)
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
