-- readrefresh.lua: extend one read hold (readacquire.lua), never shortening it.
--
-- KEYS[1]  lock key, KEYS[2] its read holds (see readacquire.lua)
-- ARGV[1]  the reader's owner token, ARGV[2] TTL in whole milliseconds
--
-- Replies: 1 the hold lives at least ARGV[2] more milliseconds, and the lock key with it; 0 not
-- held (never taken, released, or run out: a hold past its time is not brought back, even while
-- other readers keep the key).
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local s = tonumber(redis.call('ZSCORE', KEYS[2], owner) or '0')
local v = redis.call('GET', KEYS[1])
if s == 0 or not v or string.sub(v, 1, 3) ~= '~r:' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if s <= now then
  return 0
end
if s < now + ttl then
  redis.call('ZADD', KEYS[2], now + ttl, owner)
end
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
redis.call('PEXPIRE', KEYS[2], redis.call('PTTL', KEYS[1]))
return 1
