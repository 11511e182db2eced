"""vLLM plugin (entry point group vllm.general_plugins, python/pyproject.toml): vLLM calls register() in every
process it starts (engine core, each worker) before it builds the model, so installing refit is enough for
LLM(..., weight_transfer_config={"backend": "refit"}) to find the backend.  Importing this module imports
nothing heavy (neither torch nor vLLM); the backend module (refit.vllm.backend) is loaded when vLLM creates the
engine."""

BACKEND_NAME = "refit"
BACKEND_MODULE = "refit.vllm.backend"


def register() -> None:
    """Adds the "refit" weight-transfer engine to vLLM's factory (lazily, by module path).  Safe to call more than
    once, and a no-op with a vLLM that has no weight-transfer factory."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    if BACKEND_NAME in WeightTransferEngineFactory._registry:
        return
    WeightTransferEngineFactory.register_engine(BACKEND_NAME, BACKEND_MODULE, "RefitWeightTransferEngine")
