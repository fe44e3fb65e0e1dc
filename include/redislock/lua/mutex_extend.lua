-- Sets a simple lock's lease to ARGV[2] ms from now if it still holds our token.
-- KEYS[1]  the lock's key
-- ARGV[1]  our token
-- ARGV[2]  the new lease, ms
-- Returns  1 extended; 0 not ours (expired, or now held by someone else)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
