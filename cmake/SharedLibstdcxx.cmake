# specdec_use_shared_libstdcxx(<target>...): make sure each target links libstdc++ dynamically.
#
# A GCC whose own search directory holds a dangling libstdc++.so (a relocated toolchain that is handed
# `-B<its lib dir>`, as on one H200 image: /opt/gcc) silently links libstdc++.a instead. The extension then
# carries its own copy of the stream and locale runtime beside the process's libstdc++.so.6; the two disagree
# on locale facet ids, and the first number an error message formats crashes the process (on that image) or
# goes missing from the message (here).
#
# The check links a probe shared library with the project's C++ compiler and looks for libstdc++'s stream
# symbols among the ones it defines. When the probe carries them, each target gets the shared libstdc++.so.6
# the compiler reports on its link line, ahead of the compiler's own -lstdc++, so nothing is taken from the
# archive; without such a library, configuring stops with a message that names the compiler. The probe's
# verdict is cached: -DSPECDEC_STATIC_LIBSTDCXX=OFF skips the check and the mend.
#
# tests/native/test_build_toolchain.py::test_shared_libstdcxx_module_mends_a_static_toolchain builds a project with a
# toolchain like that one, with and without this module.

function(specdec_use_shared_libstdcxx)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_NM)
    return()
  endif()
  if(NOT DEFINED SPECDEC_STATIC_LIBSTDCXX)
    set(probe_dir "${CMAKE_BINARY_DIR}/CMakeFiles/specdec_libstdcxx_probe")
    file(MAKE_DIRECTORY "${probe_dir}")
    file(WRITE "${probe_dir}/probe.cpp"
         "#include <sstream>\n#include <string>\n"
         "std::string specdec_probe(long x) { std::ostringstream o; o << x; return o.str(); }\n")
    execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -shared -fPIC -O2 probe.cpp -o libprobe.so
                    WORKING_DIRECTORY "${probe_dir}" RESULT_VARIABLE link_rc OUTPUT_QUIET ERROR_VARIABLE link_err)
    if(NOT link_rc EQUAL 0)
      message(WARNING "libstdc++ probe did not link with ${CMAKE_CXX_COMPILER} (${link_err}); not checked")
      return()
    endif()
    execute_process(COMMAND "${CMAKE_NM}" -D --defined-only libprobe.so WORKING_DIRECTORY "${probe_dir}"
                    OUTPUT_VARIABLE probe_symbols RESULT_VARIABLE nm_rc ERROR_QUIET)
    if(nm_rc EQUAL 0 AND probe_symbols MATCHES " _ZNSo9_M_insert")
      set(static ON)
    else()
      set(static OFF)
    endif()
    set(SPECDEC_STATIC_LIBSTDCXX ${static} CACHE INTERNAL "the C++ compiler links libstdc++ statically")
  endif()
  if(NOT SPECDEC_STATIC_LIBSTDCXX)
    return()
  endif()
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE shared_lib OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${shared_lib}" OR NOT EXISTS "${shared_lib}")
    message(FATAL_ERROR
            "${CMAKE_CXX_COMPILER} links libstdc++ statically into shared libraries and reports no libstdc++.so.6; "
            "the extension would crash on its first error message. Build with a compiler that links it "
            "dynamically, e.g. CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++.")
  endif()
  get_filename_component(shared_lib "${shared_lib}" REALPATH)
  foreach(target IN LISTS ARGN)
    target_link_libraries(${target} PRIVATE "${shared_lib}")
  endforeach()
  message(STATUS "${CMAKE_CXX_COMPILER} links libstdc++ statically by default; ${ARGN} link ${shared_lib}")
endfunction()
