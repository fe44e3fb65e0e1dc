-- Leaves a reentrant lock ARGV[2] times; when the count reaches 0, deletes it or, if someone
-- waits, hands it to the head of the queue or tells the head (see queue_hand_on_entry).
-- Works when the server is out of memory: its first write, PEXPIRE or DEL, is not refused
-- there, and once a script has written, Redis lets the rest of it write too. Every check comes
-- before that first write.
-- KEYS[1]  the lock's hash
-- KEYS[2]  the waiting queue; KEYS[3] its lapse times (see _queue.lua and mutex_acquire.lua)
-- ARGV[1]  the owner id
-- ARGV[2]  how many entries to leave (1 for unlock)
-- ARGV[3]  the lease, ms, set again while entries remain unless the key has more left (another
--          object of the owner may count on that); '0' keeps the key's TTL (a release finished
--          in the background must not extend what its owner no longer renews)
-- ARGV[4]  the release channel
-- ARGV[5]  the acquisition id the entries belong to; with ARGV[8] '1', the id of an attempt the
--          client gave up instead, whose one first entry (see firsts:<owner> in
--          recursive_acquire.lua) is left if it is still counted (ARGV[2] is then 1)
-- ARGV[6]  the grace, ms, a told waiter has to come
-- ARGV[7]  this release's id, or '' (absent too); the client sends a release again should its
--          reply be lost: one whose id field left:<owner> lists (the owner's last 32 named
--          releases that left entries in place) had landed and leaves nothing more, as it would
--          take an entry another object of the owner joined
-- ARGV[8]  '1' for a given-up attempt's entry (ARGV[5]); absent or '' otherwise
-- Returns  2 released (key deleted or handed on) and a waiter told; 1 released, no one waits;
--          0 still held (lease refreshed), or this release had landed already;
--          -1 not the owner's (expired, held by another owner, or a later acquisition's)
-- Errors   ERR when a queue key is not a sorted set; nothing is written then.
local queue, lapses = KEYS[2], KEYS[3]
-- A key of another type answers with an error: not ours either.
local release = ARGV[7] or ''
local entry = redis.pcall('HMGET', KEYS[1], 'id:' .. ARGV[1], ARGV[1], 'left:' .. ARGV[1],
                          'firsts:' .. ARGV[1])
if entry.err or not entry[1] then
    return -1
end
-- A given-up attempt's entry is left once: its id leaves firsts:<owner> with it.
local firsts
if ARGV[8] == '1' then
    local kept, found = {}, false
    for first in string.gmatch(entry[4] or '', '%S+') do
        if first == ARGV[5] or first == '=' .. ARGV[5] then
            found = true
        else
            kept[#kept + 1] = first
        end
    end
    if not found then
        return -1
    end
    firsts, release = table.concat(kept, ' '), ''
elseif entry[1] ~= ARGV[5] then
    return -1
end
local landed = {}
for id in string.gmatch(entry[3] or '', '%S+') do
    if id == release then
        return 0
    end
    landed[#landed + 1] = id
end
local left = (tonumber(entry[2]) or 0) - tonumber(ARGV[2])
if left > 0 then
    -- PEXPIRE even when the TTL stays: it is the write Redis allows when out of memory. A TTL
    -- over the longest lease (2^40 ms) was set by no lock; it is cut to that.
    local ttl = math.min(redis.call('PTTL', KEYS[1]), 1099511627776)
    redis.call('PEXPIRE', KEYS[1], math.max(ttl, tonumber(ARGV[3]), 1))
    redis.call('HSET', KEYS[1], ARGV[1], left)
    if firsts == '' then
        redis.call('HDEL', KEYS[1], 'firsts:' .. ARGV[1])
    elseif firsts then
        redis.call('HSET', KEYS[1], 'firsts:' .. ARGV[1], firsts)
    end
    if release ~= '' then
        redis.call('HSET', KEYS[1], 'left:' .. ARGV[1],
                   release .. ' ' .. table.concat(landed, ' ', 1, math.min(#landed, 31)))
    end
    return 0
end
if redis.call('EXISTS', queue) == 0 then
    redis.call('DEL', KEYS[1])
    return 1
end
-- A queue exists: only now are its helpers defined (see mutex_release.lua).
--#include _queue.lua
local refused = queue_check(queue, lapses)
if refused then
    return refused
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return queue_hand_on_entry(KEYS[1], queue, lapses, ARGV[4], now, tonumber(ARGV[6])) and 2 or 1
