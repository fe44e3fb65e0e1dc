-- Whether anyone holds a read-write lock, and for how long: basic_shared_mutex::is_locked() and
-- holder_ttl(). Reads only.
-- Layout: see shared_acquire.lua. Each holder's entry, r:<owner> or w:<owner>, carries its own
-- expiry in server time; an entry past it holds nothing, though it stays in the hash until a
-- script prunes it, and the key lives as long as the longest lease it was given. The other fields
-- (mode, fence) are books: a hash holding only those, or only entries past their expiry, is held
-- by no one.
-- KEYS[1]  the lock's hash
-- Returns  the time left of the holder whose lease ends last, ms (no more than the key's own
--          TTL); 0 when no one holds it
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a read-write lock
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
    return 0
end
if kind ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'mode') == 0 then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a read-write lock')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local fields = redis.call('HGETALL', KEYS[1])
local latest = now
for i = 1, #fields, 2 do
    local tag = string.sub(fields[i], 1, 2)
    local count, expiry = string.match(fields[i + 1], '^(%d+) (%d+)')
    if (tag == 'r:' or tag == 'w:') and count and tonumber(count) > 0 then
        -- At most the longest lease (2^40 ms) from now: see shared_acquire.lua.
        latest = math.max(latest, math.min(tonumber(expiry), now + 1099511627776))
    end
end
if latest == now then
    return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then
    return latest - now
end
-- A key with under a millisecond left reads 0: still held, for at most 1 ms.
return math.min(latest - now, math.max(ttl, 1))
