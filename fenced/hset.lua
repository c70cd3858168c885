-- hset.lua: set fields of a hash, fenced by the writer's lease.
--
-- KEYS[1]  the entity's hash; field "lock_fence" holds the largest fence that wrote it
-- ARGV[1]  fence of the writer's lease (decimal)
-- ARGV[2..] field, value, field, value, ...
--
-- Replies: {1, fence} applied (lock_fence is now ARGV[1]); {0, stored} stale: a writer with
-- the larger fence stored was here, nothing changed. Fences are compared with >= (see
-- hincrby.lua), as integers of up to 64 bits, and replied as the decimal text they are stored
-- as.

-- fence_parts and fence_below come from fence.lua.

local stored = redis.call('HGET', KEYS[1], 'lock_fence') or '0'
if not fence_parts(ARGV[1]) or not fence_parts(stored) then
  return redis.error_reply('fenced: ' .. KEYS[1] .. ' fence ' .. stored .. ' or ' .. ARGV[1] .. ' is not an integer')
end
if fence_below(ARGV[1], stored) then
  return {0, stored}
end
local args = {}
for i = 2, #ARGV do
  args[#args + 1] = ARGV[i]
end
args[#args + 1] = 'lock_fence'
args[#args + 1] = ARGV[1]
redis.call('HSET', KEYS[1], unpack(args))
return {1, ARGV[1]}
