-- Takes a simple lock and draws its fencing token from a counter that only grows.
-- KEYS[1]  the lock's key
-- KEYS[2]  the fencing counter (same hash slot as KEYS[1]; never expires)
-- ARGV[1]  our token
-- ARGV[2]  the lease, ms
-- Returns  {1, fencing token} acquired; {0, holder's PTTL} held (-1: the holder set no lease)
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a simple lock
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a simple lock')
end
return {0, redis.call('PTTL', KEYS[1])}
