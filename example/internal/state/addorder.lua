-- addorder.lua: append an order to a user's order book, fenced by the writer's lease.
--
-- KEYS[1]  the user's order hash: field "lock_fence" (fenced.FieldFence: the largest fence that wrote it), field "seq"
--          (last order number) and one field per order, named by its number
-- ARGV[1]  fence of the writer's lease on the user's orders (an integer, decimal)
-- ARGV[2]  the order, JSON encoded
--
-- Replies (a two-element array):
--   {1, n}       stored as order number n; the hash's fence is now ARGV[1]
--   {0, fence}   stale: a writer with the larger fence `fence` was here; nothing changed
local stored = tonumber(redis.call('HGET', KEYS[1], 'lock_fence') or '0')
if tonumber(ARGV[1]) < stored then
  return {0, stored}
end
local n = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], tostring(n), ARGV[2], 'lock_fence', ARGV[1])
return {1, n}
