-- refresh.lua: extend a lock, only for its owner, and never shorten it.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  TTL in whole milliseconds (> 0), as a decimal string
--
-- Replies: 1 the lock lives at least ARGV[2] more milliseconds (raised if it had less, left
-- alone if it had more: a holder with a shorter TTL, such as a downstream that re-entered the
-- lock, must not cut the lease of one with a longer TTL); 0 not held by ARGV[1] (free, expired,
-- or another owner's).
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #owner + 1) == owner .. ' ' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
