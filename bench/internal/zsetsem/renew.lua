-- renew.lua: push a held permit's expiry one TTL ahead.
--
-- KEYS[1]  the semaphore (acquire.lua)
-- ARGV[1]  the holder's member name
-- ARGV[2]  TTL in milliseconds
--
-- Replies 1 when renewed, 0 when the member no longer holds a permit (it expired and was
-- removed by a taker): a lost permit is not taken back.
local key, member, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
if not redis.call('ZSCORE', key, member) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', key, 'XX', now + ttl, member)
redis.call('PEXPIRE', key, ttl)
return 1
