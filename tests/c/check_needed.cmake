# check_needed.cmake -- the driver-only runtime needs neither NVRTC nor
# SQLite: reads the NEEDED entries of a program and of a library with
# readelf -d (or objdump -p), prints them, and fails when one names nvrtc
# or sqlite, or names libsparseforge itself (the program is to need
# libsparseforge_rt, and only it of the two).  Run with cmake -P and:
#   SF_READELF   readelf, or objdump
#   SF_PROGRAM   the program linked with libsparseforge_rt
#   SF_LIBRARY   libsparseforge_rt.so
foreach(var SF_READELF SF_PROGRAM SF_LIBRARY)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_needed.cmake needs -D${var}=...")
  endif()
endforeach()

# The NEEDED entries of `file`, into the list named `out`.
function(needed_of file out)
  get_filename_component(tool "${SF_READELF}" NAME)
  if(tool MATCHES "objdump")
    set(args -p)
    set(pattern "NEEDED[ \t]+([^ \t\r\n]+)")
  else()
    set(args -d)
    set(pattern "\\(NEEDED\\)[^[]*\\[([^]]+)\\]")
  endif()
  execute_process(COMMAND "${SF_READELF}" ${args} "${file}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SF_READELF} ${args} ${file} failed (${rc}): ${err}")
  endif()
  string(REGEX MATCHALL "${pattern}" lines "${text}")
  set(names)
  foreach(line ${lines})
    string(REGEX REPLACE "${pattern}" "\\1" name "${line}")
    list(APPEND names "${name}")
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

set(failed 0)
foreach(file "${SF_PROGRAM}" "${SF_LIBRARY}")
  needed_of("${file}" names)
  string(REPLACE ";" ", " shown "${names}")
  message(STATUS "NEEDED by ${file}: ${shown}")
  foreach(name ${names})
    if(name MATCHES "nvrtc|sqlite|^libsparseforge\\.so")
      message(SEND_ERROR "${file} needs ${name}: the driver-only runtime must not")
      set(failed 1)
    endif()
  endforeach()
  if(file STREQUAL "${SF_PROGRAM}" AND NOT names MATCHES "libsparseforge_rt\\.so")
    message(SEND_ERROR "${file} does not need libsparseforge_rt")
    set(failed 1)
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "the driver-only runtime links what it must not")
endif()
