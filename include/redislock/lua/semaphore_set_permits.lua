-- Sets the count of permits of a counting semaphore for everyone: set_permits(). Held permits
-- are never revoked; a lower count only stops new grants until enough are given back. A higher
-- one tells the waiters that may take the new permits.
-- KEYS[1]  the holders (see semaphore_acquire.lua)
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times
-- KEYS[4]  the count of permits
-- ARGV[1]  the new count
-- ARGV[2]  the release channel
-- ARGV[3]  the grace, ms, a told waiter has to come
-- Returns  the count before, or -1 when none was stored
-- Errors   WRONGTYPE when a key holds another type; ERR when a queue key is not a sorted set or
--          ARGV[1] is not a count; nothing is written then.
local holders, queue, lapses, permits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local count = string.match(ARGV[1] or '', '^%d+$') and #ARGV[1] <= 13 and tonumber(ARGV[1])
if not count or count < 1 or count > 1000000000000 then
    return redis.error_reply('ERR the count of permits is a whole number from 1 to 10^12 ' ..
                             '(ARGV[1])')
end
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
--#include _semaphore.lua
local stored
stored, refused = semaphore_read(holders, permits)
if refused then
    return refused
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('SET', permits, ARGV[1])
local free = count - redis.call('ZCOUNT', holders, '(' .. now, '+inf')
if free > 0 and redis.call('EXISTS', queue) == 1 and queue_prune(queue, lapses, now, ARGV[2]) then
    queue_notify(queue, lapses, ARGV[2], redis.call('ZRANGE', queue, 0, math.min(free, 64) - 1),
                 now, tonumber(ARGV[3]))
end
return stored or -1
