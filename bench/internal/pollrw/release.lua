-- release.lua: give a naive read-write lock's write mark back, if the caller still holds it.
--
-- KEYS[1]  the write mark: a string holding its owner's token
-- ARGV[1]  the owner's token
--
-- Replies 1 when the mark was the owner's and is gone, 0 when it was not (expired, or another
-- owner's), so that a writer whose mark ran out never deletes the next writer's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
