-- publish.lua: not a script of its own; script() puts it before the scripts that wake waiters
-- (release, readrelease, leavequeue, forcerelease).
--
-- publish wakes the waiters of the channel and returns how many subscribers heard it, 0 when
-- Redis refuses the PUBLISH (a user without the channel's permission, ACL NOPERM: Redis 7 gives
-- a new user none). The write before it stands, as Redis never undoes a script's writes, so the
-- refusal must not fail the script: its caller would take a done release for a failed one. Waiters
-- that hear nothing look again after their retry delay.
local function publish(channel)
  local n = redis.pcall('PUBLISH', channel, '1')
  if type(n) ~= 'number' then -- {err = ...}
    return 0
  end
  return n
end

