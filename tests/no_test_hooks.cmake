# ctest no_test_hooks: cmake -DNOHOOKS=<objects> -DHOOKED=<objects> -P no_test_hooks.cmake
#
# NOHOOKS: the engine's objects compiled as a build without tests compiles
# them (no REFIT_TEST_HOOKS); none may hold a REFIT_TEST_ string.  HOOKED:
# this build's library objects; its test_hooks.c object must hold them (so
# that a scan that finds nothing is a scan that works).
foreach(obj ${NOHOOKS})
  file(STRINGS "${obj}" hits REGEX "REFIT_TEST_")
  if(hits)
    list(APPEND bad "${obj}: ${hits}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "test hooks compiled without REFIT_TEST_HOOKS:\n${bad}")
endif()
list(FILTER HOOKED INCLUDE REGEX "test_hooks")
if(NOT HOOKED)
  message(FATAL_ERROR "this build's library has no test_hooks object")
endif()
foreach(obj ${HOOKED})
  file(STRINGS "${obj}" hits REGEX "REFIT_TEST_")
  if(NOT hits)
    message(FATAL_ERROR "${obj} holds no REFIT_TEST_ name: the scan finds nothing")
  endif()
endforeach()
list(LENGTH NOHOOKS n)
message(STATUS "${n} engine objects without test hooks hold no REFIT_TEST_ name")
