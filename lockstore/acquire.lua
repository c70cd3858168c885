-- acquire.lua: take a lock, or re-enter it for the same owner, and mint a fencing token.
--
-- KEYS[1]  lock key; its value is the owner token, optionally followed by " " and metadata,
--          and by the waiters mark " ~" once someone was refused (see below)
-- KEYS[2]  fence key in the same hash slot; holds the last fence minted for KEYS[1]
-- ARGV[1]  owner token (never contains a space)
-- ARGV[2]  lease TTL in milliseconds (> 0)
-- ARGV[3]  value to store: the owner token, or "<token> <metadata>"
-- ARGV[4]  how long the fence key outlives the lock, in milliseconds
--
-- Replies (a two-element array):
--   {1, fence}  acquired: the key was free and now belongs to ARGV[1]
--   {2, fence}  re-entered: ARGV[1] already held it; fence unchanged, and its TTL raised to
--               ARGV[2] if it had less (a re-entry never shortens the holder's lock)
--   {0, pttl}   busy: another owner holds it for pttl more milliseconds; the lock is marked
--               so that its release publishes a notification (unmarked releases publish none)
--
-- The fence never decreases for a key: it is max(last fence + 1, server time in microseconds).
-- The fence key expires ARGV[4] ms after the lock, and from then on server time alone is larger
-- than every fence minted before, because a key cannot change hands more than once a microsecond.
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local keep = ttl + tonumber(ARGV[4])

-- The common case first: a free key costs SET NX, TIME and one SET ... GET for the fence.
if redis.call('SET', KEYS[1], ARGV[3], 'NX', 'PX', ttl) then
  local now = redis.call('TIME')
  local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local prev = redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', keep, 'GET')
  if prev and tonumber(prev) >= fence then
    -- Two owners within one microsecond, or the server clock stepped back: count on.
    fence = tonumber(prev) + 1
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', keep)
  end
  return {1, fence}
end

local current = redis.call('GET', KEYS[1])
if current == owner or string.sub(current, 1, #owner + 1) == owner .. ' ' then
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], keep)
  end
  return {2, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if string.sub(current, -2) ~= ' ~' then
  redis.call('APPEND', KEYS[1], ' ~') -- APPEND keeps the TTL
end
return {0, redis.call('PTTL', KEYS[1])}
