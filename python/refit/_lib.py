"""Loading librefit.so and declaring its C API for ctypes.

The library is looked for, in order: $REFIT_LIBRARY (a path to the .so: an
override, which the tests use), the librefit.so next to this package (the one
a wheel carries: `pip install ./python` builds it), the build/ directory of
the repository this package sits in (python/refit -> ../../build/librefit.so:
an editable install), and finally the system's loader path (an installed
librefit.so.0).
"""
import ctypes as C
import os

MAX_DIMS = 4


class TensorInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("ndim", C.c_uint32), ("shape", C.c_uint64 * MAX_DIMS)]


class Identity(C.Structure):
    _fields_ = [("model", C.c_char_p), ("layout", C.c_char_p), ("rank", C.c_uint32), ("world", C.c_uint32)]


class PlacementC(C.Structure):
    _fields_ = [("canon", C.c_uint32), ("local", C.c_uint32), ("ndim", C.c_uint32),
                ("canon_offset", C.c_uint64 * MAX_DIMS), ("extent", C.c_uint64 * MAX_DIMS),
                ("local_offset", C.c_uint64 * MAX_DIMS)]


class PublisherParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("registry", C.c_char_p), ("job", C.c_char_p), ("group", C.c_char_p),
                ("transports", C.c_char_p), ("transport_options", C.c_char_p), ("mode", C.c_int),
                ("heartbeat_ms", C.c_uint32), ("dead_ms", C.c_uint32), ("device", C.c_int),
                ("delta", C.c_bool), ("delta_max_pct", C.c_uint32), ("delta_threads", C.c_uint),
                ("secret_file", C.c_char_p), ("insecure", C.c_bool), ("lease_ms", C.c_uint32),
                ("no_digest", C.c_bool)]


class ReceiverParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("registry", C.c_char_p), ("job", C.c_char_p), ("group", C.c_char_p),
                ("transports", C.c_char_p), ("transport_options", C.c_char_p), ("reader", C.c_char_p),
                ("lease_ms", C.c_uint32), ("threads", C.c_uint), ("verify", C.c_int), ("device", C.c_int),
                ("relay_slot", C.c_int), ("max_readers", C.c_uint32), ("chunk_kb", C.c_uint32),
                ("relay_heartbeat_ms", C.c_uint32), ("no_delta", C.c_bool), ("truth_fraction", C.c_double),
                ("secret_file", C.c_char_p), ("insecure", C.c_bool), ("no_digest", C.c_bool), ("fp8", C.c_bool)]


class PullReportC(C.Structure):
    _fields_ = [("size", C.c_size_t), ("version", C.c_uint64), ("bytes", C.c_uint64), ("sources", C.c_uint32),
                ("planned", C.c_bool),
                ("manifests_read", C.c_uint32), ("wait_ms", C.c_double), ("discover_ms", C.c_double),
                ("plan_ms", C.c_double), ("transfer_ms", C.c_double), ("verify_ms", C.c_double),
                ("total_ms", C.c_double), ("transport", C.c_char * 32), ("lanes", C.c_char * 256),
                ("requests", C.c_uint64), ("launches", C.c_uint64), ("connect_ms", C.c_double),
                ("begin_s", C.c_double), ("end_s", C.c_double), ("transfer_begin_s", C.c_double),
                ("delta_base", C.c_uint64), ("delta_units", C.c_uint64), ("digest_bytes", C.c_uint64),
                ("unverified_bytes", C.c_uint64), ("digest_ms", C.c_double), ("stamp_ms", C.c_double),
                ("unstamped_sources", C.c_uint32), ("path", C.c_uint32),
                ("digest_fused", C.c_bool)]


class HolderStatC(C.Structure):
    _fields_ = [("size", C.c_size_t), ("name", C.c_char * 96), ("bytes", C.c_uint64), ("chunks", C.c_uint32),
                ("steals", C.c_uint32), ("failed", C.c_bool), ("early", C.c_uint32), ("ahead", C.c_uint32),
                ("late", C.c_uint32)]


class PlanParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("split_bytes", C.c_uint64), ("balance_seed", C.c_uint32),
                ("use_seed", C.c_bool), ("no_coalesce", C.c_bool)]


class PlanStatsC(C.Structure):
    _fields_ = [("size", C.c_size_t), ("bytes_written", C.c_uint64), ("bytes_read", C.c_uint64),
                ("bytes_redundant", C.c_uint64), ("bytes_fill", C.c_uint64), ("regions", C.c_size_t), ("fills", C.c_size_t), ("pieces", C.c_size_t),
                ("sources_used", C.c_size_t), ("plan_ms", C.c_double)]


class TruthReport(C.Structure):
    _fields_ = [("size", C.c_size_t), ("elements_checked", C.c_uint64), ("bytes_checked", C.c_uint64),
                ("mismatches", C.c_uint64)]


class AbiField(C.Structure):
    _fields_ = [("structure", C.c_char_p), ("field", C.c_char_p), ("offset", C.c_size_t), ("size", C.c_size_t)]


# Every structure above, by its C name: checked against the library's own
# layout (refit_abi_layout) field by field when the library loads, and by
# tests/python/test_abi.py.
STRUCTS = {"refit_tensor_info_t": TensorInfo, "refit_manifest_identity_t": Identity,
           "refit_placement_t": PlacementC, "refit_publisher_params_t": PublisherParams,
           "refit_receiver_params_t": ReceiverParams, "refit_pull_report_t": PullReportC,
           "refit_holder_stat_t": HolderStatC, "refit_plan_params_t": PlanParams,
           "refit_plan_stats_t": PlanStatsC, "refit_truth_report_t": TruthReport,
           "refit_abi_field_t": AbiField}

# The structures that begin with their own sizeof (refit/engine.h: params with a size, and sized outputs).
SIZED = (PublisherParams, ReceiverParams, PlanParams, PullReportC, HolderStatC, PlanStatsC, TruthReport)


def make(cls, **fields):
    """An instance of the ctypes structure `cls` built by field name: `size` (for the sized ones) is
    ctypes.sizeof(cls), every other field is named, the rest are 0 / NULL.  A name that is not a field of
    cls raises TypeError (ctypes itself would silently set a Python attribute)."""
    names = {f for f, *_ in cls._fields_}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
    if cls in SIZED:
        if "size" in fields:
            raise TypeError(f"{cls.__name__}.size is set from ctypes.sizeof")
        fields["size"] = C.sizeof(cls)
    out = cls()
    for name, value in fields.items():
        setattr(out, name, value)
    return out


VERSION_NEWEST = (1 << 64) - 1

P = C.c_void_p
PP = C.POINTER(C.c_void_p)
ST = C.c_int  # refit_status_t

# name: (restype, argtypes)
_API = {
    "refit_status_name": (C.c_char_p, [C.c_int]),
    "refit_rx_path_name": (C.c_char_p, [C.c_int]),
    "refit_status_message": (C.c_char_p, [C.c_int]),
    "refit_last_error": (C.c_char_p, []),
    "refit_clear_error": (None, []),
    "refit_version": (C.c_char_p, [C.POINTER(C.c_int), C.POINTER(C.c_int), C.POINTER(C.c_int)]),
    "refit_features": (C.c_uint, []),
    "refit_feature_name": (C.c_char_p, [C.c_uint]),
    "refit_now": (C.c_double, []),
    "refit_dtype_size": (C.c_size_t, [C.c_int]),
    "refit_dtype_name": (C.c_char_p, [C.c_int]),
    "refit_dtype_parse": (C.c_int, [C.c_char_p]),
    # models
    "refit_model_open": (ST, [C.c_char_p, PP]),
    "refit_model_destroy": (None, [P]),
    "refit_model_name": (C.c_char_p, [P]),
    "refit_model_num_tensors": (C.c_size_t, [P]),
    "refit_model_tensor": (ST, [P, C.c_size_t, C.POINTER(TensorInfo)]),
    "refit_model_find_tensor": (C.c_int64, [P, C.c_char_p]),
    "refit_model_total_bytes": (C.c_uint64, [P]),
    "refit_model_builtin_name": (C.c_char_p, [C.c_size_t]),
    # layouts
    "refit_layout_parse": (ST, [C.c_char_p, PP]),
    "refit_layout_destroy": (None, [P]),
    "refit_layout_string": (C.c_char_p, [P]),
    "refit_layout_world": (C.c_uint32, [P]),
    "refit_layout_check": (ST, [P, P]),
    "refit_layout_manifest": (ST, [P, P, C.c_uint32, PP]),
    # manifests
    "refit_manifest_create": (ST, [C.POINTER(Identity), PP]),
    "refit_manifest_destroy": (None, [P]),
    "refit_manifest_add_region": (ST, [P, C.c_uint64, C.POINTER(C.c_uint32)]),
    "refit_manifest_add_canonical": (ST, [P, C.POINTER(TensorInfo), C.POINTER(C.c_uint32)]),
    "refit_manifest_add_local": (ST, [P, C.POINTER(TensorInfo), C.c_uint32, C.c_uint64, C.POINTER(C.c_uint32)]),
    "refit_manifest_add_placement": (ST, [P, C.POINTER(PlacementC)]),
    "refit_manifest_finalize": (ST, [P]),
    "refit_manifest_encode": (ST, [P, PP, C.POINTER(C.c_size_t)]),
    "refit_manifest_decode": (ST, [C.c_void_p, C.c_size_t, PP]),
    "refit_manifest_identity": (None, [P, C.POINTER(Identity)]),
    "refit_manifest_signature": (C.c_uint64, [P]),
    "refit_manifest_num_regions": (C.c_uint32, [P]),
    "refit_manifest_region_size": (C.c_uint64, [P, C.c_uint32]),
    "refit_manifest_num_canonical": (C.c_uint32, [P]),
    "refit_manifest_canonical": (None, [P, C.c_uint32, C.POINTER(TensorInfo)]),
    "refit_manifest_num_locals": (C.c_uint32, [P]),
    "refit_manifest_local": (None, [P, C.c_uint32, C.POINTER(TensorInfo), C.POINTER(C.c_uint32),
                                    C.POINTER(C.c_uint64)]),
    "refit_manifest_num_placements": (C.c_uint32, [P]),
    "refit_manifest_placement": (None, [P, C.c_uint32, C.POINTER(PlacementC)]),
    # plans
    "refit_plan_create": (ST, [PP, C.c_size_t, P, C.POINTER(PlanParams), PP]),
    "refit_plan_destroy": (None, [P]),
    "refit_plan_stats": (ST, [P, C.POINTER(PlanStatsC)]),
    "refit_plan_source_bytes": (C.c_uint64, [P, C.c_uint32]),
    "refit_plan_execute_memcpy": (ST, [P, C.POINTER(PP), PP, C.c_uint]),
    # truth
    "refit_truth_fill": (ST, [P, PP, C.c_uint64]),
    "refit_truth_verify": (ST, [P, PP, C.c_uint64, C.POINTER(TruthReport)]),
    "refit_truth_fill_delta": (ST, [P, PP, C.c_uint64, C.c_double]),
    "refit_truth_verify_delta": (ST, [P, PP, C.c_uint64, C.c_double, C.POINTER(TruthReport)]),
    # safetensors
    "refit_safetensors_write": (ST, [C.c_char_p, P, PP]),
    "refit_safetensors_open": (ST, [C.c_char_p, PP]),
    "refit_safetensors_parse": (ST, [C.c_void_p, C.c_size_t, PP]),
    "refit_safetensors_close": (None, [P]),
    "refit_safetensors_count": (C.c_size_t, [P]),
    "refit_safetensors_tensor": (ST, [P, C.c_size_t, C.POINTER(TensorInfo), C.POINTER(C.c_uint64),
                                      C.POINTER(C.c_uint64)]),
    "refit_safetensors_data": (C.c_void_p, [P]),
    "refit_safetensors_size": (C.c_uint64, [P]),
    "refit_hf_source_open": (ST, [C.c_char_p, P, PP, PP]),
    "refit_hf_source_num_regions": (C.c_uint32, [P]),
    "refit_hf_source_region": (C.c_void_p, [P, C.c_uint32]),
    "refit_hf_source_file": (C.c_char_p, [P, C.c_uint32]),
    "refit_hf_source_close": (None, [P]),
    # engine
    "refit_default_registry": (C.c_char_p, []),
    "refit_struct_size": (C.c_size_t, [C.c_char_p]),
    "refit_abi_layout": (C.POINTER(AbiField), [C.POINTER(C.c_size_t)]),
    "refit_publisher_create": (ST, [C.POINTER(PublisherParams), P, PP]),
    "refit_publisher_alloc": (ST, [P, C.c_uint32, PP]),
    "refit_publisher_attach": (ST, [P, C.c_uint32, C.c_void_p]),
    "refit_publisher_publish": (ST, [P, C.c_uint64]),
    "refit_publisher_wait_readers": (ST, [P, C.c_uint64, C.c_int]),
    "refit_publisher_wait_acks": (ST, [P, C.c_uint64, C.c_uint32, C.c_int]),
    "refit_publisher_destroy": (None, [P]),
    "refit_receiver_create": (ST, [C.POINTER(ReceiverParams), P, PP]),
    "refit_receiver_alloc": (ST, [P, C.c_uint32, PP]),
    "refit_receiver_attach": (ST, [P, C.c_uint32, C.c_void_p]),
    "refit_receiver_pull": (ST, [P, C.c_uint64, C.c_int, C.POINTER(PullReportC)]),
    "refit_receiver_prepare": (ST, [P, C.c_int, C.POINTER(C.c_double)]),
    "refit_receiver_holders": (ST, [P, C.POINTER(HolderStatC), C.c_size_t, C.POINTER(C.c_size_t)]),
    "refit_receiver_committed": (C.c_uint64, [P]),
    "refit_receiver_usable": (C.c_bool, [P]),
    "refit_receiver_destroy": (None, [P]),
}


def _candidates():
    env = os.environ.get("REFIT_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("librefit.so"):
            yield os.path.join(here, name)
    repo = os.path.dirname(os.path.dirname(here))
    yield os.path.join(repo, "build", "librefit.so")
    yield "librefit.so.0"
    yield "librefit.so"


def _preload_ucx(path):
    """The wheel's librefit.so opens libucp at run time, from UCX's own wheel (libucx-cu12 or -cu13, a dependency of
    the refit wheel): load that first, as the libucx package asks of the libraries built against it (it honours
    RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY).  The library's RUNPATH ($ORIGIN/../libucx/lib) finds it too where both
    lie in one site-packages.  Other libraries (a system or build-tree librefit.so) keep the UCX they were built
    with."""
    if os.path.dirname(os.path.abspath(path)) != os.path.dirname(os.path.abspath(__file__)):
        return
    try:
        import libucx
    except ImportError:
        return  # a wheel built against the system's UCX, or without UCX
    libucx.load_library()


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            _preload_ucx(path)
            lib = C.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        for name, (res, args) in _API.items():
            fn = getattr(lib, name, None)
            if fn is None:
                continue  # an older library; calling it raises AttributeError below
            fn.restype = res
            fn.argtypes = args
        lib._refit_path = path
        return lib
    raise ImportError("refit: librefit.so not found; install the package with `pip install ./python` (it "
                      "builds the library), set REFIT_LIBRARY, or build the repository (scripts/build.sh). "
                      "Tried: " + "; ".join(tried))


lib = _load()
library_path = lib._refit_path


def abi_layout():
    """The library's layout of its public structures: {C name: (sizeof, [(field, offset, size), ...])}."""
    n = C.c_size_t()
    rows = lib.refit_abi_layout(C.byref(n))
    out = {}
    for i in range(n.value):
        row = rows[i]
        name = row.structure.decode()
        if row.field is None:
            out[name] = (row.size, [])
        else:
            out[name][1].append((row.field.decode(), row.offset, row.size))
    return out


def abi_mismatches(layout=None):
    """How the structures mirrored here differ from the library's (an empty list: they match), field by field:
    names in order, offsets and sizes, and sizeof."""
    layout = abi_layout() if layout is None else layout
    problems = []
    for name, cls in STRUCTS.items():
        if name not in layout:
            problems.append(f"{name}: not in the library's layout")
            continue
        size, fields = layout[name]
        mine = [(f, getattr(cls, f).offset, getattr(cls, f).size) for f, *_ in cls._fields_]
        if mine != fields:
            theirs = {f: (o, z) for f, o, z in fields}
            here = {f: (o, z) for f, o, z in mine}
            for f in dict.fromkeys([f for f, _, _ in fields] + [f for f, _, _ in mine]):
                if theirs.get(f) != here.get(f):
                    problems.append(f"{name}.{f}: (offset, size) {theirs.get(f)} in C, {here.get(f)} in Python")
        if size != C.sizeof(cls):
            problems.append(f"{name}: sizeof {size} in C, {C.sizeof(cls)} in Python")
    return problems


# The structures mirrored above must be the library's: a library built from
# another revision (or a field added in C and not here) would write past them,
# or Python would read the wrong bytes.
_problems = (abi_mismatches() if hasattr(lib, "refit_abi_layout")
             else ["it does not export refit_abi_layout (a library older than this package)"])
if _problems:
    raise ImportError(f"refit: {library_path} does not match this package ({'; '.join(_problems)}); rebuild the "
                      "library or reinstall the package from the same revision")
libc = C.CDLL(None)
libc.free.argtypes = [C.c_void_p]
libc.free.restype = None
