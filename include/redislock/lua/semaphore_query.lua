-- How many permits of a counting semaphore are free now, and whether one is still held:
-- available_permits() and verify(). Reads only.
-- KEYS[1]  the holders (see semaphore_acquire.lua)
-- KEYS[2]  the count of permits
-- ARGV[1]  (optional) a permit id
-- Returns  {count of permits, or -1 when none is stored yet; live holders; 1 when ARGV[1] names
--          a live permit, else 0}
-- Errors   WRONGTYPE when a key holds another type.
--#include _semaphore.lua
local stored, refused = semaphore_read(KEYS[1], KEYS[2])
if refused then
    return refused
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local mine = ARGV[1] and tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
return {stored or -1, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'),
        (mine and mine > now) and 1 or 0}
