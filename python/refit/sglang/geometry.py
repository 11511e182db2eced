"""An SGLang TP worker as refit sees it: its parallel geometry, its platform and the refit model of SGLang's model.
Read from SGLang 0.5.23's own state (its parallel groups in sglang.srt.distributed.parallel_state, the model's hf
config), never from arguments the caller could get wrong."""
import json
import os
import tempfile

from ..core import Model
from .errors import RefitSglangError


def worker_geometry() -> dict:
    """tp size and rank of this worker; refuses what the vllm layout cannot describe (pipeline stages, expert
    parallel: not checked against SGLang yet, data-parallel attention)."""
    from sglang.srt.distributed import parallel_state as ps
    tpg = ps.get_tp_group()
    tp, rank = tpg.world_size, tpg.rank_in_group
    pp = ps.get_pp_group().world_size
    if pp != 1:
        raise RefitSglangError(f"pipeline parallel size {pp}: the layout has no pipeline stages; run SGLang with "
                               "pp_size=1")
    attn = ps.get_attn_tp_group().world_size
    if attn != tp:
        raise RefitSglangError(f"attention tensor parallel size {attn} differs from tp {tp} (data-parallel "
                               "attention): the vllm layout splits attention over tp; run without "
                               "enable_dp_attention")
    ep = ps.get_moe_ep_group().world_size
    if ep != 1:
        raise RefitSglangError(f"expert parallel size {ep}: refit's SGLang receiver has not been checked against "
                               "SGLang's expert placement; run with ep_size=1")
    return {"tp": tp, "rank": rank}


def platform_name() -> str:
    """"cpu" when SGLang runs on the CPU, else what torch's default device of SGLang says."""
    from sglang.srt.utils.common import is_cpu, is_cuda
    if is_cpu():
        return "cpu"
    if is_cuda():
        return "cuda"
    return "other"


def refit_model(hf_config, identity=None) -> Model:
    """The refit model spec of SGLang's model (from the model's hf config, whose _name_or_path is the directory SGLang
    loaded): its config.json, named as refit names a config directory, or `identity` when given."""
    path = getattr(hf_config, "_name_or_path", "") or ""
    cfg_file = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if cfg_file and os.path.isfile(cfg_file) and identity is None:
        return Model(path)
    if cfg_file and os.path.isfile(cfg_file):
        with open(cfg_file) as f:
            cfg = json.load(f)
    else:
        cfg = hf_config.to_dict()
    cfg["_name_or_path"] = identity or os.path.basename(path.rstrip("/")) or "model"
    with tempfile.TemporaryDirectory(prefix="refit-sglang-") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        return Model(d)
