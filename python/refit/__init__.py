"""refit: move LLM weights from trainer ranks (publishers) to inference ranks (receivers).

A ctypes binding over librefit.so (no compiler at install time).  The library is found through
$REFIT_LIBRARY, a librefit.so next to this package, or the build/ directory of the repository.
See python/README.md.
"""
from ._lib import library_path
from .core import (DTYPES, HfSource, Layout, Local, Manifest, Model, Placement, Plan, PlanStats, Publisher,
                   PullReport, Receiver, RefitError, SafetensorsFile, Tensor, default_registry, torch_dtype,
                   wrap_memory)
from . import adapters, metrics

__all__ = ["DTYPES", "HfSource", "Layout", "Local", "Manifest", "Model", "Placement", "Plan", "PlanStats",
           "Publisher", "PullReport", "Receiver", "RefitError", "SafetensorsFile", "Tensor", "adapters",
           "default_registry", "library_path", "metrics", "torch_dtype", "wrap_memory"]
__version__ = "0.1.0"
