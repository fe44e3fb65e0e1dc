# Installs the build BUILD_DIR under WORK_DIR twice: the component "inspect" must give a
# redislock-inspect under BINDIR that runs, and the component "development" must not.
# usage: cmake -DBUILD_DIR=<build> -DWORK_DIR=<dir> -DBINDIR=<bin dir> -DINCLUDEDIR=<include dir>
#        -P check_inspect_install.cmake
foreach(var IN ITEMS BUILD_DIR WORK_DIR BINDIR INCLUDEDIR)
    if(NOT DEFINED ${var})
        message(FATAL_ERROR "usage: cmake -DBUILD_DIR=<build> -DWORK_DIR=<dir> -DBINDIR=<bin> "
                            "-DINCLUDEDIR=<include> -P check_inspect_install.cmake")
    endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})

function(install_component component prefix)
    execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                            --component ${component}
                    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "installing the component ${component} failed:\n${out}")
    endif()
endfunction()

install_component(inspect ${WORK_DIR}/inspect)
set(tool ${WORK_DIR}/inspect/${BINDIR}/redislock-inspect)
if(NOT EXISTS ${tool})
    message(FATAL_ERROR "the component inspect did not install ${tool}")
endif()
execute_process(COMMAND ${tool} --help RESULT_VARIABLE result OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
if(NOT result EQUAL 0 OR NOT out MATCHES "usage: redislock-inspect URI NAME")
    message(FATAL_ERROR "the installed ${tool} --help gave ${result}:\n${out}")
endif()
file(GLOB_RECURSE headers ${WORK_DIR}/inspect/*.hpp)
if(headers)
    message(FATAL_ERROR "the component inspect installed headers too")
endif()

install_component(development ${WORK_DIR}/development)
if(EXISTS ${WORK_DIR}/development/${BINDIR}/redislock-inspect)
    message(FATAL_ERROR "the component development installed redislock-inspect")
endif()
if(NOT EXISTS ${WORK_DIR}/development/${INCLUDEDIR}/redislock/redislock.hpp)
    message(FATAL_ERROR "the component development did not install the headers")
endif()
message(STATUS "redislock-inspect installs as the component inspect, apart from the headers")
