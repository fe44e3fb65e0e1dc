-- After a failed SET NX: how long the holder keeps a simple lock.
-- KEYS[1]  the lock's key
-- Returns  the holder's PTTL in ms; -1 the holder set no lease; -2 free again
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a simple lock
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'string' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a simple lock')
end
return redis.call('PTTL', KEYS[1])
