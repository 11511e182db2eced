# The programs beside the library: refit (tools/) and refit-bench
# (bench/refit_bench/), and the helper library they share (tools/common/).

# refit_tool_common: tool_fail, tool_usage, JSON strings, GPU records, the
# sibling program's path.  Exports nothing; not part of librefit.
add_library(refit_tool_common STATIC ${CMAKE_SOURCE_DIR}/tools/common/tool_common.c ${CMAKE_SOURCE_DIR}/tools/common/tool_proc.c
            ${CMAKE_SOURCE_DIR}/tools/common/tool_netns.c)
target_include_directories(refit_tool_common PUBLIC ${CMAKE_SOURCE_DIR}/tools/common ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_common PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit_tool_common PRIVATE _GNU_SOURCE "REFIT_UCX_CUDA_STATUS=\"${REFIT_UCX_CUDA_STATUS}\"")

# refit_tool_pure: internal code with no state, built a second time for the
# programs that link librefit.so (whose copy is not exported): the strict
# JSON reader and the growable arrays it uses (src/util/json.c, util.c),
# random bytes (src/util/crypto.c), the in-process plan executor of
# `refit plan --execute` and preflight (src/plan/local.c, on the public API),
# and the fleet's scheduling rules that `refit simulate` runs
# (src/engine/fleet_rules.c: pure functions of the scheduling state).
add_library(refit_tool_pure STATIC ${CMAKE_SOURCE_DIR}/src/util/json.c ${CMAKE_SOURCE_DIR}/src/util/util.c
            ${CMAKE_SOURCE_DIR}/src/util/crypto.c ${CMAKE_SOURCE_DIR}/src/plan/local.c
            ${CMAKE_SOURCE_DIR}/src/engine/fleet_rules.c)
target_include_directories(refit_tool_pure PRIVATE ${CMAKE_SOURCE_DIR}/src PUBLIC ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_pure PRIVATE ${REFIT_WARNINGS} -fvisibility=hidden)
target_compile_definitions(refit_tool_pure PRIVATE _GNU_SOURCE)

# refit: the command, linked against librefit.so and the helpers above; it
# includes internal headers (-I src) only for those helpers and the
# simulator (src/sim, which runs src/engine/fleet_rules.c).  hiredis: the
# clock check of `refit preflight` asks a Redis registry for its time.
file(GLOB REFIT_TOOL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tools/*.c ${CMAKE_SOURCE_DIR}/src/sim/*.c)
add_executable(refit ${REFIT_TOOL_SOURCES})
target_include_directories(refit PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_options(refit PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit PRIVATE _GNU_SOURCE)
target_link_libraries(refit PRIVATE refit_tool_common refit_tool_pure refit_shared m)
if(TARGET PkgConfig::REFIT_PC_REDIS AND "REFIT_HAVE_REDIS" IN_LIST REFIT_OPTIONAL_DEFS)
  target_compile_definitions(refit PRIVATE REFIT_HAVE_REDIS)
  target_link_libraries(refit PRIVATE PkgConfig::REFIT_PC_REDIS)
endif()
set_target_properties(refit PROPERTIES BUILD_RPATH ${CMAKE_BINARY_DIR})

# refit-bench: every benchmark scenario, on the public API only: no -I src,
# no REFIT_HAVE_* definitions, linked against librefit.so (a symbol the
# library does not export fails the link; test public_api_bench checks the
# undefined symbols as well).
file(GLOB REFIT_BENCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/refit_bench/*.c)
add_executable(refit-bench ${REFIT_BENCH_SOURCES})
target_compile_options(refit-bench PRIVATE $<$<COMPILE_LANGUAGE:C>:${REFIT_WARNINGS}>)
target_compile_definitions(refit-bench PRIVATE _GNU_SOURCE)
target_link_libraries(refit-bench PRIVATE refit_tool_common refit_tool_pure refit_shared m)
# The GPU scenarios' baselines (bench/refit_bench/gpu_baseline.cu: peer copy,
# d2d copy, NCCL pack + broadcast + unpack) on the CUDA runtime; nccl.h when
# CMakeLists.txt found it (the library itself is dlopened at run time).
if(REFIT_CUDA_ENABLED)
  target_sources(refit-bench PRIVATE ${CMAKE_SOURCE_DIR}/bench/refit_bench/gpu_baseline.cu)
  target_compile_definitions(refit-bench PRIVATE BENCH_HAVE_CUDA)
  target_compile_options(refit-bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  target_link_libraries(refit-bench PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS})
  if(REFIT_NCCL_FOUND)
    target_include_directories(refit-bench PRIVATE ${REFIT_NCCL_INCLUDE_DIR})
    target_compile_definitions(refit-bench PRIVATE BENCH_HAVE_NCCL "BENCH_NCCL_LIBRARY=\"${REFIT_NCCL_LIBRARY}\"")
  endif()
endif()
set_target_properties(refit-bench PROPERTIES BUILD_RPATH ${CMAKE_BINARY_DIR})

# Installed beside each other (`refit bench` runs the refit-bench next to
# refit), both finding librefit.so in the prefix's library directory.
set_target_properties(refit refit-bench PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
if(NOT SKBUILD)
  install(TARGETS refit-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
endif()
