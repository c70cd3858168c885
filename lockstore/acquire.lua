-- acquire.lua: take a lock, or re-enter it for the same owner, and mint a fencing token.
--
-- KEYS[1]  lock key; its value is "<owner> <fence>", then " <metadata>" when there is some,
--          then the waiters mark " ~" once someone was refused (see below)
-- KEYS[2]  fence counter of KEYS[1]'s hash slot (shared by every lock key of that slot)
-- ARGV[1]  owner token (never contains a space)
-- ARGV[2]  lease TTL in whole milliseconds (> 0), as a decimal string
-- ARGV[3]  "" or " <metadata>"
--
-- Replies (a two-element array):
--   {1, fence}  acquired: the key was free and now belongs to ARGV[1]
--   {2, fence}  re-entered: ARGV[1] already held it; the fence is the one minted when it was
--               taken, and the TTL is raised to ARGV[2] if it had less (never shortened)
--   {0, pttl}   busy: another owner holds it for pttl more milliseconds; the lock is marked
--               so that its release publishes a notification (unmarked releases publish none)
--
-- Fences come from one counter per hash slot, so a key's fences only grow: each holder's fence
-- was counted after the previous holder's. The counters never expire (at most 16,384 of them,
-- one per slot in use). A counter that is gone (FLUSHDB, eviction) restarts from server time in
-- microseconds, which is above every fence it handed out, since it cannot have counted more than
-- one acquisition per microsecond since it was seeded.
--
-- Arguments reach redis.call as the strings they came in: a Lua number would be formatted with
-- "%.17g" on every call, which costs more than the SET itself.
local owner = ARGV[1]
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  local now = redis.call('TIME')
  fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%d', fence))
end

-- The common case first: a free key costs INCR and SET NX.
if redis.call('SET', KEYS[1], owner .. ' ' .. string.format('%d', fence) .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  return {1, fence}
end

-- Taken (the count just made is skipped; fences need to grow, not to be dense).
local current = redis.call('GET', KEYS[1])
if string.sub(current, 1, #owner + 1) == owner .. ' ' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {2, tonumber(string.match(current, '^%S+ (%d+)') or '0')}
end
if string.sub(current, -2) ~= ' ~' then
  redis.call('APPEND', KEYS[1], ' ~') -- APPEND keeps the TTL
end
return {0, redis.call('PTTL', KEYS[1])}
