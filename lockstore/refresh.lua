-- refresh.lua: extend a lock, only for its owner.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  new TTL in whole milliseconds (> 0), as a decimal string
--
-- Replies: 1 refreshed; 0 not held by ARGV[1] (free, expired, or another owner's).
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #owner + 1) == owner .. ' ' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
