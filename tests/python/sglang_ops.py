"""Test-only custom weight loaders for tests/python/sglang_driver.py: SGLang runs them inside every TP worker (as
it runs refit.sglang.worker.load) when the engine lists them in custom_weight_loader.  They write nothing to the
model and never raise (an exception in a custom loader kills SGLang's scheduler).

    dump   request {"dir": D}: every named parameter and buffer of the live model, cloned, saved with torch.save to
           D/rank-<tp rank>.pt; errors go to D/rank-<tp rank>.err
"""
import json
import os
import traceback

import torch

DUMP = "sglang_ops.dump"


def request(d: str):
    data = bytearray(json.dumps({"dir": d}).encode())
    return [("sglang_ops.request", torch.frombuffer(data, dtype=torch.uint8).clone())]


def dump(model, named_tensors):
    d, rank = None, 0
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group
        rank = get_tp_group().rank_in_group
        t = dict(named_tensors)["sglang_ops.request"]
        d = json.loads(bytes(t.contiguous().numpy().tobytes()).decode())["dir"]
        state = {}
        with torch.no_grad():
            for n, p in model.named_parameters():
                state["param:" + n] = p.detach().clone()
            for n, b in model.named_buffers():
                state["buffer:" + n] = b.detach().clone()
        os.makedirs(d, exist_ok=True)
        torch.save(state, os.path.join(d, f"rank-{rank}.pt"))
    except Exception:
        if d:
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, f"rank-{rank}.err"), "w") as f:
                    f.write(traceback.format_exc())
            except OSError:
                pass
