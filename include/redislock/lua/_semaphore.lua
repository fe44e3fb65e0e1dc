-- What every semaphore script reads first (see semaphore_acquire.lua): the holders, a sorted set
-- or nothing, and the count of permits, at most 13 digits or nothing. Reads only.
-- Returns the stored count (false when none is stored) and nil; or nil and the error reply for
-- a key of another type or a count that is not a whole number.
local function semaphore_read(holders, permits)
    local kind = redis.call('TYPE', holders).ok
    if kind ~= 'none' and kind ~= 'zset' then
        return nil,
               redis.error_reply('WRONGTYPE ' .. holders .. ' holds a key that is not a semaphore')
    end
    local stored = redis.pcall('GET', permits)
    if type(stored) == 'table' or (stored and (#stored > 13 or not string.match(stored, '^%d+$'))) then
        return nil, redis.error_reply('WRONGTYPE ' .. permits .. ' is not a count of permits')
    end
    return stored and tonumber(stored), nil
end
