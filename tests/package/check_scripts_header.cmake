# Regenerates the scripts header into the build tree and fails if the committed one differs.
execute_process(COMMAND ${CMAKE_COMMAND} -DLUA_DIR=${LUA_DIR} -DOUTPUT=${OUTPUT}
                        -P ${CMAKE_CURRENT_LIST_DIR}/../../cmake/embed_scripts.cmake
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
    message(FATAL_ERROR "generating the scripts header failed")
endif()
file(READ ${OUTPUT} regenerated)
file(READ ${COMMITTED} committed)
if(NOT regenerated STREQUAL committed)
    message(FATAL_ERROR "include/redislock/detail/wire/scripts.hpp is out of date with lua/*.lua: "
                        "run 'cmake --build <build> --target redislock_generate_scripts'")
endif()
