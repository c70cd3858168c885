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

-- Fences are int64s, up to 2^63 (an etcd fence is its grant's revision shifted left by 20 bits),
-- past 2^53, the integers a Lua number (a double) holds exactly: two fences that differ only
-- below a double's precision would compare equal. They are compared as decimal integers
-- instead: by sign, then number of digits, then digit by digit (leading zeros ignored).

-- fence_parts returns the digits of fence f without leading zeros and whether it is below
-- zero, or nil when f is not a decimal integer.
local function fence_parts(f)
  local sign, digits = string.match(f, '^(%-?)0*(%d+)$')
  if not digits then
    return nil
  end
  return digits, sign == '-' and digits ~= '0'
end

-- fence_below reports whether fence a is below fence b; both are decimal integers.
local function fence_below(a, b)
  local da, na = fence_parts(a)
  local db, nb = fence_parts(b)
  if na ~= nb then
    return na
  end
  if na then
    da, db = db, da -- both negative: the larger magnitude is the smaller fence
  end
  if #da ~= #db then
    return #da < #db
  end
  return da < db
end

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
