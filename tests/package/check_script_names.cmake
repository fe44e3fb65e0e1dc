# The scripts generator embeds a script under its file name without .lua, so it refuses one whose
# name is not a C++ identifier (two.parts.lua once came out as a script named `two`).
# Usage: cmake -DGENERATOR=<embed_scripts.cmake> -DWORK=<scratch dir> -P check_script_names.cmake
if(NOT GENERATOR OR NOT WORK)
    message(FATAL_ERROR "usage: cmake -DGENERATOR=<file> -DWORK=<dir> -P check_script_names.cmake")
endif()

function(generate result_var error_var)
    execute_process(
        COMMAND ${CMAKE_COMMAND} -DLUA_DIR=${WORK} -DOUTPUT=${WORK}/scripts.hpp -P ${GENERATOR}
        RESULT_VARIABLE result ERROR_VARIABLE error)
    set(${result_var} "${result}" PARENT_SCOPE)
    set(${error_var} "${error}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/two.parts.lua "return 1\n")
generate(result error)
if(result EQUAL 0 OR NOT error MATCHES "two\\.parts\\.lua: a script's name")
    message(FATAL_ERROR "two.parts.lua was not refused (exit ${result}): ${error}")
endif()

file(REMOVE ${WORK}/two.parts.lua)
file(WRITE ${WORK}/one_part.lua "return 1\n")
generate(result error)
file(READ ${WORK}/scripts.hpp header)
if(NOT result EQUAL 0 OR NOT header MATCHES "inline constexpr script one_part\\{")
    message(FATAL_ERROR "one_part.lua was not embedded as one_part (exit ${result}): ${error}")
endif()
file(REMOVE_RECURSE ${WORK})
