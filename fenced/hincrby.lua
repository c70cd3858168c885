-- hincrby.lua: add a signed delta to one integer field of a hash, fenced by the writer's lease.
--
-- KEYS[1]  the entity's hash; field "lock_fence" holds the largest fence that wrote it
-- ARGV[1]  the field to change
-- ARGV[2]  delta, a signed integer
-- ARGV[3]  fence of the writer's lease (decimal)
-- ARGV[4]  "" or the lowest value the field may take (decimal)
-- ARGV[5]  "1" when the field must exist already, "" when a missing field counts as 0
--
-- Replies (a two-element array):
--   {1, value}    applied: value is the field's new value; lock_fence is now ARGV[3]
--   {0, stored}   stale: a writer with the larger fence stored was here; nothing changed
--                 (stored is the decimal text of the fence: it may be beyond 2^53)
--   {-1, value}   below the floor: the field (value) would go below ARGV[4]; nothing changed
--   {-2, 0}       missing: the field does not exist (ARGV[5] = "1"); nothing changed
--
-- Fences are compared with >=: goroutines that share one lock by in-process handoff share its
-- fence's order, and one holder may write many times. Field values (not fences) stay below 2^53 in magnitude, the
-- integers a Lua number holds exactly; beyond that the script refuses rather than round.

-- fence_parts and fence_below come from fence.lua.

local stored = redis.call('HGET', KEYS[1], 'lock_fence') or '0'
if not fence_parts(ARGV[3]) or not fence_parts(stored) then
  return redis.error_reply('fenced: ' .. KEYS[1] .. ' fence ' .. stored .. ' or ' .. ARGV[3] .. ' is not an integer')
end
if fence_below(ARGV[3], stored) then
  return {0, stored}
end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  if ARGV[5] == '1' then
    return {-2, 0}
  end
  current = '0'
end
local value = tonumber(current) + tonumber(ARGV[2])
if not value or value ~= value or value >= 9007199254740992 or value <= -9007199254740992 then
  return redis.error_reply('fenced: ' .. KEYS[1] .. ' ' .. ARGV[1] .. ' is not an integer below 2^53')
end
if ARGV[4] ~= '' and value < tonumber(ARGV[4]) then
  return {-1, tonumber(current)}
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', value), 'lock_fence', ARGV[3])
return {1, value}
