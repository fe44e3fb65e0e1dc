-- How many permits of a counting semaphore are free now: available_permits(). Reads only.
-- KEYS[1]  the holders (see semaphore_acquire.lua)
-- KEYS[2]  the count of permits
-- Returns  {count of permits, or -1 when none is stored yet; live holders}
-- Errors   WRONGTYPE when a key holds another type.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and kind ~= 'zset' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a semaphore')
end
local stored = redis.pcall('GET', KEYS[2])
if type(stored) == 'table' or (stored and (#stored > 13 or not string.match(stored, '^%d+$'))) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' is not a count of permits')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return {tonumber(stored) or -1, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')}
