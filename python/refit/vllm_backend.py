"""The former path of the vLLM backend, kept for code that imports it from here (docs before the split named
refit.vllm_backend.RefitWeightTransferEngine, RefitVllmError and realign_worker_replies).  The backend is the
refit.vllm package now; import from there."""
from .vllm.backend import RefitWeightTransferEngine
from .vllm.bind import VllmBinding
from .vllm.errors import RefitVllmError
from .vllm.executor import realign_worker_replies
from .vllm.geometry import detect_names
from .vllm.info import RefitInitInfo, RefitUpdateInfo
from .vllm.plugin import BACKEND_NAME

__all__ = ["BACKEND_NAME", "RefitInitInfo", "RefitUpdateInfo", "RefitVllmError", "RefitWeightTransferEngine",
           "VllmBinding", "detect_names", "realign_worker_replies"]
