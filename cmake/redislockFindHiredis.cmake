# Defines the target redislock::hiredis from whatever hiredis the system has: hiredis 1.x
# installs a CMake package (hiredis::hiredis); Debian's 0.14 installs only hiredis.pc.
# Sets redislock_hiredis_FOUND, and redislock_hiredis_message when hiredis is missing; the caller
# decides whether that is an error, since redislock::core needs no hiredis.
if(TARGET redislock::hiredis)
    set(redislock_hiredis_FOUND TRUE)
    return()
endif()

find_package(hiredis CONFIG QUIET)
if(TARGET hiredis::hiredis)
    set(redislock_hiredis_target hiredis::hiredis)
else()
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
        pkg_check_modules(REDISLOCK_HIREDIS QUIET IMPORTED_TARGET GLOBAL hiredis)
    endif()
    if(TARGET PkgConfig::REDISLOCK_HIREDIS)
        set(redislock_hiredis_target PkgConfig::REDISLOCK_HIREDIS)
    endif()
endif()

if(NOT redislock_hiredis_target)
    set(redislock_hiredis_FOUND FALSE)
    set(redislock_hiredis_message
        "hiredis (0.14 or 1.x) not found: install libhiredis-dev, or point CMAKE_PREFIX_PATH at a hiredis install")
    return()
endif()

add_library(redislock::hiredis INTERFACE IMPORTED GLOBAL)
target_link_libraries(redislock::hiredis INTERFACE ${redislock_hiredis_target})
unset(redislock_hiredis_target)
set(redislock_hiredis_FOUND TRUE)
