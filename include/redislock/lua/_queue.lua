-- The fair waiting queue beside a lock: q orders waiter ids by arrival (a sorted set, id ->
-- ticket in server µs), w says when each entry lapses unless its waiter comes back (id -> ms).
-- A waiter id starts with 'r' when it waits to read, any other letter when it waits to write;
-- 'g<token>.<lease ms>' names a waiter for a simple lock, and 'h<acquisition>.<lease ms>.<owner>'
-- one for a reentrant lock, that the lock may be handed to: kept for it, under its own token or
-- as an entry of its owner, until it comes to take it. An id ending in '@<tag>' is told on its
-- client's channel, '<release channel>:<tag>'.
-- A script never calls Redis on a key after it removed it (DEL, or the last entry of a sorted
-- set): on a slot being migrated, Redis checks each call against the keys the node has at that
-- moment and refuses one on a key it no longer has ("non local key"), after the writes before
-- it. So a lock handed on is rewritten in place, and the helpers that may empty the queue say so.

-- Publishes `words` (waiter ids, some prefixed '?') each on the channel its waiter listens on,
-- one message per channel. Sharded pub/sub keeps the messages on the lock's shard; a server
-- without it leaves waiters to their fallback timers.
local function queue_tell(channel, words)
    if #words == 1 then
        local tag = string.match(words[1], '@(%x+)$')
        redis.pcall('SPUBLISH', tag and channel .. ':' .. tag or channel, words[1])
        return
    end
    local messages, order = {}, {}
    for _, word in ipairs(words) do
        local tag = string.match(word, '@(%x+)$')
        local to = tag and channel .. ':' .. tag or channel
        if not messages[to] then
            messages[to] = {}
            order[#order + 1] = to
        end
        table.insert(messages[to], word)
    end
    for _, to in ipairs(order) do
        redis.pcall('SPUBLISH', to, table.concat(messages[to], ' '))
    end
end

-- A lapsed entry stays until something prunes: releases, leaving waiters, any attempt on a
-- read-write lock, and attempts on a simple or reentrant lock that may be free for them. A waiter
-- that comes back before then keeps its place. Removes in slices, as unpack() takes about 8,000
-- values at most; each id costs about 1.5 µs.
-- Both keys hold the same ids. Should w be lost (evicted: Redis must run with noeviction; or
-- deleted), an id of q without a lapse time would never lapse, and one heading q would hold
-- everyone up as long as anyone waits: each such id is given a lapse time 2 s from now (the
-- margin a waiter's entry outlives the wait it was told, queue_place::kept in fair_wait.hpp)
-- and told on `channel` to check once its grace is over, as a standby is: a waiter that is
-- alive then comes back and keeps its place for the wait it needs, one asleep on a long wait
-- included.
-- True when the queue still holds someone; false when it is empty (its keys are gone then, not
-- to be touched again).
local function queue_prune(q, w, now, channel)
    local size, times = redis.call('ZCARD', q), redis.call('ZCARD', w)
    if size ~= times then
        local ids = redis.call('ZRANGE', q, 0, -1)
        local repaired = {}
        for first = 1, #ids, 1000 do
            local last = math.min(first + 999, #ids)
            local known = redis.call('ZMSCORE', w, unpack(ids, first, last))
            local lapse_times = {}
            for i = first, last do
                if not known[i - first + 1] then
                    lapse_times[#lapse_times + 1] = now + 2000
                    lapse_times[#lapse_times + 1] = ids[i]
                    repaired[#repaired + 1] = '?' .. ids[i]
                end
            end
            if #lapse_times > 0 then
                times = times + redis.call('ZADD', w, unpack(lapse_times))
            end
        end
        if #repaired > 0 then
            queue_tell(channel, repaired)
        end
        local keep = math.max(redis.call('PTTL', q), 2000)
        if #ids > 0 and redis.call('PTTL', w) < keep then
            redis.call('PEXPIRE', w, keep)
        end
    end
    if times == 0 then
        return false
    end
    local lapsed = redis.call('ZRANGEBYSCORE', w, '-inf', now)
    for first = 1, #lapsed, 1000 do
        local last = math.min(first + 999, #lapsed)
        if size > 0 then
            size = size - redis.call('ZREM', q, unpack(lapsed, first, last))
        end
        times = times - redis.call('ZREM', w, unpack(lapsed, first, last))
    end
    return size > 0 and times > 0
end

-- Adds `id` (keeping its place if already in) to lapse `keep` ms from now. Both keys hold the
-- same ids and live at least as long as their latest entry: a lapse is never moved later but
-- here, and here each key's time to live grows to cover it when it would not (each checked on
-- its own: one of them may have been lost and made again, without a TTL).
local function queue_join(q, w, id, now, ticket, keep)
    keep = math.max(keep, 1)
    redis.call('ZADD', q, 'NX', ticket, id)
    redis.call('ZADD', w, now + keep, id)
    if redis.call('PTTL', q) < keep then
        redis.call('PEXPIRE', q, keep)
    end
    if redis.call('PTTL', w) < keep then
        redis.call('PEXPIRE', w, keep)
    end
end

-- Takes `id` out of the queue. False when that emptied it, or its lapse times (see
-- queue_prune); true when those were missing already (queue_prune gives the ids left some).
local function queue_leave(q, w, id)
    local size = redis.call('ZCARD', q) - redis.call('ZREM', q, id)
    local times = redis.call('ZCARD', w)
    local emptied = times > 0 and redis.call('ZREM', w, id) == times
    return size > 0 and not emptied
end

-- The waiters that may go once the lock is free: the first writer alone, or every reader before
-- the first writer.
local function queue_runners(q)
    local ids = redis.call('ZRANGE', q, 0, 63)
    local run = {}
    for i, id in ipairs(ids) do
        if string.sub(id, 1, 1) ~= 'r' then
            if i == 1 then
                run[1] = id
            end
            break
        end
        run[i] = id
    end
    return run
end

-- Tells `run` they may go, each with `grace` ms to come before its entry lapses; the waiter
-- after them (prefixed '?') is told to check once that grace is over, and its entry lapses 2 s
-- (queue_place::kept) after that unless it does: a standby that died would otherwise head the
-- queue, once `run` is gone, until the lapse time it joined with (a holder's lease and more).
local function queue_notify(q, w, channel, run, now, grace)
    if #run == 0 then
        return
    end
    local words = {}
    for i, id in ipairs(run) do
        redis.call('ZADD', w, 'XX', 'LT', now + grace, id)
        words[i] = id
    end
    local standby = redis.call('ZRANGE', q, #run, #run)[1]
    if standby then
        redis.call('ZADD', w, 'XX', 'LT', now + grace + 2000, standby)
        words[#words + 1] = '?' .. standby
    end
    queue_tell(channel, words)
end

-- Frees the simple lock `key` (the caller's to give away; a queue being there): it goes to the
-- head of the queue, which is told, the key rewritten in place and kept for it for `grace` ms
-- (no longer than its lease), so that a plain SET NX cannot barge in: under its own token for a
-- 'g' waiter, which its next attempt takes as handed to it, else as 'queued:<id>'. A head that
-- does not come within the grace lapses, and the lock is free again: it holds no one up for its
-- lease. With no one left in the queue the key is deleted. The first write is PEXPIRE, which
-- Redis allows out of memory (once a script has written, the rest of it may write too). True
-- when someone was told.
local function queue_hand_on(key, q, w, channel, now, grace)
    redis.call('PEXPIRE', key, math.max(grace, 1))
    local head = queue_prune(q, w, now, channel) and redis.call('ZRANGE', q, 0, 0)[1]
    if not head then
        redis.call('DEL', key)
        return false
    end
    local token, lease = string.match(string.match(head, '^[^@]*'), '^g(%x+)%.(%d+)$')
    redis.call('SET', key, token or 'queued:' .. head, 'PX',
               math.min(tonumber(lease) or grace, grace))
    queue_notify(q, w, channel, {head}, now, grace)
    return true
end

-- Frees the reentrant lock `key` (the caller's to give away; a queue being there): it goes to
-- the head of the queue, which is told it may go. An 'h' head gets an entry of its owner under
-- its own acquisition id, the hash rewritten in place (its other fields go once the entry is
-- in) and kept for `grace` ms (no longer than its lease) until its next attempt claims it, so
-- that a head that does not come holds no one up for its lease; else the key is deleted.
-- handed:<owner> marks the entry as the one made for that waiter: if it gives up instead, its
-- leave takes back this one entry (a waiter that acquires never leaves, so the mark may stay
-- until the key goes or the hash is rewritten for a new acquisition). The first write is
-- PEXPIRE, as in queue_hand_on. True when someone was told.
local function queue_hand_on_entry(key, q, w, channel, now, grace)
    redis.call('PEXPIRE', key, math.max(grace, 1))
    local run = queue_prune(q, w, now, channel) and queue_runners(q) or {}
    local acquisition, lease, owner
    if #run == 1 then
        acquisition, lease, owner =
            string.match(string.match(run[1], '^[^@]*'), '^h(%x+)%.(%d+)%.(.+)$')
    end
    if not acquisition then
        redis.call('DEL', key)
        queue_notify(q, w, channel, run, now, grace)
        return #run > 0
    end
    local entry = {[owner] = true, ['id:' .. owner] = true, ['handed:' .. owner] = true}
    local stale = {}
    for _, field in ipairs(redis.call('HKEYS', key)) do
        if not entry[field] then
            stale[#stale + 1] = field
        end
    end
    redis.call('HSET', key, owner, 1, 'id:' .. owner, acquisition,
               'handed:' .. owner, acquisition)
    if #stale > 0 then
        redis.call('HDEL', key, unpack(stale))
    end
    redis.call('PEXPIRE', key, math.min(tonumber(lease), grace))
    queue_notify(q, w, channel, run, now, grace)
    return true
end

-- True when `id` may take the lock now as far as the queue is concerned: no one waits, or it is
-- the head; a reader also when no writer waits before it.
local function queue_allows(q, id)
    local ahead = redis.call('ZRANGE', q, 0, 63)
    if #ahead == 0 or ahead[1] == id then
        return true
    end
    if string.sub(id, 1, 1) ~= 'r' then
        return false
    end
    for _, other in ipairs(ahead) do
        if other == id then
            return true
        end
        if string.sub(other, 1, 1) ~= 'r' then
            return false
        end
    end
    return #ahead < 64
end

-- An error reply when a queue key holds something other than a sorted set (another program
-- wrote it), else nil. Scripts check before their first write that may reach the queue, so they
-- never write and then fail.
local function queue_check(q, w)
    for i, kind in ipairs({redis.call('TYPE', q).ok, redis.call('TYPE', w).ok}) do
        if kind ~= 'none' and kind ~= 'zset' then
            return redis.error_reply('ERR ' .. (i == 1 and q or w) .. ' holds a ' .. kind ..
                                     ', not a waiting queue')
        end
    end
end
