-- saveresponse.lua: store a share rule's response record (responses.go), never over what is not
-- a record nor over the record of a later grant.
--
-- KEYS[1]  the record's key, under the rules' lock prefix
-- ARGV[1]  the record: a JSON object ('{'), whose fence "f" comes just before its last field,
--          "p" (lockstore.ResponseStore)
-- ARGV[2]  how long to keep it, in whole milliseconds (> 0)
-- ARGV[3]  the fence of the grant that produced it; 0 (a save of a degraded run) compares nothing
--
-- Replies: OK stored; 0 not stored, the key holds the record of a later grant (a larger fence):
-- a holder that lost its lock while its handler ran must not overwrite the response of the
-- holder after it. An error reply when the key holds what is not a record: a lock of another
-- rule whose key renders as this one's keeps its value and its owner. Strings in a record are
-- JSON-escaped, so the pattern cannot match inside one.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) ~= '{' then
  return redis.error_reply('flightlock: ' .. KEYS[1] .. ' holds a lock, not a stored response')
end
if v then
  local f = tonumber(string.match(v, '"f":(%-?%d+),"p":"[^"]*"}$') or '')
  local mine = tonumber(ARGV[3])
  if f and mine > 0 and f > mine then
    return 0
  end
end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
