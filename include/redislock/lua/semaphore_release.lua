-- Gives back one permit of a counting semaphore if it is still ours. When someone waits and
-- permits are free, the waiters that may take them are told (see queue_notify in _queue.lua).
-- Every check comes before the first write.
-- KEYS[1]  the holders (see semaphore_acquire.lua)
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times
-- KEYS[4]  the count of permits
-- ARGV[1]  our permit id
-- ARGV[2]  the release channel
-- ARGV[3]  the grace, ms, a told waiter has to come
-- ARGV[4]  the count of permits to assume when none is stored (lost: evicted, or a failover)
-- Returns  1 released, no one told; 2 released and waiters told; 0 not ours (its lease ended,
--          or it was never granted): an entry left past its lease is removed all the same
-- Errors   WRONGTYPE when a key holds another type; ERR when a queue key is not a sorted set;
--          nothing is written then.
local holders, queue, lapses, permits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
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
local ends = tonumber(redis.call('ZSCORE', holders, ARGV[1]))
if not ends then
    return 0
end
-- Read before the removal, which may remove the key (not to be touched again then).
local live = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
redis.call('ZREM', holders, ARGV[1])
if ends <= now then
    return 0
end
live = live - 1
if redis.call('EXISTS', queue) == 0 or not queue_prune(queue, lapses, now, ARGV[2]) then
    return 1
end
local free = (stored or tonumber(ARGV[4]) or 1) - live
if free < 1 then
    return 1
end
local run = redis.call('ZRANGE', queue, 0, math.min(free, 64) - 1)
queue_notify(queue, lapses, ARGV[2], run, now, tonumber(ARGV[3]))
return 2
