# The programs beside the library: refit (tools/) and refit-bench
# (bench/refit_bench/), and the helper library they share (tools/common/).

# refit_tool_common: tool_fail, tool_usage, JSON strings, GPU records, the
# sibling program's path.  Exports nothing; not part of librefit.
add_library(refit_tool_common STATIC ${CMAKE_SOURCE_DIR}/tools/common/tool_common.c ${CMAKE_SOURCE_DIR}/tools/common/tool_proc.c
            ${CMAKE_SOURCE_DIR}/tools/common/tool_netns.c)
target_include_directories(refit_tool_common PUBLIC ${CMAKE_SOURCE_DIR}/tools/common ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_common PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit_tool_common PRIVATE _GNU_SOURCE "REFIT_UCX_CUDA_STATUS=\"${REFIT_UCX_CUDA_STATUS}\"")

# refit_tool_json: the library's strict JSON reader (src/util/json.c and the
# growable arrays it uses, src/util/util.c), built a second time for programs
# that link librefit.so, whose copy is not exported.  Pure code, no state.
add_library(refit_tool_json STATIC ${CMAKE_SOURCE_DIR}/src/util/json.c ${CMAKE_SOURCE_DIR}/src/util/util.c)
target_include_directories(refit_tool_json PRIVATE ${CMAKE_SOURCE_DIR}/src PUBLIC ${CMAKE_SOURCE_DIR}/include)
target_compile_options(refit_tool_json PRIVATE ${REFIT_WARNINGS} -fvisibility=hidden)
target_compile_definitions(refit_tool_json PRIVATE _GNU_SOURCE)

# refit: the command.  It still links librefit.a and includes internal
# headers (-I src): `refit simulate` runs the engine's fleet rules
# (src/engine/fleet.h), preflight the registry's leases; see docs/architecture.md.
file(GLOB REFIT_TOOL_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tools/*.c ${CMAKE_SOURCE_DIR}/src/sim/*.c)
add_executable(refit ${REFIT_TOOL_SOURCES})
target_include_directories(refit PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_options(refit PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit PRIVATE _GNU_SOURCE)
target_link_libraries(refit PRIVATE refit_tool_common refit_static)

# refit-bench: every benchmark scenario, on the public API only: no -I src,
# no REFIT_HAVE_* definitions, linked against librefit.so (a symbol the
# library does not export fails the link; test public_api_bench checks the
# undefined symbols as well).
file(GLOB REFIT_BENCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/refit_bench/*.c)
add_executable(refit-bench ${REFIT_BENCH_SOURCES})
target_compile_options(refit-bench PRIVATE ${REFIT_WARNINGS})
target_compile_definitions(refit-bench PRIVATE _GNU_SOURCE)
target_link_libraries(refit-bench PRIVATE refit_tool_common refit_tool_json refit_shared m)
set_target_properties(refit-bench PROPERTIES BUILD_RPATH ${CMAKE_BINARY_DIR})
