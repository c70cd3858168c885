-- readacquire.lua: take a read hold of a read-write lock, shared with the other read holds.
--
-- KEYS[1]  lock key. Held for reading, its value is "~r:<stamp> <fence> 1[ <metadata>][ ~]",
--          stamp the server time in microseconds when the first of these readers came (it tells
--          one group of readers from the next, which may carry the same fence): no owner token
--          starts with "~" (acquire.lua and the other scripts compare owners by prefix, and the
--          store refuses a handed-over owner that starts with "~"), so no writer's script
--          takes it for its own, and a writer refused by it appends the waiters mark " ~" as
--          on any held lock. "~w <fence> 0 ~" is a key that the last reader left to the writer
--          that waited for it (readrelease.lua): readers wait, writers take it.
-- KEYS[2]  read holds: a sorted set of the readers' owner tokens, scored by the server time in
--          milliseconds at which each runs out. The lock key lives as long as the longest of
--          them, so a writer can never take the key while a read hold lives.
-- KEYS[3]  fence counter of KEYS[1]'s hash slot (see acquire.lua)
-- ARGV[1]  the reader's owner token (lockstore.ReadOwner)
-- ARGV[2]  TTL in whole milliseconds (> 0)
-- ARGV[3]  "" or " <metadata>": the value carries the metadata of the reader that came last,
--          and none once a reader left while others remain (readrelease.lua), so that a busy
--          reply never names a reader that is gone
--
-- Replies as acquire.lua's: fence (taken), {2, fence} (re-entered: a re-sent acquisition),
-- {0, pttl, value} (busy: a writer holds the key, or waits for the readers to finish: writer
-- preference). A read hold's fence is the one the key's value carries, minted when the first of
-- the current readers came as a write's is (the server time in microseconds, or the slot's
-- counter when that is ahead) and written to the counter: at least the last write's fence, also
-- after Redis lost the counter's last writes, and below every later write's, which are minted
-- above the counter.
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 3) ~= '~r:' then
  if string.sub(v, -2) ~= ' ~' then
    redis.call('APPEND', KEYS[1], ' ~')
  end
  return {0, redis.call('PTTL', KEYS[1]), v}
end
local fence
if v then
  fence = string.match(v, '^~r:%d+ (%d+)') or '0'
  local s = tonumber(redis.call('ZSCORE', KEYS[2], owner) or '0')
  if s > now then
    if s < now + ttl then
      redis.call('ZADD', KEYS[2], now + ttl, owner)
    end
    if redis.call('PTTL', KEYS[1]) < ttl then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      redis.call('PEXPIRE', KEYS[2], ARGV[2])
    end
    return {2, tonumber(fence)}
  end
  if string.sub(v, -2) == ' ~' then
    return {0, redis.call('PTTL', KEYS[1]), v} -- a writer waits for the readers before this one
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local head = string.match(v, '^(~r:%d+ %d+ 1)')
  if head then
    redis.call('SET', KEYS[1], head .. ARGV[3], 'KEEPTTL')
  end
else
  local us = t[2]
  local stamp = t[1] .. string.sub('00000', #us) .. us
  fence = stamp
  local last = redis.pcall('GET', KEYS[3])
  local n = type(last) == 'string' and tonumber(last)
  if n and n == n and n < 9007199254740992 and n >= tonumber(stamp) then
    fence = string.format('%d', n) -- the counter is ahead of the clock: stay at it
  elseif type(last) ~= 'table' then
    redis.call('SET', KEYS[3], fence) -- later writes mint above it
  end
  redis.call('DEL', KEYS[2]) -- read holds of a key that expired with them
  redis.call('SET', KEYS[1], '~r:' .. stamp .. ' ' .. fence .. ' 1' .. ARGV[3], 'PX', ARGV[2])
end
redis.call('ZADD', KEYS[2], now + ttl, owner)
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
redis.call('PEXPIRE', KEYS[2], redis.call('PTTL', KEYS[1]))
return tonumber(fence)
