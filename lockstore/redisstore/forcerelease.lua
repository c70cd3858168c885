-- forcerelease.lua: delete a lock for an operator, only while it is still the grant the operator
-- saw, and wake the waiters of other processes.
--
-- KEYS[1]  lock key (value as in acquire.lua: "<owner> <fence> <holds>[ <metadata>][ ~]")
-- ARGV[1]  "<owner> <fence> ", the start of the value of that grant: whatever its holds, a
--          value that starts so is the same grant (a fence is never handed out twice)
-- ARGV[2]  its release notification channel
--
-- Replies: {1, n}      deleted, and n subscribers (waiters in other processes) were notified
--                      (0 when the PUBLISH was refused, see publish.lua);
--          {0, value}  not deleted: the key holds another grant now (its value), or "" when it
--                      is gone.
-- Unlike release.lua it publishes whether or not the lock was marked: a waiter that subscribed
-- without being refused (a mark lost with a failover) is woken too, and an operator's unlock is
-- rare enough that the PUBLISH costs nothing that matters.

local current = redis.call('GET', KEYS[1])
if not current or string.sub(current, 1, #ARGV[1]) ~= ARGV[1] then
  return {0, current or ''}
end
redis.call('DEL', KEYS[1])
return {1, publish(ARGV[2])}
