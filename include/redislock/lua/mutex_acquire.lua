-- Takes a simple lock, respecting the waiting queue, and draws its fencing token if asked.
-- Everything that can fail is checked before the first write, so an error never leaves anything
-- written. A key holding 'queued:<id>' is the lock kept free for waiter <id>, told it may go; one
-- holding the token of waiter 'g<token>.<lease>' was handed to it, and its attempt takes it.
-- KEYS[1]  the lock's key
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua; same hash slot)
-- KEYS[4]  the fencing counter (same slot; expires a day after its last use), declared only when
--          ARGV[3] is '1': no other call touches it
-- ARGV[1]  our token
-- ARGV[2]  the lease, ms
-- ARGV[3]  '1' to draw a fencing token
-- ARGV[4]  the waiter id of this lock() call
-- ARGV[5]  '0' for a try that does not wait; else ms an entry in the queue outlives the wait
--          this reply asks for (the waiter comes back by then)
-- ARGV[6]  the release channel; ARGV[7] the grace, ms, a told waiter has to come: a free lock
--          the queue keeps from this attempt, because another waiter heads it, is handed to that
--          head as a release would hand it on (see queue_hand_on in _queue.lua), so a head that
--          does not come (one that moved up when the entry before it lapsed may have died long
--          ago) holds it for the grace only
-- Every key touched is declared, though the queue's often do not exist: while their slot
-- migrates, Redis Cluster answers TRYAGAIN to a call whose keys are partly there (the call did
-- not run), and the caller tries again within its deadline.
-- Returns  {1, fencing token or 0} acquired; {0, ms} not acquired: wait at most ms for a
--          message before trying again (-1: the holder set no lease)
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a simple lock, or KEYS[4] is not a
--          counter; ERR when a queue key is not a sorted set, or ARGV[6] or ARGV[7] is missing;
--          nothing is written then. Any other refusal to read KEYS[1] (an ACL) as the server gave
--          it.
local queue, lapses = KEYS[2], KEYS[3]
local channel, grace = ARGV[6], tonumber(ARGV[7])
if ARGV[3] == '1' and not KEYS[4] then
    return redis.error_reply('ERR a fenced acquisition declares its fencing counter as KEYS[4]')
end
if not channel or not grace or grace < 1 then
    return redis.error_reply('ERR an acquisition names the release channel and the grace ' ..
                             '(ARGV[6], ARGV[7])')
end
-- The common case first: no fencing token asked for, nobody waits, the key is free. SET NX
-- writes nothing when the key exists, whatever its type; a refused write (out of memory, a
-- replica) is caught: either way the full checks below then run and give the answer.
local queued = redis.call('EXISTS', queue) == 1
if ARGV[3] ~= '1' and not queued then
    local set = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
    if type(set) == 'table' and set.ok then
        return {1, 0}
    end
end
-- Only now are the queue's helpers defined (a script's functions are made anew on every run).
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' then
    if string.find(holder.err or '', '^WRONGTYPE') then
        return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a simple lock')
    end
    return holder
end
local last = ARGV[3] == '1' and redis.call('GET', KEYS[4])
if last and (#last > 16 or not string.match(last, '^%d+$')) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[4] .. ' is not a fencing counter')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local id = ARGV[4]
-- Lapsed waiters matter only when the lock may be free for this one (see queue_prune). A prune
-- that empties the queue leaves no queue to respect (its keys are gone, not to be touched again).
local free = queued and (not holder or holder == 'queued:' .. id)
if free then
    queued = queue_prune(queue, lapses, now, channel)
    free = queued
end
if holder == ARGV[1] then
    -- This very attempt, sent again after its reply was lost: it acquired.
    if queued then
        queue_leave(queue, lapses, id)
    end
    return {1, ARGV[3] == '1' and tonumber(last) or 0}
end
-- Handed to this waiter already (its message late or lost), or kept free for it, or free.
if (holder and holder == string.match(id, '^g(%x+)%.')) or
    ((not holder or holder == 'queued:' .. id) and (not queued or queue_allows(queue, id))) then
    -- Never below the server's clock in microseconds, so tokens keep growing after a FLUSHALL
    -- or a restart without persistence (as long as fewer than a million are drawn per second).
    local fence = 0
    if ARGV[3] == '1' then
        fence = math.max((tonumber(last) or 0) + 1, tonumber(time[1]) * 1000000 + tonumber(time[2]))
        redis.call('SET', KEYS[4], string.format('%d', fence), 'PX', 86400000)
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    if queued then
        queue_leave(queue, lapses, id)
    end
    return {1, fence}
end
-- Free, but another waiter heads the queue. One whose entry lapses within the grace was told
-- its turn already, or soon lapses: this one waits for that. Any other is handed the lock as a
-- release would hand it on (told, its entry lapsing with the grace).
local wait
if free then
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    wait = (tonumber(redis.call('ZSCORE', lapses, head)) or now + grace) - now
    if wait > grace then
        -- Its own prune finds nothing more to remove (this one just ran, at the same time): the
        -- queue is kept, and the key set for the head.
        queue_hand_on(KEYS[1], queue, lapses, channel, now, grace)
        wait = redis.call('PTTL', KEYS[1])
    end
else
    wait = redis.call('PTTL', KEYS[1])
end
-- At most 2^40 ms, the longest lease: a longer TTL is no lock's (it may be centuries), and the
-- cap keeps every number an exact integer here, in the queue's commands and in the waiter's
-- clock arithmetic. A waiter told that much asks again then.
wait = math.min(wait, 1099511627776)
if ARGV[5] ~= '0' then
    queue_join(queue, lapses, id, now, tonumber(time[1]) * 1000000 + tonumber(time[2]),
               math.max(wait, 0) + tonumber(ARGV[5]))
end
return {0, wait}
