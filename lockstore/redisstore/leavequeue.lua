-- leavequeue.lua: take an owner's place out of a fair lock's line (fairacquire.lua).
--
-- KEYS[1]  lock key, KEYS[2] its line, KEYS[3] the places' deadlines
-- ARGV[1]  owner token
-- ARGV[2]  prefix of the release notification channel; the channel is ARGV[2] .. KEYS[1]
--
-- Replies: the number of waiters notified (0 when the PUBLISH was refused, see publish.lua). When
-- the owner was first in line and the key is free, the next in line is woken at once rather
-- than at its next look.

local head = redis.call('ZRANGE', KEYS[2], 0, 0)
local was = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if was == 1 and head[1] == ARGV[1] and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  return publish(ARGV[2] .. KEYS[1])
end
return 0
