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
if(NOT EXISTS "${prefix}/include/sparseforge.h")
  message(FATAL_ERROR "the install put no sparseforge.h under ${prefix}/include")
endif()
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
set(exe "${SF_WORK_DIR}/build/sf_consumer")
run_step("running the outside program" ${CMAKE_COMMAND} -E env
         "LD_LIBRARY_PATH=${prefix}/lib:${prefix}/lib64:${SF_CUDA_LIBDIR}:$ENV{LD_LIBRARY_PATH}"
         "${exe}")
if(NOT step_output MATCHES "sparseforge [0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "unexpected output: ${step_output}")
endif()
message(STATUS "find_package test: ${step_output}")
