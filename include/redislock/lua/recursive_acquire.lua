-- Enters a reentrant lock: a hash whose field <owner> counts that owner's entries, and whose
-- field id:<owner> names the acquisition those entries belong to. Books beside them:
-- firsts:<owner> the attempts whose first entries the count holds (the one that made or claimed
-- the acquisition, marked '=<id>', and those that joined it through another object of the
-- owner), newest first, the last 32: an attempt that lands again counts nothing more, and one
-- the client gave up leaves its entry once (its id is taken out); handed:<owner> marks an entry
-- a release handed to a waiter (_queue.lua); gone:<owner> the attempts the client gave up
-- (ARGV[6]); left:<owner> the owner's last releases that left entries in place
-- (recursive_release.lua).
-- KEYS[1]  the lock's hash
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua and mutex_acquire.lua)
-- KEYS[4]  the fencing counter (same hash slot; expires a day after its last use), declared only
--          when ARGV[3] is '1': no other call touches it
-- ARGV[1]  the owner id
-- ARGV[2]  the lease, ms (set again on every entry, unless the key has more left: another
--          object of the owner may count on that)
-- ARGV[3]  '1' to draw a fencing token on a new acquisition
-- ARGV[4]  this attempt's id (each attempt of a lock() call draws its own), and the id of the
--          acquisition it makes, if it makes one
-- ARGV[5]  '1' when the calling object holds no entry (a first entry): one this attempt made
--          already (it was sent again after a lost reply) is then claimed as it is
-- ARGV[6]  the ids of the owner's attempts the client gave up, space-separated, or '': the entry
--          each of them counted (firsts:<owner>) is left now, once; a first entry keeps their
--          ids in gone:<owner>, so that one of them whose script lands only now, late, writes
--          nothing (while the owner holds the lock: else it leaves its entry to its lease)
-- ARGV[7]  the waiter id of this lock() call; an entry handed to it (an 'h' id, see _queue.lua)
--          and claimed by no attempt yet is claimed as it is, with any re-entries other calls of
--          the owner made since, whatever ARGV[5] says; the call then leaves the queue. Until
--          that claim the entry is the waiter's reservation, kept for the grace only: other
--          calls of the owner wait for the claim rather than enter it (their entry would make it
--          a lease, held for a waiter that may never come).
-- ARGV[8]  '0' for a try that does not wait; else ms an entry in the queue outlives the wait
--          this reply asks for
-- ARGV[9]  the release channel; ARGV[10] the grace, ms, a told waiter has to come: a free lock
--          the queue keeps from this attempt, because another waiter heads it, is handed to that
--          head as a release would hand it on (see queue_hand_on_entry in _queue.lua)
-- Returns  {1, fence, id} acquired; {2, fence, id} re-entered (fence and id of the first
--          entry); {0, ms, ''} not acquired: wait at most ms for a message before trying again
--          (the holder's PTTL, or how long the waiter told to go has to come); {0, 0, ''} too,
--          nothing written, for an attempt the client gave up that lands late (ARGV[6]).
--          fence is 0 when none was drawn.
-- Errors   WRONGTYPE when KEYS[1] is not a reentrant lock or KEYS[4] not a fencing counter; ERR
--          when a queue key is not a sorted set, or ARGV[9] or ARGV[10] is missing; nothing is
--          written then.
local queue, lapses = KEYS[2], KEYS[3]
local channel, grace = ARGV[9], tonumber(ARGV[10])
if ARGV[3] == '1' and not KEYS[4] then
    return redis.error_reply('ERR a fenced acquisition declares its fencing counter as KEYS[4]')
end
if not channel or not grace or grace < 1 then
    return redis.error_reply('ERR an acquisition names the release channel and the grace ' ..
                             '(ARGV[9], ARGV[10])')
end
-- Gives the key our lease, or keeps what it has left if that is longer: every object of the
-- owner that entered counts on its own lease, and none may lose it to a shorter one. A TTL over
-- the longest lease (2^40 ms) was set by no lock; it is cut to that.
local function lease_key()
    local left = math.min(redis.call('PTTL', KEYS[1]), 1099511627776)
    redis.call('PEXPIRE', KEYS[1], math.max(left, tonumber(ARGV[2])))
end
local gone_ids = {}
for gone in string.gmatch(ARGV[6], '%S+') do
    gone_ids[#gone_ids + 1] = gone
end
-- A new acquisition's entry, under this attempt's id: on a free lock, or (`in_place`) rewriting
-- the hash of one that was freed here, whose other fields go (see _queue.lua: a key is never
-- deleted and then written by one script).
local function fresh(in_place)
    local fence = 0
    local fields = {ARGV[1], 1, 'id:' .. ARGV[1], ARGV[4], 'firsts:' .. ARGV[1], '=' .. ARGV[4]}
    if ARGV[3] == '1' then
        -- Never below the server's clock in microseconds, so tokens keep growing after a
        -- FLUSHALL or a restart without persistence.
        local time = redis.call('TIME')
        local floor = tonumber(time[1]) * 1000000 + tonumber(time[2])
        fence = math.max((tonumber(redis.call('GET', KEYS[4])) or 0) + 1, floor)
        redis.call('SET', KEYS[4], string.format('%d', fence), 'PX', 86400000)
        table.insert(fields, 'fence')
        table.insert(fields, string.format('%d', fence))
    end
    if #gone_ids > 0 then
        table.insert(fields, 'gone:' .. ARGV[1])
        table.insert(fields, table.concat(gone_ids, ' '))
    end
    local stale = {}
    if in_place then
        local kept = {}
        for i = 1, #fields, 2 do
            kept[fields[i]] = true
        end
        for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
            if not kept[field] then
                stale[#stale + 1] = field
            end
        end
    end
    redis.call('HSET', KEYS[1], unpack(fields))
    if #stale > 0 then
        redis.call('HDEL', KEYS[1], unpack(stale))
    end
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, fence, ARGV[4]}
end
if ARGV[3] == '1' then
    local last = redis.call('GET', KEYS[4])
    if last and (#last > 16 or not string.match(last, '^%d+$')) then
        return redis.error_reply('WRONGTYPE ' .. KEYS[4] .. ' is not a fencing counter')
    end
end
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', queue) == 0 then
    return fresh()  -- free, and no queue to leave (its lapse times go with it)
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and (kind ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'mode') == 1) then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a reentrant lock')
end
local id = kind == 'hash' and redis.call('HGET', KEYS[1], 'id:' .. ARGV[1])
-- The first entries the owner's count holds, and those of given-up attempts among them: each
-- is left once, here.
local firsts, counted, settles = {}, {}, {}
if id then
    for maker, first in string.gmatch(redis.call('HGET', KEYS[1], 'firsts:' .. ARGV[1]) or '',
                                      '(=?)(%S+)') do
        firsts[#firsts + 1] = maker .. first
        counted[first] = maker == '=' and 'made' or 'joined'
    end
    for _, gone in ipairs(gone_ids) do
        if counted[gone] then
            counted[gone] = nil  -- named twice, left once
            settles[#settles + 1] = gone
        end
    end
end
-- The owner's entry was handed to this call's waiter and no other attempt has claimed it:
-- claimed (again, by an attempt sent again after a lost reply).
local claim = id and (#firsts == 0 or counted[ARGV[4]] == 'made') and
                  id == string.match(ARGV[7], '^h(%x+)%.')
-- An acquisition the client gave up, landing after the owner's next first entry named it so:
-- nothing to do (see ARGV[6]).
if id and not claim and ARGV[5] == '1' then
    for gone in string.gmatch(redis.call('HGET', KEYS[1], 'gone:' .. ARGV[1]) or '', '%S+') do
        if gone == ARGV[4] then
            return {0, 0, ''}
        end
    end
end
-- A first entry that joins or claims the owner's entries names what the client gave up, as
-- fresh() does.
local function note_given_up()
    if ARGV[5] == '1' and #gone_ids > 0 then
        redis.call('HSET', KEYS[1], 'gone:' .. ARGV[1], table.concat(gone_ids, ' '))
    end
end
-- Counts this attempt's first entry among firsts:<owner> (the newest 32 are kept); `maker` for
-- a claim.
local function count_first(maker)
    for i = #firsts, 1, -1 do
        local first = string.match(firsts[i], '^=?(%S+)')
        if not counted[first] or first == ARGV[4] then
            table.remove(firsts, i)  -- left here, or counted again below
        end
    end
    table.insert(firsts, 1, (maker and '=' or '') .. ARGV[4])
    redis.call('HSET', KEYS[1], 'firsts:' .. ARGV[1],
               table.concat(firsts, ' ', 1, math.min(#firsts, 32)))
end
-- Joins the owner's entries: a re-entry, or, through an object holding none, a first entry.
local function join()
    redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    if ARGV[5] == '1' then
        count_first(false)
    end
    note_given_up()
    lease_key()
    return {2, tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0, id}
end
-- This attempt's first entry is counted already (it landed before, its reply lost): it is this
-- call's as it is; the maker's is a new acquisition, a join's a re-entry.
local retried = id and not claim and ARGV[5] == '1' and counted[ARGV[4]]
-- An entry handed to a waiter of the owner is a reservation until that waiter claims it, and
-- leaves the queue: while it still heads it, the entry is not claimed. (A queue key of another
-- type is refused below, unless this is a re-entry that need not touch it.)
local reserved = false
if id and not claim and not retried and
    redis.call('HGET', KEYS[1], 'handed:' .. ARGV[1]) == id then
    local head = redis.pcall('ZRANGE', queue, 0, 0)
    reserved = not head.err and head[1] ~= nil and
        string.sub(head[1], 1, #id + 2) == 'h' .. id .. '.'
end
if id and not claim and not retried and not reserved and #settles == 0 and ARGV[8] == '0' then
    -- A re-entry with no place in the queue to leave: the common case, before the queue's
    -- helpers are defined.
    return join()
end
-- Only now are the queue's helpers defined (see mutex_release.lua).
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
-- The given-up attempts' entries are left; with none left the lock is free, and taken as a free
-- one is (the queue first), its hash still there to rewrite.
local freed = false
if #settles > 0 then
    local left = (tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0) - #settles
    if left > 0 then
        local kept = {}
        for _, first in ipairs(firsts) do
            if counted[string.match(first, '^=?(%S+)')] then
                kept[#kept + 1] = first
            end
        end
        firsts = kept
        redis.call('HSET', KEYS[1], ARGV[1], left)
        if #kept > 0 then
            redis.call('HSET', KEYS[1], 'firsts:' .. ARGV[1], table.concat(kept, ' '))
        else
            redis.call('HDEL', KEYS[1], 'firsts:' .. ARGV[1])
        end
    else
        freed, id, reserved = true, false, false
    end
end

-- A new acquisition that leaves the queue, if it was in it.
local function enter()
    local entered = fresh(freed)
    if ARGV[8] ~= '0' then
        queue_leave(queue, lapses, ARGV[7])
    end
    return entered
end

-- Not acquired: join the queue when waiting, and say how long to wait: at most 2^40 ms, the
-- longest lease (a longer TTL is no lock's; see mutex_acquire.lua).
local function wait(ms, now, time)
    ms = math.min(ms, 1099511627776)
    if ARGV[8] ~= '0' then
        queue_join(queue, lapses, ARGV[7], now, tonumber(time[1]) * 1000000 + tonumber(time[2]),
                   math.max(ms, 0) + tonumber(ARGV[8]))
    end
    return {0, ms, ''}
end
if claim then
    -- The call leaves the queue, where its place was kept until it came. The mark stays: a call
    -- that acquires never leaves the queue itself, and one whose reply is lost and that gives up
    -- then still takes back its one entry.
    count_first(true)
    lease_key()
    note_given_up()
    queue_leave(queue, lapses, ARGV[7])
    return {1, tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0, id}
end
if retried then
    lease_key()
    note_given_up()
    if ARGV[8] ~= '0' then
        queue_leave(queue, lapses, ARGV[7])
    end
    return {retried == 'made' and 1 or 2, tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0, id}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if reserved then
    return wait(redis.call('PTTL', KEYS[1]), now, time)
elseif id then
    if ARGV[8] ~= '0' then
        queue_leave(queue, lapses, ARGV[7])
    end
    return join()
end
if kind == 'none' or freed then
    if not queue_prune(queue, lapses, now, channel) then
        return fresh(freed)  -- no one waits any more, and the queue is gone
    end
    if queue_allows(queue, ARGV[7]) then
        return enter()
    end
    -- Another waiter heads the queue. One whose entry lapses within the grace was told its turn
    -- already, or soon lapses: wait for that. Any other is handed the lock as a release would
    -- hand it on (told, its entry lapsing with the grace).
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    local left = (tonumber(redis.call('ZSCORE', lapses, head)) or now + grace) - now
    if left <= grace then
        if freed then
            redis.call('DEL', KEYS[1])
        end
        return wait(left, now, time)
    end
    -- Its own prune finds nothing more to remove (this one just ran, at the same time): the queue
    -- is kept. The key may be gone now, not to be touched again (see _queue.lua): what it kept
    -- for an 'h' head lasts the grace at most.
    queue_hand_on_entry(KEYS[1], queue, lapses, channel, now, grace)
    return wait(grace, now, time)
end
return wait(redis.call('PTTL', KEYS[1]), now, time)
