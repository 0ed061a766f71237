# run.cmake -- installs the built project into a temporary prefix, then
# configures, builds and runs the outside project in this folder against
# it.  Run with cmake -P and:
#   SF_BUILD_DIR   the sparseforge build tree to install
#   SF_SOURCE_DIR  this folder
#   SF_WORK_DIR    a scratch folder (emptied first)
#   SF_CUDA_ROOT   the CUDA toolkit (for find_dependency(CUDAToolkit))
#   SF_CUDA_LIBDIR where libnvrtc lives (for running the program)
#   SF_C_COMPILER  the C compiler to use
foreach(var SF_BUILD_DIR SF_SOURCE_DIR SF_WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${SF_WORK_DIR}")
set(prefix "${SF_WORK_DIR}/prefix")
run_step("cmake --install" ${CMAKE_COMMAND} --install "${SF_BUILD_DIR}"
         --prefix "${prefix}")
foreach(header sparseforge.h sparseforge_runtime.h)
  if(NOT EXISTS "${prefix}/include/${header}")
    message(FATAL_ERROR "the install put no ${header} under ${prefix}/include")
  endif()
endforeach()
set(config_args -S "${SF_SOURCE_DIR}" -B "${SF_WORK_DIR}/build"
    "-DCMAKE_PREFIX_PATH=${prefix}")
if(SF_CUDA_ROOT)
  list(APPEND config_args "-DCUDAToolkit_ROOT=${SF_CUDA_ROOT}")
endif()
if(SF_C_COMPILER)
  list(APPEND config_args "-DCMAKE_C_COMPILER=${SF_C_COMPILER}")
endif()
run_step("configuring the outside project" ${CMAKE_COMMAND} ${config_args})
run_step("building the outside project" ${CMAKE_COMMAND} --build
         "${SF_WORK_DIR}/build")
# Runs a program the outside project built, with `libdirs` to find the
# libraries, and checks its output matches `pattern`.
function(run_program exe libdirs pattern)
  run_step("running the outside program ${exe}" ${CMAKE_COMMAND} -E env
           "LD_LIBRARY_PATH=${libdirs}:$ENV{LD_LIBRARY_PATH}"
           "${SF_WORK_DIR}/build/${exe}")
  if(NOT step_output MATCHES "${pattern}")
    message(FATAL_ERROR "unexpected output of ${exe}: ${step_output}")
  endif()
  message(STATUS "find_package test: ${step_output}")
endfunction()

run_program(sf_consumer "${prefix}/lib:${prefix}/lib64:${SF_CUDA_LIBDIR}"
            "sparseforge [0-9]+\\.[0-9]+\\.[0-9]+")
# The driver-only program needs no CUDA library folder to run.
run_program(sf_rt_consumer "${prefix}/lib:${prefix}/lib64"
            "sparseforge_rt [0-9]+\\.[0-9]+\\.[0-9]+ grid 96 x 256 x 1")
