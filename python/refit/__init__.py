"""refit: move LLM weights from trainer ranks (publishers) to inference ranks (receivers).

A ctypes binding over librefit.so.  `pip install ./python` builds a wheel that carries the library; it is
found through $REFIT_LIBRARY, the librefit.so next to this package, the build/ directory of the repository
(an editable install), or the system's loader path.  See docs/python.md.
"""
from ._lib import lib as _clib, library_path
from .core import (DTYPES, ArgumentTypeError, AuthError, DataError, EnvError, HfSource, HolderStat, InputError, Layout,
                   Local, Manifest, Model, PeerError, Placement, Plan, PlanStats, Publisher, PullReport, Receiver,
                   RefitError, RefitTimeout, ReplayError, SafetensorsFile, StaleError, Tensor, VerifyError,
                   default_registry, error_class, torch_dtype, wrap_memory)
from . import adapters, metrics

__all__ = ["DTYPES", "ArgumentTypeError", "AuthError", "DataError", "EnvError", "HfSource", "HolderStat", "InputError",
           "Layout", "Local", "Manifest", "Model", "PeerError", "Placement", "Plan", "PlanStats", "Publisher",
           "PullReport", "Receiver", "RefitError", "RefitTimeout", "ReplayError", "SafetensorsFile", "StaleError",
           "Tensor", "VerifyError", "adapters", "default_registry", "error_class", "features", "library_path",
           "metrics", "torch_dtype", "version", "wrap_memory"]


def version() -> str:
    """The version of the librefit.so this package loaded (refit_version())."""
    return _clib.refit_version(None, None, None).decode()


# One version for the library, its headers, CMake and the wheel: include/refit/version.h (pyproject.toml reads it).
__version__ = version()


def features() -> list:
    """The optional parts built into that library: a subset of ["shm", "ucx", "cuda", "redis"]."""
    bits = _clib.refit_features()
    return [_clib.refit_feature_name(1 << i).decode() for i in range(32) if bits >> i & 1]
