-- transfer.lua: move an amount between two account balances, both writes fenced.
--
-- KEYS[1]  hash of the account debited: fields "balance" and "lock_fence" (fenced.FieldFence)
-- KEYS[2]  hash of the account credited: fields "balance" and "lock_fence" (fenced.FieldFence)
--          (both keys carry the hash tag {acct}, so they share a cluster slot)
-- ARGV[1]  amount, a positive integer
-- ARGV[2]  fence of the writer's lease on KEYS[1]
-- ARGV[3]  fence of the writer's lease on KEYS[2]
--
-- Replies (a three-element array):
--   {1, from, to}   applied: the new balances; each account's fence is now its ARGV fence
--   {0, i, fence}   stale: KEYS[i] was written with the larger fence `fence`; nothing changed
--   {-1, from, 0}   insufficient: KEYS[1] holds only `from`; nothing changed
--   {-2, i, 0}      unknown account KEYS[i]; nothing changed
local balances = {}
for i = 1, 2 do
  local balance = redis.call('HGET', KEYS[i], 'balance')
  if not balance then
    return {-2, i, 0}
  end
  local stored = tonumber(redis.call('HGET', KEYS[i], 'lock_fence') or '0')
  if tonumber(ARGV[i + 1]) < stored then
    return {0, i, stored}
  end
  balances[i] = tonumber(balance)
end
local amount = tonumber(ARGV[1])
if balances[1] < amount then
  return {-1, balances[1], 0}
end
local from = balances[1] - amount
local to = balances[2] + amount
redis.call('HSET', KEYS[1], 'balance', string.format('%d', from), 'lock_fence', ARGV[2])
redis.call('HSET', KEYS[2], 'balance', string.format('%d', to), 'lock_fence', ARGV[3])
return {1, from, to}
