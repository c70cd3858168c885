-- acquire.lua: take a lock, or re-enter it for the same owner, and mint a fencing token.
--
-- KEYS[1]  lock key; its value is "<owner> <fence> <holds>", then " <metadata>" when there is
--          some, then the waiters mark " ~" once someone was refused (see below). holds lists
--          the holds of the owner token: "1" (the acquisition's, "0" once released), then
--          ",<id>" for each re-entry from another process (reenter.lua); release.lua deletes the
--          key when none is left. Holds are named, not counted, so that a command re-sent by
--          the client (go-redis retries after a lost reply) cannot count one twice.
-- KEYS[2]  fence counter of KEYS[1]'s hash slot (shared by every lock key of that slot): the
--          last fence handed out in the slot
-- ARGV[1]  owner token (never contains a space)
-- ARGV[2]  lease TTL in whole milliseconds (> 0), as a decimal string
-- ARGV[3]  "" or " <metadata>"
--
-- Replies:
--   fence       acquired (an integer, not an array: the common reply is the cheapest one): the
--               key was free and now belongs to ARGV[1]
--   {2, fence}  re-entered: ARGV[1] already held it (a re-sent acquisition); the fence is the
--               one minted when it was taken, the hold count is unchanged, and the TTL is raised
--               to ARGV[2] if it had less (never shortened)
--   {0, pttl, value}  busy: another owner holds it for pttl more milliseconds (value is the
--               lock's value, from which the store passes on the holder's metadata, never its
--               owner token); the lock is marked so that its release publishes a notification
--               (unmarked releases publish none)
--
-- A key held by the readers of a read-write lock ("~r ...", readacquire.lua) is busy like any
-- held key; one the last reader left to a waiting writer ("~w ...") is taken as free.
--
-- Fences are a hybrid logical clock per hash slot: max(last fence + 1, server time in
-- microseconds). The "+ 1" makes them strictly increase on one server whatever its clock does;
-- the clock part keeps them increasing when the counter itself goes back (a restart from an RDB
-- snapshot, lost AOF writes, a replica promoted before it saw the last grants, FLUSHDB), as long
-- as the server clock after the loss reads later than it did at the lost grants. The counter is
-- written only when a lock is granted, in the same script as the grant.
--
-- Cost: a free key costs TIME, SET NX and one SET ... GET of the counter, which reads
-- the last fence and writes the new one in one command. The new fence is first taken to be the
-- server time; only when the counter turns out to be at or past it (a clock that stepped back,
-- a grant in the same microsecond, fences handed out locally ahead of the clock) does the
-- script write the counter and the lock's value once more with last + 1. Nothing outside the
-- script sees the value in between: a script runs alone.
--
-- Arguments reach redis.call as the strings they came in: a Lua number would be formatted with
-- "%.17g" on every call, which costs more than the SET itself.
local owner = ARGV[1]
local now = redis.call('TIME') -- {seconds, microseconds}, both decimal strings
local us = now[2]
local f = now[1] .. string.sub('00000', #us) .. us -- seconds and six digits of microseconds

local taken = redis.call('SET', KEYS[1], owner .. ' ' .. f .. ' 1' .. ARGV[3], 'NX', 'PX', ARGV[2])
local mark, current = '', nil
if not taken then
  current = redis.call('GET', KEYS[1])
  if string.sub(current, 1, 3) == '~w ' then
    -- The last reader of a read-write lock left the key to the writer that waited for it
    -- (readrelease.lua): any writer takes it. The readers held back wait for its release.
    mark = ' ~'
    taken = redis.call('SET', KEYS[1], owner .. ' ' .. f .. ' 1' .. ARGV[3] .. mark, 'PX', ARGV[2])
  end
end
if taken then
  local last = redis.pcall('SET', KEYS[2], f, 'GET') -- SET ... GET: Redis 6.2 or later
  if type(last) == 'table' and last.err then
    -- The counter is of another type (WRONGTYPE), or the server is older than 6.2: nothing was
    -- written to it; give the lock back and say why.
    redis.call('DEL', KEYS[1])
    return redis.error_reply('flightlock: fence counter ' .. KEYS[2] .. ': ' .. last.err)
  end
  local n = last and tonumber(last)
  if last and (not n or n ~= n or n >= 9007199254740992) then
    -- Not a number below 2^53 (beyond which a Lua number no longer counts by one): refuse
    -- rather than repeat a fence, and leave both keys as found.
    redis.call('DEL', KEYS[1])
    redis.call('SET', KEYS[2], last)
    return redis.error_reply('flightlock: fence counter ' .. KEYS[2] .. ' is not a number below 2^53')
  end
  if n and n >= tonumber(f) then
    f = string.format('%d', n + 1)
    redis.call('SET', KEYS[2], f)
    redis.call('SET', KEYS[1], owner .. ' ' .. f .. ' 1' .. ARGV[3] .. mark, 'KEEPTTL')
  end
  return tonumber(f)
end

if string.sub(current, 1, #owner + 1) == owner .. ' ' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {2, tonumber(string.match(current, '^%S+ (%d+)') or '0')}
end
if string.sub(current, -2) ~= ' ~' then
  redis.call('APPEND', KEYS[1], ' ~') -- APPEND keeps the TTL
end
return {0, redis.call('PTTL', KEYS[1]), current}
