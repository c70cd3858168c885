-- refresh.lua: extend a lock, only for its owner.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence key of KEYS[1]
-- ARGV[1]  owner token
-- ARGV[2]  new TTL in milliseconds (> 0)
-- ARGV[3]  how long the fence key outlives the lock, in milliseconds
--
-- Replies: 1 refreshed; 0 not held by ARGV[1] (free, expired, or another owner's).
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if current and (current == owner or string.sub(current, 1, #owner + 1) == owner .. ' ') then
  local ttl = tonumber(ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl + tonumber(ARGV[3]))
  return 1
end
return 0
