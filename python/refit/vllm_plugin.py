"""The former entry point refit.vllm_plugin:register, kept because an installed refit whose metadata predates
refit.vllm.plugin (an editable install made before the split: its entry point is written at install time) still
names this path.  Imports nothing heavy."""
from .vllm.plugin import BACKEND_NAME, register

__all__ = ["BACKEND_NAME", "register"]
