-- Sets the lease of one holder of a read-write lock to ARGV[3] ms from now, if still held, unless
-- its entry has more left: another object of the owner may count on that.
-- Layout: see shared_acquire.lua.
-- KEYS[1]  the lock's hash
-- ARGV[1]  the owner id
-- ARGV[2]  'r' or 'w'
-- ARGV[3]  the new lease, ms; '0' only checks that the entry is still held
-- ARGV[4]  the acquisition id the entry belongs to
-- Returns  1 held (and extended); 0 not held (expired, never, or a later acquisition's)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local field = ARGV[2] .. ':' .. ARGV[1]
local entry = redis.call('HGET', KEYS[1], field) or ''
local count, expiry, id = string.match(entry, '^(%d+) (%d+) (%S+)$')
if not count or tonumber(expiry) <= now or id ~= ARGV[4] then
    return 0
end
local lease = tonumber(ARGV[3])
if lease > 0 then
    -- PEXPIRE first: Redis refuses HSET at out-of-memory unless the script already wrote.
    local left = math.min(redis.call('PTTL', KEYS[1]), 1099511627776)
    redis.call('PEXPIRE', KEYS[1], math.max(left, lease))
    local until_ms = math.max(math.min(tonumber(expiry), now + 1099511627776), now + lease)
    redis.call('HSET', KEYS[1], field, count .. ' ' .. until_ms .. ' ' .. id)
end
return 1
