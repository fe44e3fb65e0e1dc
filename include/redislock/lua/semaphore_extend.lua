-- Sets the lease of one permit of a counting semaphore to ARGV[2] ms from now if it is still
-- ours (the watchdog's renewal and extend()).
-- KEYS[1]  the holders (see semaphore_acquire.lua)
-- ARGV[1]  our permit id
-- ARGV[2]  the new lease, ms
-- Returns  1 extended; 0 not ours (its lease ended, or it was never granted)
-- Errors   WRONGTYPE when KEYS[1] holds another type; nothing is written then.
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if not ends or tonumber(ends) <= now then
    return 0
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
if redis.call('PTTL', KEYS[1]) < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
