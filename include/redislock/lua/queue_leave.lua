-- Takes a waiter that gives up out of the queue. If the lock was kept free for it or handed to
-- it, or it stood before others that may go now, the next waiters are told (or handed the lock,
-- see queue_hand_on and queue_hand_on_entry in _queue.lua).
-- KEYS[1]  the lock's key
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua and mutex_acquire.lua)
-- ARGV[1]  the waiter id
-- ARGV[2]  the release channel
-- ARGV[3]  the grace, ms, a told waiter has to come
-- ARGV[4]  'm' for a simple lock (then kept free for the next head), '' for the other kinds,
--          'k' for a reentrant waiter that counted the entry handed to it (and gave it back
--          itself): the entry is then not taken back; 's' for a semaphore: KEYS[1] is its
--          holders (see semaphore_acquire.lua), KEYS[4] its count of permits, and ARGV[5] the
--          count to assume when none is stored: the waiters that may take the free permits are
--          told
-- KEYS[4]  (semaphore only) the count of permits
-- Returns  1 left and waiters told; 0 left
-- Errors   ERR when a queue key is not a sorted set; nothing is written then.
--#include _queue.lua
local queue, lapses = KEYS[2], KEYS[3]
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
-- Whether anyone is left: once the queue is gone its keys are not touched again (see _queue.lua),
-- and a lock kept for this waiter is simply freed.
local kind = redis.call('TYPE', KEYS[1]).ok
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if ARGV[4] == 's' then
    if kind ~= 'none' and kind ~= 'zset' then
        return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a semaphore')
    end
    local stored = redis.pcall('GET', KEYS[4])
    stored = type(stored) == 'string' and #stored <= 13 and string.match(stored, '^%d+$') and
                 tonumber(stored)
    local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
    if not queue_leave(queue, lapses, ARGV[1]) or not queue_prune(queue, lapses, now, ARGV[2]) then
        return 0
    end
    local free = (stored or tonumber(ARGV[5]) or 1) - live
    if free < 1 then
        return 0
    end
    queue_notify(queue, lapses, ARGV[2], redis.call('ZRANGE', queue, 0, math.min(free, 64) - 1),
                 now, tonumber(ARGV[3]))
    return 1
end
local waiting = queue_leave(queue, lapses, ARGV[1])
if kind == 'string' then
    local holder = redis.call('GET', KEYS[1])
    if holder == 'queued:' .. ARGV[1] or holder == string.match(ARGV[1], '^g(%x+)%.') then
        if not waiting then
            redis.call('DEL', KEYS[1])
            return 0
        end
        return queue_hand_on(KEYS[1], queue, lapses, ARGV[2], now, tonumber(ARGV[3])) and 1 or 0
    end
end
-- A reentrant lock handed to this waiter and claimed by none of its attempts: the entry the
-- release made for it goes, and with it the mark, so the leave sent again changes nothing. Once
-- an attempt claimed it (its id in firsts:<owner>), that attempt's id names the entry, and only
-- it leaves it (recursive_acquire.lua): never both.
local acquisition, owner = string.match(ARGV[1], '^h(%x+)%.%d+%.([^@]+)')
if kind == 'hash' and acquisition and ARGV[4] ~= 'k' and
    redis.call('HGET', KEYS[1], 'handed:' .. owner) == acquisition and
    redis.call('HEXISTS', KEYS[1], 'firsts:' .. owner) == 0 then
    redis.call('HDEL', KEYS[1], 'handed:' .. owner)
    if redis.call('HINCRBY', KEYS[1], owner, -1) > 0 then
        return 0
    end
    if not waiting then
        redis.call('DEL', KEYS[1])
        return 0
    end
    return queue_hand_on_entry(KEYS[1], queue, lapses, ARGV[2], now, tonumber(ARGV[3])) and 1 or 0
end
-- Held by a writer (or a simple or reentrant holder): its release tells the queue. No one left
-- to tell: done.
if not waiting or
    (kind ~= 'none' and (kind ~= 'hash' or redis.call('HGET', KEYS[1], 'mode') ~= 'read')) then
    return 0
end
-- A free lock goes to the head, as a release would hand it on: a simple lock is kept for it;
-- a lock of another kind is kept for an 'h' head as an entry of its owner, others are told they
-- may go.
if kind == 'none' and ARGV[4] == 'm' then
    return queue_hand_on(KEYS[1], queue, lapses, ARGV[2], now, tonumber(ARGV[3])) and 1 or 0
elseif kind == 'none' then
    return queue_hand_on_entry(KEYS[1], queue, lapses, ARGV[2], now, tonumber(ARGV[3])) and 1 or 0
end
-- Read-held: only readers may join now.
if not queue_prune(queue, lapses, now, ARGV[2]) then
    return 0
end
local run = queue_runners(queue)
if string.sub(run[1] or 'w', 1, 1) ~= 'r' then
    return 0
end
queue_notify(queue, lapses, ARGV[2], run, now, tonumber(ARGV[3]))
return 1
