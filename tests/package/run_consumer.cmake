# Builds and runs a tiny consumer of redislock:
#   MODE=installed     find_package(redislock CONFIG REQUIRED) against an installed copy
#   MODE=pkgconfig     the compiler alone, with `pkg-config --cflags --libs redislock`, against an
#                      installed copy
#   MODE=core          a copy configured and installed without hiredis, used through
#                      redislock::core with a connection of the consumer's own
#   MODE=core_full     the same consumer, without hiredis, of a copy installed with hiredis
#   MODE=subdirectory  add_subdirectory of the source tree
#   MODE=fetchcontent  FetchContent of the source tree
# VERSION is the project's version, which the installed package must report.
# PREFIX_PATH: the CMAKE_PREFIX_PATH of the build under test, with '|' between entries, so that
# the redislock configure and the consumers find the same hiredis (and TLS or not) as that build.
# It reaches them through the environment: a list in a -D argument would be split into separate
# arguments on its way through run().
if(PREFIX_PATH)
    if(WIN32)
        set(path_separator ";")
    else()
        set(path_separator ":")
    endif()
    string(REPLACE "|" "${path_separator}" prefix_path "${PREFIX_PATH}")
    if(DEFINED ENV{CMAKE_PREFIX_PATH} AND NOT "$ENV{CMAKE_PREFIX_PATH}" STREQUAL "")
        string(APPEND prefix_path "${path_separator}$ENV{CMAKE_PREFIX_PATH}")
    endif()
    set(ENV{CMAKE_PREFIX_PATH} "${prefix_path}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
    execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE result
                    OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "failed: ${ARGN}\n${out}")
    endif()
    set(output "${out}" PARENT_SCOPE)
endfunction()

string(REGEX MATCH "^[0-9]+" version_major "${VERSION}")
set(prefix ${WORK_DIR}/prefix)

# The core modes hide hiredis from both ways it is looked for (its CMake package and pkg-config):
# from the redislock configure (MODE=core) and from the consumer (both core modes).
set(hide_hiredis -DCMAKE_DISABLE_FIND_PACKAGE_hiredis=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON)

if(MODE MATCHES "^(installed|pkgconfig|core|core_full)$")
    # Configured with nothing else set, as a user installing it would.
    set(configure_hiding "")
    if(MODE STREQUAL "core")
        set(configure_hiding ${hide_hiredis})
    endif()
    run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/redislock-build
        -DCMAKE_CXX_COMPILER=${CXX} ${configure_hiding})
    if(MODE STREQUAL "core" AND NOT output MATCHES "only redislock::core is available")
        message(FATAL_ERROR "configuring without hiredis did not say so:\n${output}")
    endif()
    # No build step: a header-only install needs none.
    run(${CMAKE_COMMAND} --install ${WORK_DIR}/redislock-build --prefix ${prefix})
    # Without hiredis the pkg-config file must not require it.
    file(GLOB_RECURSE pc_file ${prefix}/redislock.pc)
    file(READ "${pc_file}" pc_text)
    if(MODE STREQUAL "core" AND pc_text MATCHES "Requires:[^\n]*hiredis")
        message(FATAL_ERROR "redislock.pc of an install without hiredis requires it:\n${pc_text}")
    elseif(NOT MODE STREQUAL "core" AND NOT pc_text MATCHES "Requires: hiredis")
        message(FATAL_ERROR "redislock.pc does not require hiredis:\n${pc_text}")
    endif()
endif()

if(MODE STREQUAL "pkgconfig")
    find_program(PKG_CONFIG_EXECUTABLE pkg-config REQUIRED)
    file(GLOB_RECURSE pc_file ${prefix}/redislock.pc)
    if(NOT pc_file)
        message(FATAL_ERROR "redislock.pc was not installed under ${prefix}")
    endif()
    get_filename_component(pc_dir ${pc_file} DIRECTORY)
    set(pkg_config ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} ${PKG_CONFIG_EXECUTABLE})
    run(${pkg_config} --modversion redislock)
    string(STRIP "${output}" pc_version)
    if(NOT pc_version STREQUAL VERSION)
        message(FATAL_ERROR "pkg-config reports version ${pc_version}, the project is ${VERSION}")
    endif()
    # The include directory is found relative to the .pc file, wherever the prefix is.
    run(${pkg_config} --variable=includedir redislock)
    string(STRIP "${output}" pc_includedir)
    get_filename_component(pc_includedir "${pc_includedir}" REALPATH)
    get_filename_component(expected_includedir "${prefix}/include" REALPATH)
    if(NOT pc_includedir STREQUAL expected_includedir)
        message(FATAL_ERROR
            "pkg-config includedir ${pc_includedir}, expected ${expected_includedir}")
    endif()
    run(${pkg_config} --cflags --libs redislock)
    string(STRIP "${output}" flags)
    if(NOT flags MATCHES "-pthread" OR NOT flags MATCHES "-lhiredis")
        message(FATAL_ERROR "pkg-config flags lack -pthread or hiredis: ${flags}")
    endif()
    run(${pkg_config} --cflags redislock)
    if(NOT output MATCHES "-pthread")
        message(FATAL_ERROR "pkg-config --cflags lacks -pthread: ${output}")
    endif()
    separate_arguments(flags UNIX_COMMAND "${flags}")
    run(${CXX} -std=c++20 ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp -o ${WORK_DIR}/consumer ${flags})
    run(${WORK_DIR}/consumer)
    return()
endif()

if(MODE STREQUAL "installed")
    run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/installed -B ${WORK_DIR}/consumer-build
        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
        -DREDISLOCK_VERSION=${VERSION} -DREDISLOCK_VERSION_MAJOR=${version_major})
elseif(MODE MATCHES "^core")
    run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/core -B ${WORK_DIR}/consumer-build
        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
        -DREDISLOCK_VERSION=${VERSION} ${hide_hiredis})
else()
    # MODE=subdirectory or MODE=fetchcontent: the consumer pulls the source tree in itself.
    run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/${MODE} -B ${WORK_DIR}/consumer-build
        -DCMAKE_CXX_COMPILER=${CXX} -DREDISLOCK_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)

if(MODE MATCHES "^core")
    # The compile and link lines of the core consumer name no hiredis at all.
    file(GLOB_RECURSE build_rules ${WORK_DIR}/consumer-build/CMakeFiles/consumer.dir/flags.make
         ${WORK_DIR}/consumer-build/CMakeFiles/consumer.dir/link.txt)
    if(NOT build_rules)
        message(FATAL_ERROR "no flags.make or link.txt under ${WORK_DIR}/consumer-build")
    endif()
    foreach(rules IN LISTS build_rules)
        file(READ ${rules} content)
        if(content MATCHES "hiredis")
            message(FATAL_ERROR "${rules} mentions hiredis:\n${content}")
        endif()
    endforeach()
endif()

run(${WORK_DIR}/consumer-build/consumer)
