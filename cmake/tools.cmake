# The programs beside the library: refit (tools/) and refit-bench
# (bench/refit_bench/), and the helper library they share (tools/common/).

# refit_tool_common: tool_fail, tool_usage, JSON strings, GPU records, the
# sibling program's path.  Exports nothing; not part of librefit.
add_library(refit_tool_common STATIC ${CMAKE_SOURCE_DIR}/tools/common/tool_common.c ${CMAKE_SOURCE_DIR}/tools/common/tool_proc.c
            ${CMAKE_SOURCE_DIR}/tools/common/tool_netns.c)
target_include_directories(refit_tool_common PUBLIC ${CMAKE_SOURCE_DIR}/tools/common ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_common PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit_tool_common PRIVATE _GNU_SOURCE "REFIT_UCX_CUDA_STATUS=\"${REFIT_UCX_CUDA_STATUS}\"")

# refit_tool_local: synthetic sources and destinations executed in process
# (`refit plan --execute`, preflight, the tests), on the public API only.
add_library(refit_tool_local STATIC ${CMAKE_SOURCE_DIR}/tools/common/tool_local.c)
target_include_directories(refit_tool_local PUBLIC ${CMAKE_SOURCE_DIR}/tools/common ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_local PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit_tool_local PRIVATE _GNU_SOURCE)

# refit_tool_pure: internal code with no state, built a second time for the
# programs that link librefit.so (whose copy is not exported): the strict
# JSON reader and the growable arrays it uses (src/util/json.c, util.c) and
# random bytes (src/util/crypto.c) and the shm socket directory refit picks
# when not told (src/util/userdir.c, for `refit preflight`).  The programs see it through
# tools/common/tool_pure.h only; tool_pure.c checks that header against the
# library's (the one place besides refit_sim that is compiled with -I src).
add_library(refit_tool_pure STATIC ${CMAKE_SOURCE_DIR}/tools/common/tool_pure.c ${CMAKE_SOURCE_DIR}/src/util/json.c
            ${CMAKE_SOURCE_DIR}/src/util/util.c ${CMAKE_SOURCE_DIR}/src/util/crypto.c
            ${CMAKE_SOURCE_DIR}/src/util/userdir.c ${CMAKE_SOURCE_DIR}/src/util/env.c)
target_include_directories(refit_tool_pure PRIVATE ${CMAKE_SOURCE_DIR}/src PUBLIC ${CMAKE_SOURCE_DIR}/tools/common
                                                                               ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_pure PRIVATE ${REFIT_WARNINGS} -fvisibility=hidden)
target_compile_definitions(refit_tool_pure PRIVATE _GNU_SOURCE)

# refit_sim: the simulator of `refit simulate` (tools/sim/).  Its interface,
# tools/sim/sim.h, uses public types only; its sources are compiled against
# the library's internal headers (-I src, private to this target), because a
# model of the engine runs the engine's own scheduling rules
# (src/engine/fleet/fleet_rules.c, built a second time here: pure functions of the
# scheduling state, with time passed in).
file(GLOB REFIT_SIM_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tools/sim/*.c)
add_library(refit_sim STATIC ${REFIT_SIM_SOURCES} ${CMAKE_SOURCE_DIR}/src/engine/fleet/fleet_rules.c)
target_include_directories(refit_sim PRIVATE ${CMAKE_SOURCE_DIR}/src PUBLIC ${CMAKE_SOURCE_DIR}/tools/sim
                                                                         ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_sim PRIVATE ${REFIT_WARNINGS} -fvisibility=hidden)
target_compile_definitions(refit_sim PRIVATE _GNU_SOURCE)
target_link_libraries(refit_sim PRIVATE refit_tool_pure m)

# refit: the command, linked against librefit.so and the helpers above; its
# own sources include only include/refit/, tools/common/ and tools/sim/sim.h
# (no -I src: test public_api checks).  hiredis: the clock check of
# `refit preflight` asks a Redis registry for its time.
file(GLOB REFIT_TOOL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tools/*.c)
add_executable(refit ${REFIT_TOOL_SOURCES})
target_compile_options(refit PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit PRIVATE _GNU_SOURCE)
target_link_libraries(refit PRIVATE refit_sim refit_tool_common refit_tool_local refit_tool_pure refit_shared m)
if(TARGET PkgConfig::REFIT_PC_REDIS AND "REFIT_HAVE_REDIS" IN_LIST REFIT_OPTIONAL_DEFS)
  target_compile_definitions(refit PRIVATE REFIT_HAVE_REDIS)
  target_link_libraries(refit PRIVATE PkgConfig::REFIT_PC_REDIS)
endif()
set_target_properties(refit PROPERTIES BUILD_RPATH ${CMAKE_BINARY_DIR})

# refit-bench: every benchmark scenario, on the public API only: no -I src,
# no REFIT_HAVE_* definitions, linked against a librefit.so (a symbol the
# library does not export fails the link; test public_api_bench checks the
# undefined symbols as well).  Compiled once (refit_bench_obj) and linked
# twice: refit-bench in the build tree links the test flavour, librefit-test
# (its fleet scenarios emulate links on one host with the REFIT_TEST_THROTTLE
# pacing hook); shipped/refit-bench, the one `cmake --install` installs, links
# the shipped librefit and refuses those scenarios (bench/refit_bench/flavour.c,
# the one file compiled per program, says which it is).
file(GLOB REFIT_BENCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/refit_bench/*.c)
list(REMOVE_ITEM REFIT_BENCH_SOURCES ${CMAKE_SOURCE_DIR}/bench/refit_bench/flavour.c)
add_library(refit_bench_obj OBJECT ${REFIT_BENCH_SOURCES})
target_compile_options(refit_bench_obj PRIVATE $<$<COMPILE_LANGUAGE:C>:${REFIT_WARNINGS}>)
target_compile_definitions(refit_bench_obj PRIVATE _GNU_SOURCE)
target_link_libraries(refit_bench_obj PRIVATE refit_tool_common refit_tool_pure)
target_include_directories(refit_bench_obj PRIVATE ${CMAKE_SOURCE_DIR}/include)
# The GPU scenarios' baselines (bench/refit_bench/gpu_baseline.cu: peer copy,
# d2d copy, NCCL pack + broadcast + unpack) on the CUDA runtime; nccl.h when
# CMakeLists.txt found it (the library itself is dlopened at run time).
if(REFIT_CUDA_ENABLED)
  target_sources(refit_bench_obj PRIVATE ${CMAKE_SOURCE_DIR}/bench/refit_bench/gpu_baseline.cu)
  target_compile_definitions(refit_bench_obj PRIVATE BENCH_HAVE_CUDA)
  target_compile_options(refit_bench_obj PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(REFIT_NCCL_FOUND)
    target_include_directories(refit_bench_obj PRIVATE ${REFIT_NCCL_INCLUDE_DIR})
    target_compile_definitions(refit_bench_obj PRIVATE BENCH_HAVE_NCCL "BENCH_NCCL_LIBRARY=\"${REFIT_NCCL_LIBRARY}\"")
  endif()
endif()
function(refit_bench_program target library paced)
  add_executable(${target} $<TARGET_OBJECTS:refit_bench_obj> ${CMAKE_SOURCE_DIR}/bench/refit_bench/flavour.c)
  target_compile_options(${target} PRIVATE ${REFIT_WARNINGS})
  target_compile_definitions(${target} PRIVATE _GNU_SOURCE BENCH_PACED_LINKS=${paced})
  target_link_libraries(${target} PRIVATE refit_tool_common refit_tool_pure ${library} m)
  if(REFIT_CUDA_ENABLED)
    target_link_libraries(${target} PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS})
  endif()
  set_target_properties(${target} PROPERTIES BUILD_RPATH ${CMAKE_BINARY_DIR} OUTPUT_NAME refit-bench
                                             INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
endfunction()
refit_bench_program(refit-bench refit_test_shared true)
refit_bench_program(refit_bench_shipped refit_shared false)
set_target_properties(refit_bench_shipped PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/shipped)

# Installed beside each other (`refit bench` runs the refit-bench next to
# refit), both finding librefit.so in the prefix's library directory.
set_target_properties(refit PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
if(NOT SKBUILD)
  install(TARGETS refit_bench_shipped RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
endif()
