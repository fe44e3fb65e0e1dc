-- Takes a simple lock and draws its fencing token. Everything that can fail is checked before
-- the first write, so an error never leaves the lock set.
-- KEYS[1]  the lock's key
-- KEYS[2]  the fencing counter (same hash slot as KEYS[1]; expires a day after its last use)
-- ARGV[1]  our token
-- ARGV[2]  the lease, ms
-- Returns  {1, fencing token} acquired; {0, holder's PTTL} held (-1: the holder set no lease)
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a simple lock, or KEYS[2] is not a
--          counter; nothing is written then.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'string' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a simple lock')
end
if kind == 'string' then
    return {0, redis.call('PTTL', KEYS[1])}
end
local last = redis.call('GET', KEYS[2])
if last and (#last > 16 or not string.match(last, '^%d+$')) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' is not a fencing counter')
end
-- Never below the server's clock in microseconds, so tokens keep growing after a FLUSHALL or a
-- restart without persistence (as long as fewer than a million are drawn per second).
local time = redis.call('TIME')
local fence = math.max((tonumber(last) or 0) + 1, tonumber(time[1]) * 1000000 + tonumber(time[2]))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', 86400000)
return {1, fence}
