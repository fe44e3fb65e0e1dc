# The scripts generator refuses a script that may call Redis on a key not taken from KEYS (see
# cmake/script_keys.cmake), naming the script and the line, and embeds one that takes every key
# from KEYS, through locals and helper functions alike.
# Usage: cmake -DGENERATOR=<embed_scripts.cmake> -DWORK=<scratch dir> -P check_script_keys.cmake
if(NOT GENERATOR OR NOT WORK)
    message(FATAL_ERROR "usage: cmake -DGENERATOR=<file> -DWORK=<dir> -P check_script_keys.cmake")
endif()

function(generate result_var error_var)
    execute_process(
        COMMAND ${CMAKE_COMMAND} -DLUA_DIR=${WORK} -DOUTPUT=${WORK}/scripts.hpp -P ${GENERATOR}
        RESULT_VARIABLE result ERROR_VARIABLE error)
    set(${result_var} "${result}" PARENT_SCOPE)
    set(${error_var} "${error}" PARENT_SCOPE)
endfunction()

# refused(<name> <source> <expected line> [<piece source>]): the generator must refuse the script
# <name>.lua, naming it and the line, with the optional shared piece _piece.lua beside it.
function(refused name source line)
    file(REMOVE_RECURSE ${WORK})
    file(MAKE_DIRECTORY ${WORK})
    file(WRITE ${WORK}/${name}.lua "${source}")
    if(ARGC GREATER 3)
        file(WRITE ${WORK}/_piece.lua "${ARGV3}")
    endif()
    generate(result error)
    if(result EQUAL 0 OR NOT error MATCHES "${name}\\.lua:${line}: ")
        message(FATAL_ERROR "${name}.lua was not refused at line ${line} (exit ${result}):\n"
                            "${source}\n${error}")
    endif()
endfunction()

# Keys from ARGV, directly or through a local, a helper or a shared piece.
refused(argv_key "return redis.call('GET', ARGV[1])\n" 1)
refused(hidden_in_a_local
        "-- the queue's keys, as they once travelled\nlocal queue, lapses = ARGV[6], ARGV[7]\nreturn redis.call('EXISTS', queue)\n" 2)
refused(through_a_helper
        "local function touch(k)\n    return redis.call('DEL', k)\nend\nreturn touch(ARGV[1])\n" 4)
refused(through_two_helpers
        "local function touch(k)\n    return redis.call('DEL', k)\nend\nlocal function twice(a, b)\n    touch(a)\n    return touch(b)\nend\nreturn twice(KEYS[1], ARGV[1])\n" 8)
refused(through_a_piece "--#include _piece.lua\nlocal queue = KEYS[2]\nqueue_drop(queue, ARGV[2])\n"
        6 "local function queue_drop(q, w)\n    redis.call('DEL', q)\n    redis.call('DEL', w)\nend\n")
refused(literal_key "return redis.pcall('GET', 'orders:42')\n" 1)
refused(second_key_of_del "return redis.call('DEL', KEYS[1], ARGV[1])\n" 1)
refused(key_from_a_table "local t = {KEYS[1]}\nreturn redis.call('GET', t[1])\n" 2)
refused(reassigned "local key = KEYS[1]\nkey = ARGV[1]\nreturn redis.call('GET', key)\n" 2)
refused(declared_empty "local key\nkey = KEYS[1]\nreturn redis.call('GET', key)\n" 1)
refused(loop_variable "for _, key in ipairs(ARGV) do\n    redis.call('DEL', key)\nend\n" 1)
refused(anonymous_helper
        "local touch = function(k)\n    return redis.call('GET', k)\nend\nreturn touch(ARGV[1])\n" 1)
# Calls the check cannot follow.
refused(computed_command "local command = 'GET'\nreturn redis.call(command, KEYS[1])\n" 2)
refused(aliased_call "local call = redis.call\nreturn call('GET', ARGV[1])\n" 1)
refused(helper_as_a_value
        "local function touch(k)\n    return redis.call('GET', k)\nend\nlocal f = touch\nreturn f(ARGV[1])\n" 4)
refused(hidden_in_a_string "return loadstring(\"return redis.call('GET', ARGV[1])\")()\n" 1)
refused(keys_after_a_count "return redis.call('ZUNIONSTORE', KEYS[1], 1, ARGV[1])\n" 1)
refused(long_comment "--[[ a comment\nthe check cannot read ]]\nreturn 1\n" 1)

# Accepted: keys from KEYS, directly, through locals declared from KEYS and through helpers,
# calls that take no key, and quotes, brackets and ARGV inside strings and comments.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/_piece.lua
     "-- Helpers; a key's name ('q') in a comment, and redis.call('GET', ARGV[1]) too.\nlocal function queue_size(q)\n    return redis.call('ZCARD', q)\nend\nlocal function queue_drop(q, w, id)\n    redis.call('ZREM', q, id)\n    redis.call('ZREM', w, id)\n    return queue_size(q)\nend\n")
file(WRITE ${WORK}/good.lua
     "local queue, lapses = KEYS[2], KEYS[3]\nlocal also = queue\nlocal time = redis.call('TIME')\nif redis.call('EXISTS', KEYS[1], queue) == 0 then\n    return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\nend\n--#include _piece.lua\nlocal left = queue_drop(also, lapses, ARGV[3])\nredis.pcall('SPUBLISH', ARGV[4] .. ':x', 'it''s [done]; \\'really\\'')\nlocal kind = redis.call('TYPE', KEYS[#KEYS]).ok\nreturn redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' ' .. kind .. left .. time[1])\n")
generate(result error)
file(READ ${WORK}/scripts.hpp header)
if(NOT result EQUAL 0 OR NOT header MATCHES "inline constexpr script good\\{")
    message(FATAL_ERROR "good.lua was not embedded (exit ${result}): ${error}")
endif()
file(REMOVE_RECURSE ${WORK})
