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
-- Replies (an array):
--   {1, fence}  acquired: the key was free and now belongs to ARGV[1]
--   {2, fence}  re-entered: ARGV[1] already held it (a re-sent acquisition); the fence is the
--               one minted when it was taken, the hold count is unchanged, and the TTL is raised
--               to ARGV[2] if it had less (never shortened)
--   {0, pttl, value}  busy: another owner holds it for pttl more milliseconds (value is the
--               lock's value, from which the store passes on the holder's metadata, never its
--               owner token); the lock is marked so that its release publishes a notification
--               (unmarked releases publish none)
--
-- Fences are a hybrid logical clock per hash slot: max(last fence + 1, server time in
-- microseconds). The "+ 1" makes them strictly increase on one server whatever its clock does;
-- the clock part keeps them increasing when the counter itself goes back (a restart from an RDB
-- snapshot, lost AOF writes, a replica promoted before it saw the last grants, FLUSHDB), as long
-- as the server clock after the loss reads later than it did at the lost grants. The counter is
-- written only when a lock is granted.
--
-- Arguments reach redis.call as the strings they came in: a Lua number would be formatted with
-- "%.17g" on every call, which costs more than the SET itself.
local owner = ARGV[1]
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if not last or last ~= last or last >= 9007199254740992 then
  -- Beyond 2^53 a Lua number no longer counts by one: refuse rather than repeat a fence.
  return redis.error_reply('flightlock: fence counter ' .. KEYS[2] .. ' is not a number below 2^53')
end
if fence <= last then
  fence = last + 1
end
local f = string.format('%d', fence)

-- The common case first: a free key costs TIME, GET, SET NX and SET.
if redis.call('SET', KEYS[1], owner .. ' ' .. f .. ' 1' .. ARGV[3], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], f)
  return {1, fence}
end

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
return {0, redis.call('PTTL', KEYS[1]), current}
