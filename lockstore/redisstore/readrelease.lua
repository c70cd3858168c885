-- readrelease.lua: end one read hold (readacquire.lua); the last one ends the key.
--
-- KEYS[1]  lock key, KEYS[2] its read holds (see readacquire.lua)
-- ARGV[1]  the reader's owner token
-- ARGV[2]  prefix of the release notification channel; the channel is ARGV[2] .. KEYS[1]
-- ARGV[3]  how long, in whole milliseconds, a key that a writer waited for is kept for writers
--
-- Replies as release.lua's: -1 not held (nothing to end; a hold past its time is removed all the
-- same), -2 ended, other readers remain, n >= 0 ended the last read hold and n waiters were
-- notified (0 when the PUBLISH was refused, see publish.lua).
--
-- When a writer was refused while the readers held the key (the " ~" mark), the last reader
-- does not delete it but leaves "~w <fence> 0 ~" for ARGV[3] ms and publishes: acquire.lua gives
-- that key to the first writer that asks, while readers still wait. Otherwise the readers that
-- the mark held back would race the writer for the free key, and a steady stream of them could
-- win every time. A writer that stopped waiting holds new readers back for ARGV[3] at most.

local owner = ARGV[1]
local s = tonumber(redis.call('ZSCORE', KEYS[2], owner) or '0')
if s == 0 then
  return -1
end
redis.call('ZREM', KEYS[2], owner)
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 3) ~= '~r:' then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = s > now
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local longest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #longest > 0 then
  -- The key lives as long as its longest read hold, no longer: a writer gets in as soon as the
  -- readers that are left run out.
  local left = math.max(tonumber(longest[2]) - now, 1)
  -- The value's metadata may be this reader's: the readers left are not named any more.
  local head = string.match(v, '^(~r:%d+ %d+ 1)')
  if head and #head < #v then
    local mark = ''
    if string.sub(v, -2) == ' ~' then
      mark = ' ~'
    end
    redis.call('SET', KEYS[1], head .. mark)
  end
  redis.call('PEXPIRE', KEYS[1], left)
  redis.call('PEXPIRE', KEYS[2], left)
  if held then
    return -2
  end
  return -1
end
if string.sub(v, -2) == ' ~' then
  redis.call('SET', KEYS[1], '~w ' .. (string.match(v, '^~r:%d+ (%d+)') or '0') .. ' 0 ~', 'PX', ARGV[3])
  local n = publish(ARGV[2] .. KEYS[1])
  if held then
    return n
  end
  return -1
end
redis.call('DEL', KEYS[1])
if held then
  return 0
end
return -1
