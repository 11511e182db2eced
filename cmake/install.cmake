# What `cmake --install` puts under the prefix:
#   include/refit/*.h                      the public headers
#   LIBDIR/librefit.so.0.x.y (+ .so.0, .so)  the shared library, SONAME librefit.so.0
#   LIBDIR/librefit.a                      the static library
#   bin/refit                              the command-line tool
#   LIBDIR/cmake/refit/                    find_package(refit): refit::refit (shared),
#                                          refit::refit_static when its dependencies are found
#   LIBDIR/pkgconfig/refit.pc              pkg-config refit (--static for librefit.a)
# tests/install/test_install.sh installs into a temporary prefix and builds a
# program against it both ways.
#
# Built by pip (scikit-build-core sets SKBUILD), the only thing installed is
# librefit.so, into the wheel's refit/ package next to _lib.py, which loads it.
if(SKBUILD)
  install(FILES $<TARGET_FILE:refit_shared> DESTINATION refit RENAME librefit.so COMPONENT python)
  return()
endif()

include(CMakePackageConfigHelpers)
set(REFIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/refit)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/refit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(TARGETS refit_shared EXPORT refitTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev)
install(TARGETS refit_static EXPORT refitStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
if(TARGET refit)
  install(TARGETS refit RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
endif()
install(EXPORT refitTargets NAMESPACE refit:: DESTINATION ${REFIT_CMAKE_DIR} COMPONENT dev)
install(EXPORT refitStaticTargets NAMESPACE refit:: DESTINATION ${REFIT_CMAKE_DIR} COMPONENT dev)

# The static library needs what librefit.so hides: the optional libraries it
# was built with, found again by refitConfig.cmake (pkg-config names below).
set(REFIT_PC_REQUIRES_PRIVATE "")
set(REFIT_CONFIG_PKG_MODULES "")
foreach(dep REDIS UCX)
  if("REFIT_HAVE_${dep}" IN_LIST REFIT_OPTIONAL_DEFS)
    list(GET REFIT_PC_${dep}_MODULE_NAME 0 mod)
    if(NOT mod)
      set(mod ${REFIT_PC_${dep}_LIBRARIES})
    endif()
    list(APPEND REFIT_CONFIG_PKG_MODULES "REFIT_PC_${dep}=${mod}")
    string(APPEND REFIT_PC_REQUIRES_PRIVATE " ${mod}")
  endif()
endforeach()
set(REFIT_PC_LIBS_PRIVATE "-lm -lpthread")
if(REFIT_CUDA_ENABLED)
  string(APPEND REFIT_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lrt -ldl")
endif()
set(REFIT_CONFIG_NEEDS_CUDA ${REFIT_CUDA_ENABLED})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/refitConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/refitConfig.cmake INSTALL_DESTINATION ${REFIT_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/refitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/refitConfig.cmake ${CMAKE_BINARY_DIR}/refitConfigVersion.cmake
        DESTINATION ${REFIT_CMAKE_DIR} COMPONENT dev)

# refit.pc finds its prefix from where it lies (${pcfiledir}), so a tree
# installed with --prefix anywhere, or moved, still works.
file(RELATIVE_PATH REFIT_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${CMAKE_CURRENT_LIST_DIR}/refit.pc.in ${CMAKE_BINARY_DIR}/refit.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/refit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
