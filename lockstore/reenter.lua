-- reenter.lua: re-enter a lock that an owner already holds, from another process (an owner
-- token handed over by an upstream call). It never takes a free key: a token that holds
-- nothing (made up, stale, or of a lock that expired) gets nothing.
--
-- KEYS[1]  lock key (value as in acquire.lua: "<owner> <fence> <holds>[ <metadata>][ ~]")
-- ARGV[1]  owner token
-- ARGV[2]  TTL in whole milliseconds (> 0), as a decimal string; the lock's TTL is raised to it
--          if it had less, never shortened
--
-- Replies (a two-element array):
--   {2, fence}  re-entered: the hold count went up by one; release.lua counts it down
--   {0, pttl}   not held by ARGV[1]: another owner holds it for pttl more milliseconds
--   {3, 0}      the key is free: nothing was taken
local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if not current then
  return {3, 0}
end
local o, fence, holds, rest = string.match(current, '^(%S+) (%d+) (%d+)(.*)$')
if o ~= owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], o .. ' ' .. fence .. ' ' .. string.format('%d', tonumber(holds) + 1) .. rest, 'KEEPTTL')
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {2, tonumber(fence)}
