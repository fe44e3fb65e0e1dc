# Defines the target redislock::hiredis from whatever hiredis the system has: hiredis 1.x
# installs a CMake package (hiredis::hiredis); Debian's 0.14 installs hiredis.pc; without
# either (or without pkg-config) the header and the library are looked up directly.
# Sets redislock_hiredis_FOUND, and redislock_hiredis_message when hiredis is missing; the caller
# decides whether that is an error, since redislock::core needs no hiredis.
#
# TLS: when hiredis_ssl (hiredis >= 1.0 built with OpenSSL) and OpenSSL are found, they are
# linked into redislock::hiredis with REDISLOCK_HAVE_TLS=1, so rediss:// works, and
# redislock_TLS_FOUND is TRUE (find_package(redislock COMPONENTS TLS) then succeeds).
# Set REDISLOCK_TLS=OFF to leave TLS out even where it is available.
# Without hiredis there is no TLS either: redislock_TLS_FOUND is FALSE.
if(TARGET redislock::hiredis)
    set(redislock_hiredis_FOUND TRUE)
    return()
endif()

if(NOT DEFINED REDISLOCK_TLS)
    set(REDISLOCK_TLS ON)
endif()

find_package(hiredis CONFIG QUIET)
if(TARGET hiredis::hiredis)
    set(redislock_hiredis_target hiredis::hiredis)
    set(redislock_hiredis_version "${hiredis_VERSION}")
else()
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
        pkg_check_modules(REDISLOCK_HIREDIS QUIET IMPORTED_TARGET GLOBAL hiredis)
    endif()
    if(TARGET PkgConfig::REDISLOCK_HIREDIS)
        set(redislock_hiredis_target PkgConfig::REDISLOCK_HIREDIS)
        set(redislock_hiredis_version "${REDISLOCK_HIREDIS_VERSION}")
    endif()
endif()
# Without a CMake package or pkg-config (a machine with only a compiler, CMake and the hiredis
# headers and library): the header and the library themselves, the version from hiredis.h.
# CMAKE_DISABLE_FIND_PACKAGE_hiredis turns this off too.
if(NOT redislock_hiredis_target AND NOT CMAKE_DISABLE_FIND_PACKAGE_hiredis)
    find_path(REDISLOCK_HIREDIS_INCLUDE_DIR hiredis/hiredis.h)
    find_library(REDISLOCK_HIREDIS_LIBRARY NAMES hiredis)
    mark_as_advanced(REDISLOCK_HIREDIS_INCLUDE_DIR REDISLOCK_HIREDIS_LIBRARY)
    if(REDISLOCK_HIREDIS_INCLUDE_DIR AND REDISLOCK_HIREDIS_LIBRARY)
        file(STRINGS ${REDISLOCK_HIREDIS_INCLUDE_DIR}/hiredis/hiredis.h redislock_hiredis_defines
             REGEX "^#define HIREDIS_(MAJOR|MINOR|PATCH) [0-9]+")
        set(redislock_hiredis_version "")
        foreach(part IN ITEMS MAJOR MINOR PATCH)
            string(REGEX REPLACE ".*#define HIREDIS_${part} ([0-9]+).*" "\\1" number
                   "${redislock_hiredis_defines}")
            list(APPEND redislock_hiredis_version ${number})
        endforeach()
        list(JOIN redislock_hiredis_version "." redislock_hiredis_version)
        add_library(redislock_hiredis_found UNKNOWN IMPORTED GLOBAL)
        set_target_properties(redislock_hiredis_found PROPERTIES
            IMPORTED_LOCATION ${REDISLOCK_HIREDIS_LIBRARY}
            INTERFACE_INCLUDE_DIRECTORIES ${REDISLOCK_HIREDIS_INCLUDE_DIR})
        set(redislock_hiredis_target redislock_hiredis_found)
        unset(redislock_hiredis_defines)
    endif()
endif()

if(NOT redislock_hiredis_target)
    set(redislock_hiredis_FOUND FALSE)
    set(redislock_TLS_FOUND FALSE)
    unset(redislock_hiredis_version)
    set(redislock_hiredis_message
        "hiredis (0.14 or 1.x) not found: install libhiredis-dev, or point CMAKE_PREFIX_PATH at a hiredis install")
    return()
endif()

add_library(redislock::hiredis INTERFACE IMPORTED GLOBAL)
target_link_libraries(redislock::hiredis INTERFACE ${redislock_hiredis_target})

# hiredis_ssl comes from the same install as hiredis: its CMake package beside hiredis's, or
# hiredis_ssl.pc. 0.14 has no TLS at all, whatever else is installed.
set(redislock_TLS_FOUND FALSE)
set(redislock_hiredis_ssl_target "")
if(REDISLOCK_TLS AND redislock_hiredis_version VERSION_GREATER_EQUAL 1.0)
    if(redislock_hiredis_target STREQUAL "hiredis::hiredis")
        find_package(hiredis_ssl CONFIG QUIET)
        if(TARGET hiredis::hiredis_ssl)
            set(redislock_hiredis_ssl_target hiredis::hiredis_ssl)
        endif()
    elseif(PkgConfig_FOUND)
        pkg_check_modules(REDISLOCK_HIREDIS_SSL QUIET IMPORTED_TARGET GLOBAL hiredis_ssl)
        if(TARGET PkgConfig::REDISLOCK_HIREDIS_SSL)
            set(redislock_hiredis_ssl_target PkgConfig::REDISLOCK_HIREDIS_SSL)
        endif()
    endif()
    # The adapter calls OpenSSL itself (certificate checks, buffered TLS bytes).
    if(redislock_hiredis_ssl_target)
        find_package(OpenSSL QUIET)
    endif()
    if(redislock_hiredis_ssl_target AND TARGET OpenSSL::SSL)
        set(redislock_TLS_FOUND TRUE)
        target_link_libraries(redislock::hiredis INTERFACE ${redislock_hiredis_ssl_target}
                                                           OpenSSL::SSL)
        target_compile_definitions(redislock::hiredis INTERFACE REDISLOCK_HAVE_TLS=1)
    endif()
endif()

if(NOT CMAKE_FIND_PACKAGE_NAME STREQUAL "redislock")
    if(redislock_TLS_FOUND)
        message(STATUS "redislock: hiredis ${redislock_hiredis_version} with TLS (rediss://)")
    else()
        message(STATUS "redislock: hiredis ${redislock_hiredis_version} without TLS "
                       "(rediss:// needs hiredis >= 1.0 built with ENABLE_SSL, and OpenSSL)")
    endif()
endif()
unset(redislock_hiredis_target)
unset(redislock_hiredis_ssl_target)
unset(redislock_hiredis_version)
set(redislock_hiredis_FOUND TRUE)
