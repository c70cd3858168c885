-- fairacquire.lua: take a lock in request order across processes (a lockstore.Request with Asked).
--
-- KEYS[1]  lock key (value as in acquire.lua; a grant here is an ordinary lock, released by
--          release.lua)
-- KEYS[2]  the line: a sorted set of waiting owners scored by when each asked, in microseconds
-- KEYS[3]  the places' deadlines: the same owners scored by the server time in milliseconds
--          after which a place whose owner stopped asking is dropped
-- KEYS[4]  fence counter of KEYS[1]'s hash slot (see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  lease TTL in whole milliseconds (> 0)
-- ARGV[3]  "" or " <metadata>"
-- ARGV[4]  when the caller's Lock began, microseconds since the epoch on the caller's clock:
--          clamped to at most a second before the server's time and never after it, so that a
--          caller with a clock far behind cannot go before everyone
-- ARGV[5]  how long the place lives after this call, in milliseconds; "0" takes no place
--          (TryLock: the key only when it is free and nobody waits)
--
-- Replies as acquire.lua's: fence (taken), {2, fence} (re-entered), {0, pttl, value} (busy),
-- {0, 0} (the key is free but others are before the caller).
--
-- Only the first in line takes a free key. A grant leaves the line and, while others wait in
-- it, marks the lock (" ~") so that its release wakes them (release.lua publishes on marked
-- locks). Places past their deadline are dropped before anything is decided.
local owner = ARGV[1]
local now = redis.call('TIME')
local us = now[2]
local f = now[1] .. string.sub('00000', #us) .. us
local nowus = tonumber(f)
local nowms = math.floor(nowus / 1000)

-- A server clock that stepped back (an NTP step, a restored VM) leaves the line in its future:
-- places asked after now, deadlines past now + queue. Later requests, clamped to the new time,
-- would go before the line for as long as the step, and a place whose owner stopped asking
-- would outlive its time by the step. Two readings bound the step from below: the newest
-- place was asked no later than the old time, and the latest deadline was set at most queue
-- after it (callers ask with one queue, the Locker's FairQueueTTL). The line moves back, in
-- order, until its newest place is a second before now, where no later request can go before
-- it; the deadlines move back by the larger reading, so that a waiter who still asks loses
-- none of its time and one who stopped is dropped when its time is up.
local queue = tonumber(ARGV[5])
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local asked = newest[2] and tonumber(newest[2]) - nowus or 0 -- microseconds
local stepms = math.floor(asked / 1000)
if queue > 0 then
  local latest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if latest[2] then
    stepms = math.max(stepms, tonumber(latest[2]) - nowms - queue)
  end
end
if asked > 0 then
  local line = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #line, 2 do
    redis.call('ZADD', KEYS[2], string.format('%d', tonumber(line[i + 1]) - asked - 1000000), line[i])
  end
end
if stepms > 0 then
  local due = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  for i = 1, #due, 2 do
    redis.call('ZADD', KEYS[3], string.format('%d', tonumber(due[i + 1]) - stepms), due[i])
  end
end

local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nowms)
if #gone > 0 then
  redis.call('ZREM', KEYS[2], unpack(gone))
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', nowms)
end

local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #owner + 1) == owner .. ' ' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {2, tonumber(string.match(v, '^%S+ (%d+)') or '0')}
end

if queue > 0 then
  if not redis.call('ZSCORE', KEYS[2], owner) then
    local asked = math.min(math.max(tonumber(ARGV[4]) or nowus, nowus - 1000000), nowus)
    redis.call('ZADD', KEYS[2], string.format('%d', asked), owner)
  end
  redis.call('ZADD', KEYS[3], nowms + queue, owner)
  for i = 2, 3 do
    if redis.call('PTTL', KEYS[i]) < queue then
      redis.call('PEXPIRE', KEYS[i], queue)
    end
  end
end

if not v or string.sub(v, 1, 3) == '~w ' then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if head[1] ~= nil and head[1] ~= owner then
    return {0, 0}
  end
  redis.call('ZREM', KEYS[2], owner)
  redis.call('ZREM', KEYS[3], owner)
  local mark = ''
  if v or redis.call('EXISTS', KEYS[2]) == 1 then
    mark = ' ~' -- readers or waiters in line: the release must wake them
  end
  local last = redis.pcall('SET', KEYS[4], f, 'GET')
  if type(last) == 'table' and last.err then
    return redis.error_reply('flightlock: fence counter ' .. KEYS[4] .. ': ' .. last.err)
  end
  local n = last and tonumber(last)
  if last and (not n or n ~= n or n >= 9007199254740992) then
    redis.call('SET', KEYS[4], last)
    return redis.error_reply('flightlock: fence counter ' .. KEYS[4] .. ' is not a number below 2^53')
  end
  if n and n >= nowus then
    f = string.format('%d', n + 1)
    redis.call('SET', KEYS[4], f)
  end
  redis.call('SET', KEYS[1], owner .. ' ' .. f .. ' 1' .. ARGV[3] .. mark, 'PX', ARGV[2])
  return tonumber(f)
end

if string.sub(v, -2) ~= ' ~' then
  redis.call('APPEND', KEYS[1], ' ~')
end
return {0, redis.call('PTTL', KEYS[1]), v}
