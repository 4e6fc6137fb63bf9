# cmake -DREADELF=<readelf> -DOBJECTS="<obj>;<obj>..." -P cmake/CheckIsaObjects.cmake
#
# Fails when an object compiled for one instruction set (the per-ISA builds of csrc/cpu/row_ops.cpp) runs
# code of its own before the dispatcher (csrc/cpu/dispatch.cpp) has chosen that instruction set: a dynamic
# initialiser. The loader runs every object's initialisers when _C is loaded, on any CPU, so an AVX-512
# object's constructor faults on a CPU without AVX-512 before anything is dispatched. Such an object shows
# one of:
#   - an .init_array / .ctors / .preinit_array section (the initialisers the loader calls);
#   - a _GLOBAL__sub_I_ symbol (the compiler's initialiser function of the translation unit);
#   - a _ZGV guard variable (a static or inline variable initialised at run time, on first use or at load).
# Tables are constant expressions instead (gumbel_search.h kWordThresholds). CMakeLists.txt runs this before
# _C links; tests/native/test_isa_objects.py runs it on objects with and without a planted initialiser.
if(NOT READELF OR NOT OBJECTS)
  message(FATAL_ERROR "CheckIsaObjects.cmake needs -DREADELF=<readelf> and -DOBJECTS=<objects>")
endif()
set(found "")
foreach(obj IN LISTS OBJECTS)
  execute_process(COMMAND "${READELF}" -S -s -W "${obj}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${READELF} could not read ${obj}: ${err}")
  endif()
  string(REGEX MATCHALL "\\.(init_array|preinit_array|ctors)[.A-Za-z0-9_]*|_GLOBAL__sub_I_[A-Za-z0-9_.]*|_ZGV[A-Za-z0-9_.]*"
         hits "${out}")
  if(hits)
    list(REMOVE_DUPLICATES hits)
    list(JOIN hits ", " names)
    string(APPEND found "\n  ${obj}: ${names}")
  endif()
endforeach()
if(found)
  message(FATAL_ERROR "dynamic initialisation in a per-instruction-set object (it would run before dispatch "
                      "and can fault on a CPU without that instruction set; make it a constant expression or "
                      "build it after dispatch):${found}")
endif()
