-- acquire.lua: take one permit of a ZSET semaphore, or refuse.
--
-- KEYS[1]  the semaphore: a sorted set of holders, each scored with its expiry (ms, server time)
-- ARGV[1]  the holder's member name (random per acquisition)
-- ARGV[2]  permits: the most members the set may hold
-- ARGV[3]  TTL in milliseconds: how long a permit outlives a holder that stops renewing
--
-- Replies 1 when the member holds a permit (taken now, or already held: a retried call is
-- idempotent), 0 when every permit is held.
local key, member = KEYS[1], ARGV[1]
local permits, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Holders that stopped renewing give their permits back here, on the next taker's call.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZSCORE', key, member) or redis.call('ZCARD', key) < permits then
  redis.call('ZADD', key, now + ttl, member)
  redis.call('PEXPIRE', key, ttl)
  return 1
end
return 0
