-- Enters a read-write lock for reading ('r') or writing ('w'), in the order of the waiting
-- queue: a writer goes when no one holds and it heads the queue; a reader when no writer holds
-- and no writer waits before it (so neither readers nor writers starve).
-- Hash fields: mode = 'read' | 'write' | 'free' (marks the hash as a read-write lock);
--   r:<owner>, w:<owner> = '<count> <expiry ms> <acquisition id>', each holder with its own
--   lease in server time; fence. Books beside them: firsts:r:<owner>, firsts:w:<owner>, the
--   attempts whose first entries the entry's count holds (the creator's, and those that joined
--   it through another object of the owner), newest first, the last 32, gone with the entry: an
--   attempt that lands again counts nothing more, and one the client gave up leaves its entry
--   once (its id is taken out); left:<owner>, the owner's last releases that left entries in
--   place (see shared_release.lua).
-- KEYS[1]  the lock's hash
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua and mutex_acquire.lua)
-- KEYS[4]  the fencing counter (same hash slot; expires a day after its last use), declared only
--          for a writer that draws a fencing token (ARGV[2] 'w', ARGV[4] '1'): no other call
--          touches it
-- ARGV[1]  the owner id
-- ARGV[2]  'r' or 'w'
-- ARGV[3]  the lease, ms
-- ARGV[4]  '1' to draw a fencing token (writers)
-- ARGV[5]  the waiter id of this lock() call: 'r...' for a reader, 'w...' for a writer
-- ARGV[6]  this attempt's id (each attempt draws its own), and the id of the acquisition it
--          makes, if it makes one
-- ARGV[7]  '1' when the calling object holds no entry in this mode (a first entry): one this
--          attempt made already (it was sent again after a lost reply) is then this call's as
--          it is
-- ARGV[8]  what the owner left unsettled, separated by spaces, or '': '<id>/<count>/<release id>'
--          a release of <count> entries of acquisition <id> whose reply was lost, left now unless
--          it landed (see ARGV[7] of shared_release.lua); an attempt id alone, an attempt the
--          client gave up, whose first entry is left if it is still counted (firsts:), once
-- ARGV[9]  '0' for a try that does not wait; else ms an entry in the queue outlives the wait
--          this reply asks for
-- ARGV[10] the release channel; ARGV[11] the grace, ms, a told waiter has to come: when no one
--          holds but the queue keeps the lock from this attempt, the waiters it lets go are told,
--          as a release would tell them, each with the grace to come
-- Returns  {1, fence, id} entered; {2, fence, id} re-entered (the first entry's id);
--          {0, ms, ''} must wait: at most ms for a message before trying again;
--          {-1, 0, ''} refused: a reader asking for the write lock would deadlock
-- Errors   WRONGTYPE when KEYS[1] is not a read-write lock or KEYS[4] not a fencing counter; ERR
--          when a queue key is not a sorted set, or ARGV[10] or ARGV[11] is missing; nothing is
--          written then.
local queue, lapses = KEYS[2], KEYS[3]
local me, want, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local channel, grace = ARGV[10], tonumber(ARGV[11])
local fenced = want == 'w' and ARGV[4] == '1'
if fenced and not KEYS[4] then
    return redis.error_reply('ERR a fenced acquisition declares its fencing counter as KEYS[4]')
end
if not channel or not grace or grace < 1 then
    return redis.error_reply('ERR an acquisition names the release channel and the grace ' ..
                             '(ARGV[10], ARGV[11])')
end
local last_fence = fenced and redis.call('GET', KEYS[4])
if last_fence and (#last_fence > 16 or not string.match(last_fence, '^%d+$')) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[4] .. ' is not a fencing counter')
end

-- Draws a fencing token, never below the server's clock in microseconds, so tokens keep growing
-- after a FLUSHALL or a restart without persistence.
local function draw_fence(time)
    local fence = math.max((tonumber(last_fence) or 0) + 1,
                           tonumber(time[1]) * 1000000 + tonumber(time[2]))
    redis.call('SET', KEYS[4], string.format('%d', fence), 'PX', 86400000)
    redis.call('HSET', KEYS[1], 'fence', string.format('%d', fence))
    return fence
end

if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', queue) == 0 then
    -- Free, and no one waits: enter at once.
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local fence = fenced and draw_fence(time) or 0
    redis.call('HSET', KEYS[1], want .. ':' .. me, '1 ' .. (now + lease) .. ' ' .. ARGV[6],
               'firsts:' .. want .. ':' .. me, ARGV[6], 'mode', want == 'w' and 'write' or 'read')
    redis.call('PEXPIRE', KEYS[1], lease)
    return {1, fence, ARGV[6]}
end
-- Held, or a queue exists: only now are its helpers defined (see mutex_release.lua).
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
local kind = redis.call('TYPE', KEYS[1]).ok
local unsettled, gone = {}, {}
for item in string.gmatch(ARGV[8] or '', '%S+') do
    local id, count, release = string.match(item, '^([^/]+)/(%d+)/(%S+)$')
    if id then
        unsettled[id] = unsettled[id] or {}
        table.insert(unsettled[id], {tonumber(count), release})
    elseif not string.find(item, '/', 1, true) then
        gone[#gone + 1] = item
    end
end
if kind ~= 'none' and (kind ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'mode') == 0) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a read-write lock')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Releases of ours that landed: see shared_release.lua.
local landed, settled = {}, {}
for release in string.gmatch(redis.call('HGET', KEYS[1], 'left:' .. me) or '', '%S+') do
    landed[release] = true
    settled[#settled + 1] = release
end
local kept = #settled
-- Our first entries in each mode, by id (firsts:), in order.
local firsts, counted = {}, {}
local books = redis.call('HMGET', KEYS[1], 'firsts:r:' .. me, 'firsts:w:' .. me)
for i, tag in ipairs({'r', 'w'}) do
    firsts[tag], counted[tag] = {}, {}
    for first in string.gmatch(books[i] or '', '%S+') do
        firsts[tag][#firsts[tag] + 1] = first
        counted[tag][first] = true
    end
end
-- Writes the first entries still counted in mode `tag`, with `newest` first if given.
local function write_firsts(tag, newest)
    local list = {newest}
    for _, first in ipairs(firsts[tag]) do
        if counted[tag][first] and first ~= newest then
            list[#list + 1] = first
        end
    end
    if #list > 0 then
        redis.call('HSET', KEYS[1], 'firsts:' .. tag .. ':' .. me,
                   table.concat(list, ' ', 1, math.min(#list, 32)))
    elseif #firsts[tag] > 0 then
        redis.call('HDEL', KEYS[1], 'firsts:' .. tag .. ':' .. me)
    end
end

-- Drop expired entries and settle ours; note ours (count, id, expiry), and who else holds or
-- waits.
local mine, ids, ends, others, latest, longest = {}, {}, {}, {}, now, 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
    local tag, owner = string.sub(fields[i], 1, 1), string.sub(fields[i], 3)
    local count, expiry, id = string.match(fields[i + 1], '^(%d+) (%d+) ?(%S*)$')
    if string.sub(fields[i], 2, 2) == ':' and expiry then
        -- At most the longest lease (2^40 ms) from now: a later one is no lock's, and the cap
        -- keeps every number an exact integer here and in the waiter's clock arithmetic.
        expiry = math.min(tonumber(expiry), now + 1099511627776)
        count = tonumber(count)
        local left_firsts = false
        if owner == me and (tag == 'r' or tag == 'w') then
            for _, release in ipairs(unsettled[id] or {}) do
                if not landed[release[2]] then
                    landed[release[2]] = true
                    table.insert(settled, 1, release[2])
                    count = count - release[1]
                end
            end
            for _, attempt in ipairs(gone) do
                if counted[tag][attempt] then
                    counted[tag][attempt] = nil  -- named twice, left once
                    left_firsts = true
                    count = count - 1
                end
            end
        end
        if expiry <= now or count <= 0 then
            redis.call('HDEL', KEYS[1], fields[i])
            if owner == me and firsts[tag] and #firsts[tag] > 0 then
                redis.call('HDEL', KEYS[1], 'firsts:' .. tag .. ':' .. me)
                firsts[tag], counted[tag] = {}, {}
            end
        else
            if count < tonumber(string.match(fields[i + 1], '^%d+')) then
                redis.call('HSET', KEYS[1], fields[i], count .. ' ' .. expiry .. ' ' .. id)
            end
            if left_firsts then
                write_firsts(tag)
            end
            latest = math.max(latest, expiry)
            if owner == me then
                mine[tag], ids[tag], ends[tag] = count, id, expiry
            else
                others[tag] = true
                longest = math.max(longest, expiry - now)
            end
        end
    end
end
if not (mine.r or mine.w) then
    -- No entry of ours left for a release sent again to find: the ids go too.
    if kept > 0 then
        redis.call('HDEL', KEYS[1], 'left:' .. me)
    end
elseif #settled > kept then
    redis.call('HSET', KEYS[1], 'left:' .. me,
               table.concat(settled, ' ', 1, math.min(#settled, 32)))
end

-- This attempt's first entry is counted already (it landed before, its reply lost): this call's
-- as it is, whoever queued since; the creator's is a new acquisition, a join's a re-entry.
local again = mine[want] and ARGV[7] == '1' and counted[want][ARGV[6]]
local result
local id = ids[want] or ARGV[6]
if want == 'w' and mine.r and not mine.w then
    return {-1, 0, ''}
elseif mine[want] then
    result = {again and id == ARGV[6] and 1 or 2,
              tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0, id}
end
-- Kept out by the holders, whatever the queue says: a waiter then joins before the queue is
-- pruned, so that a prune that empties it never leaves the join writing keys it removed (see
-- _queue.lua).
local ticket, join = tonumber(time[1]) * 1000000 + tonumber(time[2]), ARGV[9] ~= '0'
local blocked = not result and (others.w or (want == 'w' and others.r))
local queued = redis.call('EXISTS', queue) == 1
if blocked and join then
    queue_join(queue, lapses, ARGV[5], now, ticket, longest + tonumber(ARGV[9]))
    queued = true
end
if queued then
    queued = queue_prune(queue, lapses, now, channel)
end
if blocked or (not result and
               not (want == 'r' and mine.w or not queued or queue_allows(queue, ARGV[5]))) then
    if latest > now then
        redis.call('PEXPIRE', KEYS[1], latest - now)
    elseif kind ~= 'none' then
        redis.call('DEL', KEYS[1])
    end
    if not (others.w or others.r) then
        -- No one holds, but others wait before us. A head whose entry lapses within the grace
        -- was told its turn already, or soon lapses: wait for that. Else the ones the queue lets
        -- go are told, as a release would tell them, their entries lapsing with the grace: a
        -- head that does not come (one that moved up when the entry before it lapsed may have
        -- died long ago) then holds the lock up for the grace only.
        local run = queue_runners(queue)
        longest = (tonumber(redis.call('ZSCORE', lapses, run[1])) or now + grace) - now
        if longest > grace then
            queue_notify(queue, lapses, channel, run, now, grace)
            longest = grace
        end
    end
    if join and not blocked then
        queue_join(queue, lapses, ARGV[5], now, ticket, longest + tonumber(ARGV[9]))
    end
    return {0, longest, ''}
elseif not result then
    local fence = 0
    if queued then
        queue_leave(queue, lapses, ARGV[5])
    end
    if fenced then
        fence = draw_fence(time)
    end
    result = {1, fence, id}
end
-- An entry we keep keeps its expiry if that is later: every object of the owner that entered it
-- counts on its own lease, and none may lose it to a shorter one.
local count = (mine[want] or 0) + (again and 0 or 1)
if not mine[want] then
    firsts[want] = {}  -- a new entry: its books start with it
    write_firsts(want, ARGV[6])
elseif ARGV[7] == '1' and not again then
    write_firsts(want, ARGV[6])
end
redis.call('HSET', KEYS[1], want .. ':' .. me,
           count .. ' ' .. math.max(ends[want] or 0, now + lease) .. ' ' .. id,
           'mode', (want == 'w' or mine.w) and 'write' or 'read')
redis.call('PEXPIRE', KEYS[1], math.max(latest, now + lease) - now)
return result
