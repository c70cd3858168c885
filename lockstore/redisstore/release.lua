-- release.lua: give up one hold of a lock, only for its owner; delete the lock and tell waiters
-- it is free when that was the last hold.
--
-- KEYS[1]  lock key (value as in acquire.lua: "<owner> <fence> <holds>[ <metadata>][ ~]")
-- KEYS[2]  fence counter of KEYS[1]'s hash slot
-- ARGV[1]  owner token
-- ARGV[2]  prefix of the release notification channel; the channel is ARGV[2] .. KEYS[1]
-- ARGV[3]  the largest fence the releasing holder handed out under this lock (its process hands
--          the lock from goroutine to goroutine with fences above the acquisition's), or "0"
-- ARGV[4]  the hold to give up: "" for the acquisition's own, or the id of a re-entry from
--          another process (reenter.lua)
-- ARGV[5]  "" for a release; a TTL in whole milliseconds for a pass (RedisStore.Pass): the end
--          of a turn of the owner's lock, with goroutines of its process waiting for it
--
-- Replies: -1 not held by ARGV[1], or that hold was given up already (a re-sent call): nothing
--             changed but, when the key is gone, the fence counter raised to ARGV[3], and
--             nothing published;
--          -2 released that hold; others remain (re-entries from other processes), the key stays;
--          n >= 0 deleted, and n subscribers (waiters in other processes) were notified (0 when
--             the PUBLISH was refused, see publish.lua);
--          {3, fence} (a pass only) kept for the owner with a new fence, see below.
-- A notification is published only when acquire.lua marked the lock (" ~" at the end of its
-- value) because someone was refused while it was held; an uncontended release costs no
-- PUBLISH. The fence counter is raised to ARGV[3] so that the next holder counts on above the
-- fences handed out locally.
--
-- A pass keeps the lock instead when nobody elsewhere asked for it: the value is unmarked and
-- its only hold is the acquisition's (no re-entry of another process, no hold given up). The
-- next local holder then gets it with one round trip, not two (a release and a fresh
-- acquisition), and a fence minted here as acquire.lua mints one: above the server time, the
-- slot's counter, the lock's fence and ARGV[3]. The lock lives at least ARGV[5] ms more. A
-- marked lock, or a counter this script cannot read, is released as by a plain release, so that
-- waiters elsewhere get their turn.

local owner = ARGV[1]
local current = redis.call('GET', KEYS[1])
if not current or string.sub(current, 1, #owner + 1) ~= owner .. ' ' then
  -- The lock is gone (expired before this release came): the fences its holder handed out
  -- locally must still count, or the next grant may repeat one when the counter is ahead of
  -- the clock. Raising the counter to them is all this does; it only ever goes up. Another
  -- owner's lock is left alone, counter included: that grant is made already.
  local used = tonumber(ARGV[3])
  if not current and used and used > 0 then
    local counted = tonumber(redis.pcall('GET', KEYS[2]) or '0')
    if counted and used > counted then
      redis.pcall('SET', KEYS[2], ARGV[3])
    end
  end
  return -1
end
local passTTL = ARGV[5] or '' -- callers older than the pass send four arguments
if passTTL ~= '' and ARGV[4] == '' and string.sub(current, -2) ~= ' ~' then
  local fence, holds, rest = string.match(current, '^%S+ (%d+) (%S+)(.*)$')
  local last = redis.pcall('GET', KEYS[2]) -- a counter of another type: release instead
  local counted = type(last) ~= 'table' and tonumber(last or '0')
  if holds == '1' and counted and counted == counted and counted < 9007199254740992 then
    local now = redis.call('TIME')
    local us = now[2]
    local f = tonumber(now[1] .. string.sub('00000', #us) .. us)
    local floor = math.max(counted, tonumber(fence), tonumber(ARGV[3]))
    if floor >= f then
      f = floor + 1
    end
    f = string.format('%d', f)
    redis.call('SET', KEYS[2], f)
    redis.call('SET', KEYS[1], owner .. ' ' .. f .. ' 1' .. rest, 'PX',
      math.max(redis.call('PTTL', KEYS[1]), tonumber(passTTL)))
    return {3, tonumber(f)}
  end
end
if ARGV[4] == '' and ARGV[3] == '0' then
  -- The common case first: the acquisition's own hold, nothing handed out locally, and a value
  -- of exactly "<owner> <fence> 1" (no re-entry, no metadata, no waiters mark) costs GET and
  -- DEL and no pattern match; it does what the general case below would do with that value.
  local sp = string.find(current, ' ', #owner + 2, true)
  if sp and #current == sp + 1 and string.byte(current, -1) == 49 then -- 49: "1"
    redis.call('DEL', KEYS[1])
    return 0
  end
end
local o, fence, holds, rest = string.match(current, '^(%S+) (%d+) (%S+)(.*)$')
local own, borrows = string.match(holds or '', '^([01])(.*)$')
if not own then
  own, borrows = '1', '' -- a value this script cannot read: one hold, the owner's
end
if ARGV[4] == '' then
  if own == '0' then
    return -1
  end
  own = '0'
else
  local list = borrows .. ','
  local first, last = string.find(list, ',' .. ARGV[4] .. ',', 1, true)
  if not first then
    return -1
  end
  list = string.sub(list, 1, first - 1) .. string.sub(list, last)
  borrows = string.sub(list, 1, -2)
end
local used = tonumber(ARGV[3])
if used > 0 then
  local counted = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if used > counted then
    redis.call('SET', KEYS[2], ARGV[3])
  end
end
if own == '1' or borrows ~= '' then
  redis.call('SET', KEYS[1], o .. ' ' .. fence .. ' ' .. own .. borrows .. rest, 'KEEPTTL')
  return -2
end
redis.call('DEL', KEYS[1])
if string.sub(current, -2) == ' ~' then
  return publish(ARGV[2] .. KEYS[1])
end
return 0
