-- Sets a reentrant lock's lease to ARGV[2] ms from now if ARGV[1] still owns it.
-- KEYS[1]  the lock's hash
-- ARGV[1]  the owner id
-- ARGV[2]  the new lease, ms
-- Returns  1 extended; 0 not the owner's (expired, or held by another owner)
if redis.call('TYPE', KEYS[1]).ok == 'hash' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
