-- Takes one permit of a counting semaphore, respecting the waiting queue, and draws its fencing
-- token if asked. The holders are a sorted set of permit ids scored by when each lease ends
-- (server ms); the count of permits is a string beside it, written once from ARGV[8] when none
-- exists and kept (no expiry) until set_permits changes it. Everything that can fail is
-- checked before the first write, so an error never leaves anything written.
-- KEYS[1]  the holders (sorted set: permit id -> end of its lease, ms)
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua; same hash slot)
-- KEYS[4]  the count of permits
-- KEYS[5]  the fencing counter, declared only when ARGV[3] is '1'
-- ARGV[1]  our permit id
-- ARGV[2]  the lease, ms
-- ARGV[3]  '1' to draw a fencing token
-- ARGV[4]  the waiter id of this acquire() call
-- ARGV[5]  '0' for a try that does not wait; else ms an entry in the queue outlives the wait
--          this reply asks for
-- ARGV[6]  the release channel; ARGV[7] the grace, ms, a told waiter has to come
-- ARGV[8]  the count of permits to write when none exists (1 to 10^12: every count here stays
--          an exact integer, and Redis writes it back as digits)
-- Returns  {1, fencing token or 0, count} acquired (also when this very attempt, sent again
--          after its reply was lost, had acquired: a fenced one then draws a new token, as the
--          first was never seen); {0, ms, count} not acquired: wait at most ms for a message
-- Errors   WRONGTYPE when a key holds another type, or the count or counter is not a number;
--          ERR when a queue key is not a sorted set or an argument is missing; nothing is
--          written then.
local holders, queue, lapses, permits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local channel, grace = ARGV[6], tonumber(ARGV[7])
local wanted = string.match(ARGV[8] or '', '^%d+$') and #ARGV[8] <= 13 and tonumber(ARGV[8])
if wanted and wanted > 1000000000000 then
    wanted = nil
end
if ARGV[3] == '1' and not KEYS[5] then
    return redis.error_reply('ERR a fenced acquisition declares its fencing counter as KEYS[5]')
end
if not channel or not grace or grace < 1 or not wanted or wanted < 1 then
    return redis.error_reply('ERR an acquisition names the release channel, the grace and ' ..
                             'the count of permits (ARGV[6] to ARGV[8])')
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
local last = ARGV[3] == '1' and redis.call('GET', KEYS[5])
-- At most 2^53 - 1: above it a token would not grow by one.
if last and (#last > 16 or not string.match(last, '^%d+$') or
    tonumber(last) > 9007199254740990) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[5] .. ' is not a fencing counter')
end
local count = stored or wanted
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease = tonumber(ARGV[2])
local id = ARGV[4]
-- Live holders only: a permit whose lease ended is free again, its entry removed below.
local live = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
local mine = redis.call('ZSCORE', holders, ARGV[1])
local resent = mine and tonumber(mine) > now
local queued = redis.call('EXISTS', queue) == 1
local free = count - live
if queued and free > 0 then
    queued = queue_prune(queue, lapses, now, channel)
end
-- Tells the first k waiters (at most 64) they may go, when one of them was not told since a
-- permit came free (its entry lapses later than the grace): one told waiter that did not come
-- makes way for the next only through its standby, so a grant or an attempt that finds permits
-- free for those ahead of it tells them again.
local function tell_first(k)
    local run = redis.call('ZRANGE', queue, 0, math.min(k, 64) - 1)
    for _, ahead in ipairs(run) do
        if (tonumber(redis.call('ZSCORE', lapses, ahead)) or now) > now + grace then
            queue_notify(queue, lapses, channel, run, now, grace)
            return
        end
    end
end
-- The queue lets this waiter go when it stands among the first `free` entries, or, not in it,
-- when fewer than `free` wait.
local allowed = resent or (free > 0 and (not queued or
    (redis.call('ZRANK', queue, id) or redis.call('ZCARD', queue)) < free))
if allowed then
    local fence = 0
    if ARGV[3] == '1' then
        fence = math.max((tonumber(last) or 0) + 1, tonumber(time[1]) * 1000000 + tonumber(time[2]))
        redis.call('SET', KEYS[5], string.format('%d', fence), 'PX', 86400000)
    end
    if not stored then
        redis.call('SET', permits, ARGV[8])
    end
    -- Added before the lapsed entries go, so the key is never removed and then touched (see
    -- _queue.lua).
    redis.call('ZADD', holders, now + lease, ARGV[1])
    if live + 1 < redis.call('ZCARD', holders) then
        redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
    end
    if redis.call('PTTL', holders) < lease then
        redis.call('PEXPIRE', holders, lease)
    end
    local left = resent and free or free - 1
    if queued and queue_leave(queue, lapses, id) and left > 0 then
        tell_first(left)
    end
    return {1, fence, count}
end
-- Not this waiter's turn. Permits free for waiters ahead of it: those are told (tell_first),
-- and this one waits for their grace at most. Else the wait is until the first lease ends.
local wait
if free > 0 and queued then
    tell_first(free)
    wait = grace
else
    local first = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES',
                             'LIMIT', 0, 1)
    wait = first[2] and math.max(tonumber(first[2]) - now, 1) or grace
end
wait = math.min(wait, 1099511627776)
if ARGV[5] ~= '0' then
    queue_join(queue, lapses, id, now, tonumber(time[1]) * 1000000 + tonumber(time[2]),
               wait + tonumber(ARGV[5]))
end
return {0, wait, count}
