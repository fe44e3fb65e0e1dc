-- Releases a simple lock if it still holds our token. When someone waits, the lock goes to the
-- head of the queue (see queue_hand_on in _queue.lua) and the head is told. Every check comes
-- before the first write, DEL or PEXPIRE: Redis allows both when out of memory, and once a
-- script has written, the rest of it may write too.
-- KEYS[1]  the lock's key
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua and mutex_acquire.lua)
-- ARGV[1]  our token
-- ARGV[2]  the release channel
-- ARGV[3]  the grace, ms, a told waiter has to come
-- Returns  1 released, no one waits; 2 released and a waiter told; 0 not ours (expired, or now
--          held by someone else)
-- Errors   ERR when a queue key is not a sorted set; nothing is written then.
local queue, lapses = KEYS[2], KEYS[3]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
if redis.call('EXISTS', queue) == 0 then
    redis.call('DEL', KEYS[1])
    return 1
end
-- A queue exists: only now are its helpers defined (a script's functions are made anew
-- on every run, which the common case above need not pay for).
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return queue_hand_on(KEYS[1], queue, lapses, ARGV[2], now, tonumber(ARGV[3])) and 2 or 1
