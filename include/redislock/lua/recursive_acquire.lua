-- Enters a reentrant lock: a hash whose field <owner> counts that owner's entries, and whose
-- field id:<owner> names the acquisition those entries belong to.
-- KEYS[1]  the lock's hash
-- KEYS[2]  the fencing counter (same hash slot; never expires)
-- ARGV[1]  the owner id
-- ARGV[2]  the lease, ms (set again on every entry)
-- ARGV[3]  '1' to draw a fencing token on a new acquisition
-- ARGV[4]  a fresh random id, used if this is a new acquisition
-- Returns  {1, fence, id} acquired; {2, fence, id} re-entered (fence and id of the first
--          entry); {0, holder's PTTL, ''} held by another owner. fence is 0 when none was drawn.
-- Errors   WRONGTYPE when KEYS[1] is not a reentrant lock
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
    local fence = 0
    if ARGV[3] == '1' then
        fence = redis.call('INCR', KEYS[2])
        redis.call('HSET', KEYS[1], 'fence', fence)
    end
    redis.call('HSET', KEYS[1], ARGV[1], 1, 'id:' .. ARGV[1], ARGV[4])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, fence, ARGV[4]}
end
if kind ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'mode') == 1 then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a key that is not a reentrant lock')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local fence = tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0
    return {2, fence, redis.call('HGET', KEYS[1], 'id:' .. ARGV[1]) or ''}
end
return {0, redis.call('PTTL', KEYS[1]), ''}
