-- adjust.lua: add a signed delta to one counter of an entity, fenced by the writer's lease.
--
-- KEYS[1]  entity hash: field ARGV[1] is the counter, field "fence" the largest fence that
--          ever wrote the entity
-- ARGV[1]  counter field ("stock" or "balance")
-- ARGV[2]  delta, a signed integer
-- ARGV[3]  fence of the writer's lease on the entity (an integer, decimal)
--
-- Replies (a two-element array):
--   {1, value}   applied: value is the new counter; the entity's fence is now ARGV[3]
--   {0, fence}   stale: a writer with the larger fence `fence` was here; nothing changed
--   {-1, value}  insufficient: the counter (value) would go below zero; nothing changed
--   {-2, 0}      unknown entity: the hash has no counter field
--
-- Fences are compared with >=: goroutines that received one Redis lock by in-process handoff
-- share its fence, and each of them may write.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  return {-2, 0}
end
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[3]) < stored then
  return {0, stored}
end
local value = tonumber(current) + tonumber(ARGV[2])
if value < 0 then
  return {-1, tonumber(current)}
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', value), 'fence', ARGV[3])
return {1, value}
