# Builds and runs a tiny consumer of redislock, either against an installed copy
# (MODE=installed: find_package(redislock CONFIG REQUIRED)), through add_subdirectory
# (MODE=subdirectory) or through FetchContent (MODE=fetchcontent).
# PREFIX_PATH: the CMAKE_PREFIX_PATH of the build under test, with '|' between entries. It
# reaches every configure below through the environment, so they find the same hiredis.
if(PREFIX_PATH)
    string(REPLACE "|" ":" env_prefix_path "${PREFIX_PATH}")
    set(ENV{CMAKE_PREFIX_PATH} "${env_prefix_path}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
    execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE result
                    OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "failed: ${ARGN}\n${out}")
    endif()
endfunction()

if(MODE STREQUAL "installed")
    run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/redislock-build
        -DCMAKE_CXX_COMPILER=${CXX} -DREDISLOCK_BUILD_TESTS=OFF -DREDISLOCK_BUILD_EXAMPLES=OFF
        -DREDISLOCK_BUILD_BENCHMARKS=OFF -DREDISLOCK_INSTALL=ON)
    run(${CMAKE_COMMAND} --install ${WORK_DIR}/redislock-build --prefix ${WORK_DIR}/prefix)
    run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/installed -B ${WORK_DIR}/consumer-build
        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
    # MODE=subdirectory or MODE=fetchcontent: the consumer pulls the source tree in itself.
    run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/${MODE} -B ${WORK_DIR}/consumer-build
        -DCMAKE_CXX_COMPILER=${CXX} -DREDISLOCK_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/consumer)
