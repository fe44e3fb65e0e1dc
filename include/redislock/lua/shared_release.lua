-- Leaves a read-write lock ARGV[3] times in mode ARGV[2]; when that lets waiters in, tells the
-- ones the queue lets go next.
-- Works when the server is out of memory: the first write (PEXPIRE, DEL or HDEL) is one Redis
-- allows there, and once a script has written Redis lets the rest of it write too. Every check
-- comes before that first write.
-- Layout: see shared_acquire.lua.
-- KEYS[1]  the lock's hash
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua and mutex_acquire.lua)
-- ARGV[1]  the owner id
-- ARGV[2]  'r' or 'w'
-- ARGV[3]  how many entries to leave (1 for unlock)
-- ARGV[4]  the release channel
-- ARGV[5]  the acquisition id the entries belong to; with ARGV[8] '1', the id of an attempt the
--          client gave up instead, whose one first entry (see firsts: in shared_acquire.lua) is
--          left if it is still counted (ARGV[3] is then 1)
-- ARGV[6]  the grace, ms, a told waiter has to come
-- ARGV[7]  this release's id, or '' (absent too): the client sends a release again when its
--          reply was lost, and the owner's next acquisition through that object settles it (see
--          shared_acquire.lua): one whose id field left:<owner> lists (the owner's last 32 named
--          releases that left entries in place) had landed and leaves nothing more, as it would
--          take an entry another object of the owner joined
-- ARGV[8]  '1' for a given-up attempt's entry (ARGV[5]); absent or '' otherwise
-- Returns  2 released and waiters told; 1 released (the key is deleted when no one else holds);
--          0 still held by outer entries, or this release had landed already; -1 not held
--          (expired, never, or a later acquisition's)
-- Errors   ERR when a queue key is not a sorted set; nothing is written then.
local queue, lapses = KEYS[2], KEYS[3]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local field = ARGV[2] .. ':' .. ARGV[1]
local release = ARGV[7] or ''

-- One read for our entry and for what the others hold: holders set the mode and the key's lease
-- once we are out; with no one left, the key goes.
local fields = redis.call('HGETALL', KEYS[1])
local books = 'firsts:' .. ARGV[2] .. ':' .. ARGV[1]
local entry, landed_text, firsts, writer, holders, latest = nil, '', '', false, false, now
local ours_in_other_mode = false
for i = 1, #fields, 2 do
    if fields[i] == field then
        entry = fields[i + 1]
    elseif fields[i] == 'left:' .. ARGV[1] then
        landed_text = fields[i + 1]
    elseif fields[i] == books then
        firsts = fields[i + 1]
    else
        local tag = string.sub(fields[i], 1, 2)
        -- At most the longest lease (2^40 ms) from now: see shared_acquire.lua.
        local left = math.min(tonumber(string.match(fields[i + 1], '^%d+ (%d+)') or 0),
                              now + 1099511627776)
        if left > now and (tag == 'r:' or tag == 'w:') then
            latest = math.max(latest, left)
            writer = writer or tag == 'w:'
            holders = true
            ours_in_other_mode = ours_in_other_mode or string.sub(fields[i], 3) == ARGV[1]
        end
    end
end
local count, expiry, id = string.match(entry or '', '^(%d+) (%d+) (%S+)$')
if not count or tonumber(expiry) <= now then
    return -1
end
-- A given-up attempt's entry is left once: its id leaves firsts: with it.
local kept_firsts
if ARGV[8] == '1' then
    local kept, found = {}, false
    for first in string.gmatch(firsts, '%S+') do
        if first == ARGV[5] then
            found = true
        else
            kept[#kept + 1] = first
        end
    end
    if not found then
        return -1
    end
    kept_firsts, release = table.concat(kept, ' '), ''
elseif id ~= ARGV[5] then
    return -1
end
local landed = {}
for seen in string.gmatch(landed_text, '%S+') do
    if seen == release then
        return 0
    end
    landed[#landed + 1] = seen
end
count = tonumber(count) - tonumber(ARGV[3])
if count > 0 then
    local ttl = math.min(redis.call('PTTL', KEYS[1]), 1099511627776)
    redis.call('PEXPIRE', KEYS[1], math.max(ttl, 1))
    redis.call('HSET', KEYS[1], field, count .. ' ' .. expiry .. ' ' .. id)
    if kept_firsts == '' then
        redis.call('HDEL', KEYS[1], books)
    elseif kept_firsts then
        redis.call('HSET', KEYS[1], books, kept_firsts)
    end
    if release ~= '' then
        redis.call('HSET', KEYS[1], 'left:' .. ARGV[1],
                   release .. ' ' .. table.concat(landed, ' ', 1, math.min(#landed, 31)))
    end
    return 0
end
-- Our entry goes; with no one left, the key goes.
local function leave()
    if not holders then
        redis.call('DEL', KEYS[1])
        return
    end
    redis.call('HDEL', KEYS[1], field, books)
    if not ours_in_other_mode then
        -- No entry of ours left for a release sent again to find: the ids go too.
        redis.call('HDEL', KEYS[1], 'left:' .. ARGV[1])
    end
    if ARGV[2] == 'w' then
        redis.call('HDEL', KEYS[1], 'fence')
    end
    redis.call('HSET', KEYS[1], 'mode', writer and 'write' or 'read')
    redis.call('PEXPIRE', KEYS[1], latest - now)
end
if writer or redis.call('EXISTS', queue) == 0 then
    leave()
    return 1
end
-- A queue exists: only now are its helpers defined (see mutex_release.lua).
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
leave()
if not queue_prune(queue, lapses, now, ARGV[4]) then
    return 1
end
local run = queue_runners(queue)
if #run == 0 or (holders and string.sub(run[1], 1, 1) ~= 'r') then
    return 1
end
queue_notify(queue, lapses, ARGV[4], run, now, tonumber(ARGV[6]))
return 2
