"""The worker side: LOADER, the function SGLang calls inside every TP worker (scheduler process) when the driver
sends update_weights_from_tensor(named_tensors=[request], load_format=LOADER).  SGLang 0.5.23 accepts a custom
loader there when the engine was started with custom_weight_loader=[LOADER] (refit.sglang.engine_args()); it runs
`dynamic_import(load_format)(model, named_tensors)` in every worker, between begin_weight_update() and
end_weight_update(), with no patch to SGLang.

The request is one uint8 tensor holding JSON: {"op": "update", "registry", "job", "group", "version" (int or
"newest"), "timeout_ms", "transports", "mode" ("staged" | "direct"), "identity", "result" (a file path)}.  Each
worker keeps one refit Receiver bound to its live model (bind.SglangBinding) per (registry, job, group, mode),
created on the first request that names them, and pulls into it; then every TP worker learns every worker's outcome
(a gloo all_gather on SGLang's TP CPU group) before any applies: all apply, or none does.

SGLang gives a custom loader no way to report a failure: its return value is dropped (the update answers
"Success"), and an exception raised in it escapes the scheduler's event loop, which then kills the engine
(run_scheduler_process sends SIGQUIT to its parent).  So this function never raises: the agreed outcome of all
workers is written by TP rank 0 as JSON to the request's "result" path (rank 0 runs on the engine's host), and the
driver (refit.sglang.engine.RefitSglang) reads it and raises RefitSglangError on failure."""
import json
import os
import time
import traceback

import torch

LOADER = "refit.sglang.worker.load"
REQUEST = "refit.request"

_receivers = {}  # (id(model), registry, job, group, mode) -> _State


class _State:
    def __init__(self, model, req):
        from ..core import Receiver
        from .bind import SglangBinding
        self.binding = b = SglangBinding(model, req.get("identity"), req.get("mode", "staged"))
        dev = self.binding.device
        self.rx = Receiver(b.manifest, registry=req["registry"], job=req["job"], group=req.get("group"),
                           transports=req.get("transports"), device=dev.index if dev.type == "cuda" else -1)
        b.attach(self.rx)
        self.init = {"layout": b.layout_str, "rank": b.geometry["rank"], "tp": b.geometry["tp"],
                     "model": b.rmodel.name, "mode": b.mode, "names": b.names, "kinds": b.kinds,
                     "regions": len(b.regions), "staging_bytes": b.staging_bytes, "init_ms": b.init_ms,
                     "package": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        self.reports = []


def decode_request(named_tensors) -> dict:
    for name, t in named_tensors:
        if name == REQUEST:
            return json.loads(bytes(t.to("cpu").contiguous().view(torch.uint8).numpy().tobytes()).decode())
    raise ValueError(f"no {REQUEST!r} tensor among {[n for n, _ in named_tensors][:8]}")


def encode_request(req: dict):
    """The request as the (name, tensor) list update_weights_from_tensor carries."""
    data = bytearray(json.dumps(req).encode())
    return [(REQUEST, torch.frombuffer(data, dtype=torch.uint8).clone())]


def _geometry():
    from sglang.srt.distributed.parallel_state import get_tp_group
    tp = get_tp_group()
    return tp.rank_in_group, tp.world_size


def _agree(outcome, tp):
    """Every TP worker's outcome, in rank order (gloo all_gather_object on SGLang's TP CPU group)."""
    import torch.distributed as dist
    if tp == 1 or not dist.is_initialized():
        return [outcome]
    from sglang.srt.distributed import get_tp_group
    out = [None] * tp
    dist.all_gather_object(out, outcome, group=get_tp_group().cpu_group)
    return out


def _forget(model):
    for k in [k for k in _receivers if k[0] == id(model)]:
        _receivers.pop(k).rx.close()


def _pull(model, req, rank):
    """This worker's pull: (state, report dict, None) or (state or None, None, error dict)."""
    from ..core import RefitError
    key = (id(model), req["registry"], req["job"], req.get("group"), req.get("mode", "staged"))
    st = _receivers.get(key)
    t0 = time.perf_counter()
    try:
        if st is None:
            _forget(model)  # one receiver per model: a new job replaces the old one
            st = _receivers[key] = _State(model, req)
        want = req.get("version", "newest")
        rep = st.rx.pull(None if want == "newest" else int(want), int(req.get("timeout_ms", 60000)))
    except RefitError as e:
        written = st is not None and not st.rx.usable and st.binding.mode == "direct"
        return st, None, {"rank": rank, "status": e.status, "type": type(e).__name__, "detail": str(e.detail),
                          "written": ("the transfer had begun: direct parameters may hold a mix of versions"
                                      if written else "nothing was written to the live parameters")}
    except Exception as e:  # an unexpected error must not kill SGLang's scheduler either
        return st, None, {"rank": rank, "status": -1, "type": type(e).__name__, "detail": str(e),
                          "traceback": traceback.format_exc()[-2000:],
                          "written": "nothing was written to the live parameters"}
    r = {k: getattr(rep, k) for k in ("version", "bytes", "sources", "transport", "planned", "wait_ms",
                                      "discover_ms", "plan_ms", "transfer_ms", "verify_ms", "total_ms", "path")}
    r["pull_ms"] = (time.perf_counter() - t0) * 1e3
    return st, r, None


def _apply(st) -> dict:
    """This worker's apply step: {"apply_ms": ms}, or with "apply_error" when the copy raised (an internal error:
    the live parameters may then hold a mix of versions, and the outcome says so)."""
    t0 = time.perf_counter()
    try:
        return {"apply_ms": st.binding.apply()}
    except Exception as e:
        return {"apply_ms": (time.perf_counter() - t0) * 1e3,
                "apply_error": {"status": -1, "type": type(e).__name__, "detail": f"apply: {e}",
                                "written": "the copy into the live parameters raised part way: this worker may "
                                           "hold a mix of versions"}}


def load(model, named_tensors):
    """SGLang's custom weight loader entry (see the module docstring).  Never raises."""
    rank, tp = 0, 1
    result = None
    try:
        req = decode_request(named_tensors)
        result = req.get("result")
        rank, tp = _geometry()
        st, rep, err = _pull(model, req, rank)
        outcomes = _agree({"rank": rank, "report": rep, "error": err,
                           "init": st.init if st is not None else None}, tp)
        failed = [o["error"] for o in outcomes if o["error"] is not None]
        if not failed:
            # Every worker applies, then all learn every worker's apply time (rank 0 writes the outcome; before
            # this second exchange it held only its own, and the other workers' reports had no apply_ms).
            applied = _apply(st)
            rep.update(applied)
            st.reports.append(rep)
            for o, a in zip(outcomes, _agree(applied, tp)):
                o["report"].update(a)
            failed = [dict(o["report"]["apply_error"], rank=o["rank"]) for o in outcomes
                      if o["report"].get("apply_error")]
        elif rep is not None:
            # This worker pulled the version but another did not, so nothing was applied: the receiver, which now
            # counts that version as held, is dropped, and the next update binds and plans afresh.
            _forget(model)
        doc = {"ok": not failed, "errors": failed, "workers": outcomes,
               "request": {k: v for k, v in req.items() if k != "result"}}
    except Exception as e:
        doc = {"ok": False, "errors": [{"rank": rank, "status": -1, "type": type(e).__name__, "detail": str(e),
                                        "traceback": traceback.format_exc()[-2000:],
                                        "written": "unknown"}], "workers": []}
    if rank == 0 and result:
        try:
            tmp = f"{result}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, result)
        except OSError:
            pass
