# Regenerates version.hpp into the build tree from project(VERSION) and fails if the committed one
# differs, so the version set in CMakeLists.txt and the one compiled into users' code agree.
execute_process(COMMAND ${CMAKE_COMMAND} -DVERSION=${VERSION} -DOUTPUT=${OUTPUT}
                        -P ${CMAKE_CURRENT_LIST_DIR}/../../cmake/version_header.cmake
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
    message(FATAL_ERROR "generating the version header failed")
endif()
file(READ ${OUTPUT} regenerated)
file(READ ${COMMITTED} committed)
if(NOT regenerated STREQUAL committed)
    message(FATAL_ERROR "include/redislock/version.hpp is out of date with project(VERSION "
                        "${VERSION}): run "
                        "'cmake --build <build> --target redislock_generate_version'")
endif()
