-- reenter.lua: re-enter a lock that an owner already holds, from another process (an owner
-- token handed over by an upstream call). It never takes a free key: a token that holds nothing
-- (made up, stale, or of a lock that expired) gets nothing.
--
-- KEYS[1]  lock key (value as in acquire.lua: "<owner> <fence> <holds>[ <metadata>][ ~]")
-- ARGV[1]  owner token
-- ARGV[2]  TTL in whole milliseconds (> 0), as a decimal string; the lock's TTL is raised to it
--          if it had less, never shortened
-- ARGV[3]  id of this hold: random, without spaces or commas; release.lua gives it up
--
-- Replies (a two-element array):
--   {2, fence}  re-entered: the hold ARGV[3] is listed (a re-sent call lists it once)
--   {0, pttl}   not held by ARGV[1]: another owner holds it for pttl more milliseconds
--   {3, 0}      the key is free: nothing was taken
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if not current then
  return {3, 0}
end
local o, fence, holds, rest = string.match(current, '^(%S+) (%d+) (%S+)(.*)$')
if o ~= owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
if not string.find(holds .. ',', ',' .. ARGV[3] .. ',', 1, true) then
  redis.call('SET', KEYS[1], o .. ' ' .. fence .. ' ' .. holds .. ',' .. ARGV[3] .. rest, 'KEEPTTL')
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {2, tonumber(fence)}
