-- release.lua: give up one hold of a lock, only for its owner; delete it and tell waiters it is
-- free when that was the last hold.
--
-- KEYS[1]  lock key (value as in acquire.lua: "<owner> <fence> <holds>[ <metadata>][ ~]")
-- KEYS[2]  fence counter of KEYS[1]'s hash slot
-- ARGV[1]  owner token
-- ARGV[2]  prefix of the release notification channel; the channel is ARGV[2] .. KEYS[1]
-- ARGV[3]  the largest fence the releasing holder handed out under this lock (its process hands
--          the lock from goroutine to goroutine with fences above the acquisition's), or "0"
--
-- Replies: -1 not held by ARGV[1] (nothing changed, nothing published);
--          -2 released one hold; others remain (re-entries from other processes), the key stays;
--          n >= 0 deleted, and n subscribers (waiters in other processes) were notified.
-- A notification is published only when acquire.lua marked the lock (" ~" at the end of its
-- value) because someone was refused while it was held; an uncontended release costs no
-- PUBLISH. The fence counter is raised to ARGV[3] so that the next holder counts on above the
-- fences handed out locally.
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if not current or string.sub(current, 1, #owner + 1) ~= owner .. ' ' then
  return -1
end
local used = tonumber(ARGV[3])
if used > 0 then
  local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if used > last then
    redis.call('SET', KEYS[2], ARGV[3])
  end
end
local o, fence, holds, rest = string.match(current, '^(%S+) (%d+) (%d+)(.*)$')
if holds and tonumber(holds) > 1 then
  redis.call('SET', KEYS[1], o .. ' ' .. fence .. ' ' .. string.format('%d', tonumber(holds) - 1) .. rest, 'KEEPTTL')
  return -2
end
redis.call('DEL', KEYS[1])
if string.sub(current, -2) == ' ~' then
  return redis.call('PUBLISH', ARGV[2] .. KEYS[1], '1')
end
return 0
