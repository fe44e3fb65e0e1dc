-- Whether anyone holds a simple lock, and for how long: basic_mutex::is_locked() and
-- holder_ttl(). Reads only. A key holding 'queued:<id>' is a free lock kept for waiter <id>, told
-- it may go (see mutex_acquire.lua): no one holds it. One holding a waiter's token was handed to
-- that waiter, whose attempt takes it as it is: held.
-- KEYS[1]  the lock's key
-- Returns  the holder's time left, ms: 0 when no one holds it; -1 when held with no expiry (a key
--          another program set without one)
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a simple lock; any other refusal to
--          read it (an ACL) as the server gave it.
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' then
    if string.find(holder.err or '', '^WRONGTYPE') then
        return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a simple lock')
    end
    return holder
end
if not holder or string.sub(holder, 1, 7) == 'queued:' then
    return 0
end
-- A key with under a millisecond left reads 0: still held, for at most 1 ms.
local ttl = redis.call('PTTL', KEYS[1])
return ttl == -1 and -1 or math.max(ttl, 1)
