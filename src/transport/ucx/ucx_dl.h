/* libucp opened at run time instead of linked (REFIT_UCX_DLOPEN: the Python wheel, cmake/wheel.cmake), so the
 * library carries no DT_NEEDED on libucp/libucs: the wheel stays within the manylinux policy that
 * `auditwheel show` checks, and UCX comes from UCX's own wheel (libucx-cu12/-cu13, which refit/_lib.py loads
 * first) or, failing that, from the loader's path.  Every UCX function the transport calls is in the list
 * below; ucx_internal.h includes this header after <ucp/api/ucp.h>, and with REFIT_UCX_DLOPEN each name is
 * redirected to the pointer of that name.  Without REFIT_UCX_DLOPEN (the system build) the transport links
 * UCX as before and ucx_dl_load() does nothing.
 */
#ifndef REFIT_TRANSPORT_UCX_DL_H
#define REFIT_TRANSPORT_UCX_DL_H

#include <ucp/api/ucp.h>

#include "refit/status.h"

#ifdef REFIT_UCX_DLOPEN
// clang-format off (one function a line: clang-format 14 re-wraps this list differently on every run)
#define REFIT_UCX_FUNCTIONS(X)        \
    X(ucp_am_recv_data_nbx)           \
    X(ucp_am_send_nbx)                \
    X(ucp_cleanup)                    \
    X(ucp_config_modify)              \
    X(ucp_config_read)                \
    X(ucp_config_release)             \
    X(ucp_ep_close_nbx)               \
    X(ucp_ep_create)                  \
    X(ucp_ep_print_info)              \
    X(ucp_ep_rkey_unpack)             \
    X(ucp_get_nbx)                    \
    X(ucp_init_version)               \
    X(ucp_listener_create)            \
    X(ucp_listener_destroy)           \
    X(ucp_listener_query)             \
    X(ucp_listener_reject)            \
    X(ucp_mem_map)                    \
    X(ucp_mem_unmap)                  \
    X(ucp_request_check_status)       \
    X(ucp_request_free)               \
    X(ucp_rkey_buffer_release)        \
    X(ucp_rkey_destroy)               \
    X(ucp_rkey_pack)                  \
    X(ucp_worker_arm)                 \
    X(ucp_worker_create)              \
    X(ucp_worker_destroy)             \
    X(ucp_worker_get_efd)             \
    X(ucp_worker_progress)            \
    X(ucp_worker_query)               \
    X(ucp_worker_set_am_recv_handler) \
    X(ucs_status_string)
// clang-format on

/* One pointer per function, each of its function's type; filled by ucx_dl_load(). */
struct ucx_dl_functions {
#define UCX_DL_POINTER(name) __typeof__(name) *name;
    REFIT_UCX_FUNCTIONS(UCX_DL_POINTER)
#undef UCX_DL_POINTER
};
extern struct ucx_dl_functions ucx_dl;

/* Opens libucp.so.0 and resolves every function, once per process (pthread_once); later calls return the
 * first result.  REFIT_ERR_UNSUPPORTED, naming the library and dlerror(), when it cannot be loaded or lacks
 * a function (a UCX older than the one the library was built against). */
refit_status_t ucx_dl_load(void);

#ifndef REFIT_UCX_DL_IMPL
#define ucp_am_recv_data_nbx (*ucx_dl.ucp_am_recv_data_nbx)
#define ucp_am_send_nbx (*ucx_dl.ucp_am_send_nbx)
#define ucp_cleanup (*ucx_dl.ucp_cleanup)
#define ucp_config_modify (*ucx_dl.ucp_config_modify)
#define ucp_config_read (*ucx_dl.ucp_config_read)
#define ucp_config_release (*ucx_dl.ucp_config_release)
#define ucp_ep_close_nbx (*ucx_dl.ucp_ep_close_nbx)
#define ucp_ep_create (*ucx_dl.ucp_ep_create)
#define ucp_ep_print_info (*ucx_dl.ucp_ep_print_info)
#define ucp_ep_rkey_unpack (*ucx_dl.ucp_ep_rkey_unpack)
#define ucp_get_nbx (*ucx_dl.ucp_get_nbx)
/* ucp_init is an inline wrapper of ucp_init_version in ucp.h */
#define ucp_init(params, config, context) ucx_dl.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context)
#define ucp_listener_create (*ucx_dl.ucp_listener_create)
#define ucp_listener_destroy (*ucx_dl.ucp_listener_destroy)
#define ucp_listener_query (*ucx_dl.ucp_listener_query)
#define ucp_listener_reject (*ucx_dl.ucp_listener_reject)
#define ucp_mem_map (*ucx_dl.ucp_mem_map)
#define ucp_mem_unmap (*ucx_dl.ucp_mem_unmap)
#define ucp_request_check_status (*ucx_dl.ucp_request_check_status)
#define ucp_request_free (*ucx_dl.ucp_request_free)
#define ucp_rkey_buffer_release (*ucx_dl.ucp_rkey_buffer_release)
#define ucp_rkey_destroy (*ucx_dl.ucp_rkey_destroy)
#define ucp_rkey_pack (*ucx_dl.ucp_rkey_pack)
#define ucp_worker_arm (*ucx_dl.ucp_worker_arm)
#define ucp_worker_create (*ucx_dl.ucp_worker_create)
#define ucp_worker_destroy (*ucx_dl.ucp_worker_destroy)
#define ucp_worker_get_efd (*ucx_dl.ucp_worker_get_efd)
#define ucp_worker_progress (*ucx_dl.ucp_worker_progress)
#define ucp_worker_query (*ucx_dl.ucp_worker_query)
#define ucp_worker_set_am_recv_handler (*ucx_dl.ucp_worker_set_am_recv_handler)
#define ucs_status_string (*ucx_dl.ucs_status_string)
#endif
#else
static inline refit_status_t ucx_dl_load(void) { return REFIT_OK; }
#endif

#endif
