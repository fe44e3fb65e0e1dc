-- Deletes a key if it still holds our token: a Redlock master's release, the same as
-- node-redlock's and redsync's (Redlock waiters poll; no one is told).
-- KEYS[1]  the lock's key
-- ARGV[1]  our token
-- Returns  1 deleted; 0 not ours (expired, or held by someone else)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
