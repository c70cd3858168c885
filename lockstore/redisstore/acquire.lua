-- acquire.lua: take a lock, or re-enter it for the same owner, and mint a fencing token; or
-- take the first free of a semaphore's permits (more than one pair of KEYS, see the end).
--
-- KEYS[1]  lock key; its value is "<owner> <fence> <holds>", then " <metadata>" when there is
--          some, then the waiters mark " ~" once someone was refused (see below). holds lists
--          the holds of the owner token: "1" (the acquisition's, "0" once released), then
--          ",<id>" for each re-entry from another process (reenter.lua); release.lua deletes the
--          key when none is left. Holds are named, not counted, so that a command re-sent by
--          the client (go-redis retries after a lost reply) cannot count one twice.
-- KEYS[2]  fence counter of KEYS[1]'s hash slot (shared by every lock key of that slot): the
--          last fence handed out in the slot
-- ARGV[1]  owner token (never contains a space)
-- ARGV[2]  lease TTL in whole milliseconds (> 0), as a decimal string
-- ARGV[3]  "" or " <metadata>"
--
-- Replies:
--   fence       acquired (an integer, not an array: the common reply is the cheapest one): the
--               key was free and now belongs to ARGV[1]
--   {2, fence}  re-entered: ARGV[1] already held it (a re-sent acquisition); the fence is the
--               one minted when it was taken, the hold count is unchanged, and the TTL is raised
--               to ARGV[2] if it had less (never shortened)
--   {0, pttl, value}  busy: another owner holds it for pttl more milliseconds (value is the
--               lock's value, from which the store passes on the holder's metadata, never its
--               owner token); the lock is marked so that its release publishes a notification
--               (unmarked releases publish none)
--
-- A key held by the readers of a read-write lock ("~r ...", readacquire.lua) is busy like any
-- held key; one the last reader left to a waiting writer ("~w ...") is taken as free.
--
-- Fences are a hybrid logical clock per hash slot: max(last fence + 1, server time in
-- microseconds). The "+ 1" makes them strictly increase on one server whatever its clock does;
-- the clock part keeps them increasing when the counter itself goes back (a restart from an RDB
-- snapshot, lost AOF writes, a replica promoted before it saw the last grants, FLUSHDB), as long
-- as the server clock after the loss reads later than it did at the lost grants. The counter is
-- written only when a lock is granted, in the same script as the grant.
--
-- Cost: a free key costs TIME, SET NX and one SET ... GET of the counter, which reads
-- the last fence and writes the new one in one command. The new fence is first taken to be the
-- server time; only when the counter turns out to be at or past it (a clock that stepped back,
-- a grant in the same microsecond, fences handed out locally ahead of the clock) does the
-- script write the counter and the lock's value once more with last + 1. Nothing outside the
-- script sees the value in between: a script runs alone.
--
-- Permits: KEYS holds pairs (a permit's lock key, its slot's fence counter), in the order to
-- try them, all in one hash slot on a Cluster; ARGV[4] is how many to take at most. The script
-- first looks for the permits ARGV[1] holds (a re-sent call: {2, '', fence, i, fence, i, ...},
-- i a pair's place from 1), then takes the first it can take as above, up to ARGV[4] of them
-- ({1, the value of the first busy permit passed over or '', fence, i, ...}), else marks every
-- one and replies {0, shortest pttl, the first value}.
--
-- Arguments reach redis.call as the strings they came in: a Lua number would be formatted with
-- "%.17g" on every call, which costs more than the SET itself.
local owner = ARGV[1]
local now = redis.call('TIME') -- {seconds, microseconds}, both decimal strings
local us = now[2]
local now_fence = now[1] .. string.sub('00000', #us) .. us -- seconds and six digits of microseconds

-- take tries the lock at KEYS[i] and its counter KEYS[i + 1]: the fence when taken, else nil
-- and the lock's value.
local function take(i)
  local key, f = KEYS[i], now_fence
  local taken = redis.call('SET', key, owner .. ' ' .. f .. ' 1' .. ARGV[3], 'NX', 'PX', ARGV[2])
  local mark, current = '', nil
  if not taken then
    current = redis.call('GET', key)
    if string.sub(current, 1, 3) ~= '~w ' then
      return nil, current
    end
    -- The last reader of a read-write lock left the key to the writer that waited for it
    -- (readrelease.lua): any writer takes it. The readers held back wait for its release.
    mark = ' ~'
    redis.call('SET', key, owner .. ' ' .. f .. ' 1' .. ARGV[3] .. mark, 'PX', ARGV[2])
  end
  local last = redis.pcall('SET', KEYS[i + 1], f, 'GET') -- SET ... GET: Redis 6.2 or later
  if type(last) == 'table' and last.err then
    -- The counter is of another type (WRONGTYPE), or the server is older than 6.2: nothing was
    -- written to it; give the lock back and say why.
    redis.call('DEL', key)
    return redis.error_reply('flightlock: fence counter ' .. KEYS[i + 1] .. ': ' .. last.err)
  end
  local n = last and tonumber(last)
  if last and (not n or n ~= n or n >= 9007199254740992) then
    -- Not a number below 2^53 (beyond which a Lua number no longer counts by one): refuse
    -- rather than repeat a fence, and leave both keys as found.
    redis.call('DEL', key)
    redis.call('SET', KEYS[i + 1], last)
    return redis.error_reply('flightlock: fence counter ' .. KEYS[i + 1] .. ' is not a number below 2^53')
  end
  if n and n >= tonumber(f) then
    f = string.format('%d', n + 1)
    redis.call('SET', KEYS[i + 1], f)
    redis.call('SET', key, owner .. ' ' .. f .. ' 1' .. ARGV[3] .. mark, 'KEEPTTL')
  end
  return tonumber(f)
end

-- held reports the fence of ARGV[1]'s lock at KEYS[i] when value is its, raising its TTL.
local function held(i, value)
  if value and string.sub(value, 1, #owner + 1) == owner .. ' ' then
    if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
    end
    return tonumber(string.match(value, '^%S+ (%d+)') or '0')
  end
  return nil
end

-- busy marks the lock at KEYS[i] so that its release publishes, and returns its pttl.
local function busy(i, value)
  if string.sub(value, -2) ~= ' ~' then
    redis.call('APPEND', KEYS[i], ' ~') -- APPEND keeps the TTL
  end
  return redis.call('PTTL', KEYS[i])
end

if #KEYS == 2 then
  local f, current = take(1)
  if f then
    return f
  end
  local fence = held(1, current)
  if fence then
    return {2, fence}
  end
  return {0, busy(1, current), current}
end

-- Permits: one MGET reads them all; then the ones ARGV[1] holds are re-entered, or up to
-- ARGV[4] of the free ones are taken in order, or, with none free, each is marked.
local locks = {}
for i = 1, #KEYS, 2 do
  locks[#locks + 1] = KEYS[i]
end
local values, out, free, passed = redis.call('MGET', unpack(locks)), {2, ''}, {}, nil
for j, v in ipairs(values) do
  local i = 2 * j - 1
  local fence = held(i, v)
  if fence then
    out[#out + 1] = fence
    out[#out + 1] = j
  elseif not v or string.sub(v, 1, 3) == '~w ' then
    free[#free + 1] = i
  else
    passed = passed or v
  end
end
if #out > 2 then
  return out
end
out[1], out[2] = 1, passed or ''
for _, i in ipairs(free) do
  local f = take(i) -- it takes a free key
  if type(f) == 'table' then
    return f -- an error reply
  end
  out[#out + 1] = f
  out[#out + 1] = (i + 1) / 2
  if (#out - 2) / 2 >= tonumber(ARGV[4]) then
    break
  end
end
if #out > 2 then
  return out -- the permits passed over stay unmarked: this taker waits for none
end
local pttl = nil
for j, v in ipairs(values) do
  local left = busy(2 * j - 1, v)
  if not pttl or (left >= 0 and (pttl < 0 or left < pttl)) then
    pttl = left
  end
end
return {0, pttl, values[1]}
