-- fence.lua: the fence comparison that hset.lua and hincrby.lua are built on (fenced.go puts
-- it before each of them, so the two scripts compare fences with the very same code).
--
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
