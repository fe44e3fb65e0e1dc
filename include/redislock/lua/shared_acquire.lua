-- Enters a read-write lock for reading ('r') or writing ('w'), in the order of the waiting
-- queue: a writer goes when no one holds and it heads the queue; a reader when no writer holds
-- and no writer waits before it (so neither readers nor writers starve).
-- Hash fields: mode = 'read' | 'write' | 'free' (marks the hash as a read-write lock);
--   r:<owner>, w:<owner> = '<count> <expiry ms> <acquisition id>', each holder with its own
--   lease in server time; fence; left:<owner>, the owner's last releases that left entries in
--   place (see shared_release.lua); joins:<owner>, the owner's last attempts (mode and id,
--   '<r|w><id>') that joined its entry through an object holding none: one that lands again
--   counts no further entry, and a release or an unsettled item naming it leaves its entry.
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
-- ARGV[6]  the id for a new acquisition (each attempt draws its own)
-- ARGV[7]  '1' when the calling object holds no entry in this mode: an entry of this owner in
--          this mode named ARGV[6] (a retry whose first reply was lost) is taken over, not
--          re-entered
-- ARGV[8]  what the owner left unsettled, separated by spaces, or '': '<id>/<count>/<release id>'
--          names a release of <count> entries of acquisition <id> whose reply was lost, or the
--          one entry of an attempt the client gave up (which may land after this); each is left
--          now unless it landed (see ARGV[7] of shared_release.lua), and never more: entries
--          another object of the owner joined stay
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
               'mode', want == 'w' and 'write' or 'read')
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
local unsettled = {}
for item in string.gmatch(ARGV[8] or '', '%S+') do
    local id, count, release = string.match(item, '^([^/]+)/(%d+)/(%S+)$')
    if id then
        unsettled[#unsettled + 1] = {id, tonumber(count), release}
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
local joins, joined_before = {}, {}
for token in string.gmatch(redis.call('HGET', KEYS[1], 'joins:' .. me) or '', '%S+') do
    joins[#joins + 1] = token
    joined_before[token] = true
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
        for _, item in ipairs(owner == me and unsettled or {}) do
            if (item[1] == id or joined_before[tag .. item[1]]) and not landed[item[3]] then
                landed[item[3]] = true
                table.insert(settled, 1, item[3])
                count = count - item[2]
            end
        end
        if expiry <= now or count <= 0 then
            redis.call('HDEL', KEYS[1], fields[i])
        else
            if count < tonumber(string.match(fields[i + 1], '^%d+')) then
                redis.call('HSET', KEYS[1], fields[i], count .. ' ' .. expiry .. ' ' .. id)
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
    if kept > 0 or #joins > 0 then
        redis.call('HDEL', KEYS[1], 'left:' .. me, 'joins:' .. me)
        joins = {}
    end
elseif #settled > kept then
    redis.call('HSET', KEYS[1], 'left:' .. me,
               table.concat(settled, ' ', 1, math.min(#settled, 32)))
end

-- Our own retried acquisition: taken over, whoever queued since, as this call's one entry
-- (another object of the owner may have joined it since: its entries stay counted).
local retried = mine[want] and ARGV[7] == '1' and ids[want] == ARGV[6]
local joined = 0
if retried then
    joined, mine[want] = mine[want] - 1, nil
end
-- An object holding none joins the owner's entry: once per attempt, however often it lands.
local join_token = want .. ARGV[6]
local joining = mine[want] and ARGV[7] == '1' and not retried
local rejoined = joining and joined_before[join_token]
local result
local id = ids[want] or ARGV[6]
if want == 'w' and mine.r and not mine.w then
    return {-1, 0, ''}
elseif mine[want] then
    result = {2, tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0, id}
end
-- Kept out by the holders, whatever the queue says: a waiter then joins before the queue is
-- pruned, so that a prune that empties it never leaves the join writing keys it removed (see
-- _queue.lua).
local ticket, join = tonumber(time[1]) * 1000000 + tonumber(time[2]), ARGV[9] ~= '0'
local blocked = not result and not retried and (others.w or (want == 'w' and others.r))
local queued = redis.call('EXISTS', queue) == 1
if blocked and join then
    queue_join(queue, lapses, ARGV[5], now, ticket, longest + tonumber(ARGV[9]))
    queued = true
end
if queued then
    queued = queue_prune(queue, lapses, now, channel)
end
if blocked or (not result and not retried and
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
local count = (mine[want] or joined) + (rejoined and 0 or 1)
if joining and not rejoined then
    redis.call('HSET', KEYS[1], 'joins:' .. me,
               join_token .. ' ' .. table.concat(joins, ' ', 1, math.min(#joins, 31)))
end
redis.call('HSET', KEYS[1], want .. ':' .. me,
           count .. ' ' .. math.max(ends[want] or 0, now + lease) .. ' ' .. id,
           'mode', (want == 'w' or mine.w) and 'write' or 'read')
redis.call('PEXPIRE', KEYS[1], math.max(latest, now + lease) - now)
return result
