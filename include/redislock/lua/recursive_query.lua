-- Whether anyone holds a reentrant lock, for how long, and how many entries one owner holds in
-- it: basic_recursive_mutex::is_locked(), holder_ttl() and hold_count(). Reads only.
-- Layout: see recursive_acquire.lua. An owner holds the lock when its field counts entries and
-- its field id:<owner> names the acquisition they belong to (an entry a release handed to the
-- owner's waiter included). The other fields (fence, handed:<owner>, gone:<owner>, left:<owner>,
-- firsts:<owner>) are books kept beside the entries: a hash holding only those is held by no one.
-- KEYS[1]  the lock's hash
-- ARGV[1]  the owner whose entries to count, or ''
-- Returns  {time left, count}: the holders' time left, ms (the key's: all of a holder's entries
--          share it), 0 when no one holds it, -1 when held with no expiry (a hash another program
--          wrote); the entries ARGV[1] holds
-- Errors   WRONGTYPE when KEYS[1] holds a key that is not a reentrant lock
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
    return {0, 0}
end
if kind ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'mode') == 1 then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a reentrant lock')
end
local fields = redis.call('HGETALL', KEYS[1])
local values = {}
for i = 1, #fields, 2 do
    values[fields[i]] = fields[i + 1]
end
local held, mine = false, 0
for field, value in pairs(values) do
    local count = tonumber(string.match(value, '^%d+$'))
    if count and count > 0 and values['id:' .. field] then
        held = true
        if field == ARGV[1] then
            mine = count
        end
    end
end
if not held then
    return {0, 0}
end
-- A key with under a millisecond left reads 0: still held, for at most 1 ms.
local ttl = redis.call('PTTL', KEYS[1])
return {ttl == -1 and -1 or math.max(ttl, 1), mine}
