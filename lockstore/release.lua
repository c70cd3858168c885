-- release.lua: delete a lock, only for its owner, and tell waiters it is free.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  prefix of the release notification channel; the channel is ARGV[2] .. KEYS[1]
--
-- Replies: -1 not held by ARGV[1] (nothing deleted, nothing published);
--          n >= 0 released, and n subscribers (waiters in other processes) were notified.
-- A notification is published only when acquire.lua marked the lock (" ~" at the end of its
-- value) because someone was refused while it was held; an uncontended release costs no
-- PUBLISH. The slot's fence counter is left alone: the next holder counts on from it.
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #owner + 1) == owner .. ' ' then
  redis.call('DEL', KEYS[1])
  if string.sub(current, -2) == ' ~' then
    return redis.call('PUBLISH', ARGV[2] .. KEYS[1], '1')
  end
  return 0
end
return -1
