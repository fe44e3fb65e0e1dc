-- Releases a simple lock if it still holds our token, and tells waiters it is free.
-- KEYS[1]  the lock's key
-- ARGV[1]  our token
-- ARGV[2]  the release channel
-- Returns  1 released; 0 not ours (expired, or now held by someone else)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], KEYS[1])
    return 1
end
return 0
