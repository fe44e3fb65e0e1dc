-- Sets a reentrant lock's lease to ARGV[2] ms from now if ARGV[1] still holds acquisition ARGV[3],
-- unless the key has more left: another object of the owner may count on that.
-- KEYS[1]  the lock's hash
-- ARGV[1]  the owner id
-- ARGV[2]  the new lease, ms
-- ARGV[3]  the acquisition id
-- Returns  1 extended; 0 not the owner's (expired, held by another owner, or a later acquisition's)
if redis.call('TYPE', KEYS[1]).ok == 'hash' and
    redis.call('HGET', KEYS[1], 'id:' .. ARGV[1]) == ARGV[3] then
    local left = math.min(redis.call('PTTL', KEYS[1]), 1099511627776)
    return redis.call('PEXPIRE', KEYS[1], math.max(left, tonumber(ARGV[2])))
end
return 0
