"""TEST STAND-IN for SGLang's kernel package `sgl_kernel` - not the real one.

PyPI has no CPU build of sgl-kernel / sglang-kernel (CUDA wheels only), and
sglang 0.5.23 does not import on the CPU without the module
(`from sgl_kernel import copy_all_layer_kv_cache_cpu` at import time).  With
this directory first on PYTHONPATH and SGLANG_USE_CPU_ENGINE=1, SGLang takes
its plain-torch paths; the scheduler, model runner, model classes, weight
loaders and parameter layouts stay SGLang's own.

Only `assign_req_to_token_pool_cpu` is implemented (pure torch).  Every other
name SGLang imports from here is a function raising NotImplementedError naming
the kernel, so a kernel path that would need the real package fails loudly
instead of computing something else.

Which names SGLang asked for (imported) and which it called are appended to
the file named by REFIT_SGL_KERNEL_LOG, one line each: "<pid> get|call NAME",
so that a test can say which kernel paths ran.
"""

import os

import torch

__version__ = "0.0.0+refit-test-stand-in"
REFIT_TEST_STAND_IN = True


def _record(kind, name):
    path = os.environ.get("REFIT_SGL_KERNEL_LOG")
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {kind} {name}\n")
    except OSError:
        pass


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Writes each request's slice of out_cache_loc into its req_to_token row:
    row req_pool_indices[i], columns [start_offset[i], end_offset[i]), from
    out_cache_loc at the running sum of the previous requests' lengths.
    pool_len (the row length) is only checked."""
    _record("call", "assign_req_to_token_pool_cpu")
    idx = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    pos = 0
    for row, s, e in zip(idx, starts, ends):
        n = e - s
        if n <= 0:
            continue
        if e > pool_len:
            raise ValueError(f"assign_req_to_token_pool_cpu: end {e} past the row length {pool_len}")
        req_to_token[row, s:e] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n
    return None


def _missing(name):
    def kernel(*args, **kwargs):
        _record("call", name)
        raise NotImplementedError(f"sgl_kernel.{name}: not in refit's CPU test stand-in of sgl_kernel")

    kernel.__name__ = name
    kernel.__qualname__ = name
    kernel.refit_missing_kernel = True
    return kernel


def __getattr__(name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    _record("get", name)
    fn = _missing(name)
    globals()[name] = fn
    return fn


_ = torch  # the real package's import pulls torch in first; so does this one
