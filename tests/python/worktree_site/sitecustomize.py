"""On PYTHONPATH (with the checkout's python/ before it), this makes `import refit` load the checkout's package in a
venv where refit is installed in editable mode from another checkout: scikit-build-core's editable install puts a
meta path finder at the front of sys.meta_path (a .pth file, at every interpreter start), which wins over
PYTHONPATH; this drops that finder for the `refit` package.  Used by tests/python/test_vllm_inflight.py and
bench/inflight-vllm-cpu.sh (their engines' worker processes inherit PYTHONPATH)."""
import sys

sys.meta_path[:] = [f for f in sys.meta_path
                    if not (type(f).__name__.startswith("ScikitBuild") and "refit" in repr(vars(f)))]
