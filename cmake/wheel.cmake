# How the Python wheel's librefit.so differs from the system build's (python/pyproject.toml turns both on;
# scripts/build.sh leaves them off and links the system's shared hiredis and UCX, as before).
#
#   REFIT_UCX_WHEEL=ON      build against the headers of UCX's own Python wheel (libucx-cu12 / libucx-cu13, found
#                           by importing `libucx` with the build's Python) instead of the system's UCX, and open
#                           libucp at run time (dlopen, src/transport/ucx/ucx_dl.h: no DT_NEEDED on it), found
#                           as the one libucx.load_library() loaded (refit/_lib.py calls it first) or next to
#                           the installed package ($ORIGIN/../libucx/lib).  UCX finds its transport modules
#                           relative to the libucs it loaded, so they come from the same wheel.
#   REFIT_HIREDIS_STATIC=ON link hiredis's archive (libhiredis.a) into the library, its symbols hidden, so the
#                           wheel needs no libhiredis.so.
# docs/install.md says what the wheel carries and needs.
option(REFIT_UCX_WHEEL "build against UCX's Python wheel (libucx-cu12/-cu13) and load it from there" OFF)
option(REFIT_HIREDIS_STATIC "link hiredis statically (libhiredis.a) into the shared library" OFF)

# The wheel's .pc files name the prefix of the machine that built UCX; copies with the real prefix go first on
# PKG_CONFIG_PATH, so refit_optional(UCX ...) finds this UCX and nothing else changes.
function(refit_ucx_wheel_pkgconfig)
  if(NOT REFIT_UCX_WHEEL)
    return()
  endif()
  set(py ${Python_EXECUTABLE})
  if(NOT py)
    find_program(py NAMES python3 python REQUIRED)
  endif()
  execute_process(COMMAND ${py} -c "import libucx, os; print(os.path.dirname(libucx.__file__))"
                  OUTPUT_VARIABLE root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(rc OR NOT EXISTS "${root}/lib/pkgconfig/ucx.pc")
    message(FATAL_ERROR "refit: REFIT_UCX_WHEEL=ON but ${py} cannot import libucx with lib/pkgconfig/ucx.pc "
                        "(pip install libucx-cu12 or libucx-cu13 into the build environment): ${err}")
  endif()
  set(pcdir ${CMAKE_BINARY_DIR}/ucx-wheel-pkgconfig)
  file(GLOB pcs "${root}/lib/pkgconfig/*.pc")
  foreach(pc ${pcs})
    file(READ ${pc} text)
    string(REGEX REPLACE "(^|\n)prefix *=[^\n]*" "\\1prefix=${root}" text "${text}")
    get_filename_component(name ${pc} NAME)
    file(WRITE ${pcdir}/${name} "${text}")
  endforeach()
  set(ENV{PKG_CONFIG_PATH} "${pcdir}:$ENV{PKG_CONFIG_PATH}")
  message(STATUS "refit: UCX from its Python wheel at ${root}")
endfunction()

# After refit_optional(UCX ...): the wheel's library opens libucp at run time (src/transport/ucx/ucx_dl.h) rather
# than naming it as a DT_NEEDED library, which would put the wheel outside every manylinux policy; UCX's headers
# still come from the imported target.
function(refit_ucx_wheel_dlopen)
  if(NOT REFIT_UCX_WHEEL OR NOT TARGET PkgConfig::REFIT_PC_UCX)
    return()
  endif()
  set_target_properties(PkgConfig::REFIT_PC_UCX PROPERTIES INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS}"
                        INTERFACE_LINK_OPTIONS "" INTERFACE_LINK_DIRECTORIES "")
  set_property(TARGET PkgConfig::REFIT_PC_UCX APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS REFIT_UCX_DLOPEN)
endfunction()

# After refit_optional(REDIS ...): the imported target keeps hiredis's include directories and flags and links
# the archive instead; --exclude-libs keeps hiredis's symbols out of librefit.so's exports.
function(refit_hiredis_static)
  if(NOT REFIT_HIREDIS_STATIC OR NOT TARGET PkgConfig::REFIT_PC_REDIS)
    return()
  endif()
  find_library(REFIT_HIREDIS_ARCHIVE NAMES libhiredis.a HINTS ${REFIT_PC_REDIS_LIBRARY_DIRS})
  if(NOT REFIT_HIREDIS_ARCHIVE)
    message(FATAL_ERROR "refit: REFIT_HIREDIS_STATIC=ON but libhiredis.a was not found (libhiredis-dev ships it)")
  endif()
  set_target_properties(PkgConfig::REFIT_PC_REDIS PROPERTIES INTERFACE_LINK_LIBRARIES ${REFIT_HIREDIS_ARCHIVE}
                        INTERFACE_LINK_OPTIONS "LINKER:--exclude-libs,libhiredis.a")
  message(STATUS "refit: hiredis linked statically from ${REFIT_HIREDIS_ARCHIVE}")
endfunction()

# The wheel's library finds libucp in the libucx package beside refit/ in site-packages, and carries no path of
# the build machine.
function(refit_wheel_rpath target)
  if(REFIT_UCX_WHEEL)
    set_target_properties(${target} PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "\$ORIGIN/../libucx/lib")
  endif()
endfunction()
