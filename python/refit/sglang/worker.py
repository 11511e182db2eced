"""The worker side: LOADER, the function SGLang calls inside every TP worker (scheduler process) when the driver
sends update_weights_from_tensor(named_tensors=[request], load_format=LOADER).  SGLang 0.5.23 accepts a custom
loader there when the engine was started with custom_weight_loader=[LOADER] (refit.sglang.engine_args()); it runs
`dynamic_import(load_format)(model, named_tensors)` in every worker, between begin_weight_update() and
end_weight_update(), with no patch to SGLang.

The request is one uint8 tensor holding JSON: {"op", "registry", "job", "group", "version" (int or "newest"),
"timeout_ms", "transports", "mode" ("staged" | "direct"), "identity", "result" (a file path), "status_dir"}.  Each
worker keeps one refit Receiver bound to its live model (bind.SglangBinding) per (registry, job, group, mode),
created on the first request that names them.  The ops:

  update  pull into the receiver (staged: the staging arena; direct: the live parameters), then every TP worker
          learns every worker's outcome (a gloo all_gather on SGLang's TP CPU group) before any applies: all apply,
          or none does.
  stage   (staged mode; the in-flight path) start a thread that pulls the version into the staging arena and
          returns at once: SGLang's scheduler goes on generating while the thread pulls (the pull is a ctypes call:
          the GIL is released; the thread runs at nice 19 on every CPU).  The thread writes only the arena, which
          no forward pass reads, and records its outcome in status_dir/stage-rank<rank>.json.  It runs no collective:
          a gloo collective from a second thread could interleave with the scheduler's own on the same group.
  commit  (under the driver's in_place pause) wait for the staging thread, agree that every worker staged this
          version, then copy arena -> live parameters on every worker, or on none.
  abort   drop what is staged (waits for a running staging thread).
  label   nothing: the driver's second update_weights_from_tensor call of a successful commit, which carries
          SGLang's weight_version (SGLang records the label on any call it answers "Success", and a failed refit
          call is answered "Success" too: see below).

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
        self.stage = None  # _Stage: the last stage op's thread and outcome, until committed or dropped


class _Stage:
    """One staging pull in a thread of the worker (op "stage")."""

    def __init__(self, st, req, rank):
        import threading
        self.version = req.get("version", "newest")
        self.rank, self.report, self.error = rank, None, None
        self.status = os.path.join(req["status_dir"], f"stage-rank{rank}.json") if req.get("status_dir") else None
        self.t0, self.t1, self.pull_begin = time.time(), None, None
        self._write("staging")
        self.thread = threading.Thread(target=self._run, args=(st, int(req.get("timeout_ms", 60000))),
                                       name=f"refit-stage-{rank}", daemon=True)
        self.thread.start()

    def _run(self, st, timeout_ms):
        from ..core import RefitError
        try:  # polite to the scheduler: lowest priority, any CPU (a thread inherits its creator's binding, and
            # SGLang's CPU worker binds each TP rank's threads to its cores)
            import threading
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
        except (OSError, AttributeError):
            pass
        t = time.perf_counter()
        self.pull_begin = time.time()
        try:
            rep = st.rx.pull(None if self.version == "newest" else int(self.version), timeout_ms)
            self.report = {k: getattr(rep, k) for k in ("version", "bytes", "sources", "transport", "planned",
                                                        "wait_ms", "plan_ms", "transfer_ms", "verify_ms",
                                                        "total_ms")}
            self.report["pull_ms"] = (time.perf_counter() - t) * 1e3
            self.version = rep.version
        except RefitError as e:
            self.error = {"rank": self.rank, "status": e.status, "type": type(e).__name__, "detail": str(e.detail),
                          "written": "nothing was written to the live parameters (staging arena only)"}
        except Exception as e:  # must not escape the thread silently
            self.error = {"rank": self.rank, "status": -1, "type": type(e).__name__, "detail": str(e),
                          "traceback": traceback.format_exc()[-2000:],
                          "written": "nothing was written to the live parameters (staging arena only)"}
        self.t1 = time.time()
        self._write("failed" if self.error else "staged")

    def _write(self, state):
        if not self.status:
            return
        doc = {"rank": self.rank, "version": self.version, "state": state, "report": self.report,
               "error": self.error, "t0": self.t0, "t1": self.t1, "pull_begin": self.pull_begin}
        try:
            tmp = f"{self.status}.tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.status)
        except OSError:
            pass

    def record(self):
        return {"version": self.version, "report": self.report, "error": self.error, "t0": self.t0,
                "t1": self.t1, "pull_begin": self.pull_begin}


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


def _key(model, req):
    return (id(model), req["registry"], req["job"], req.get("group"), req.get("mode", "staged"))


def _error(rank, e, written="nothing was written to the live parameters"):
    from ..core import RefitError
    if isinstance(e, RefitError):
        return {"rank": rank, "status": e.status, "type": type(e).__name__, "detail": str(e.detail),
                "written": written}
    return {"rank": rank, "status": -1, "type": type(e).__name__, "detail": str(e),
            "traceback": traceback.format_exc()[-2000:], "written": written}


def _bind(model, req):
    """This model's receiver for the request's job (bound on first use; one receiver per model)."""
    key = _key(model, req)
    st = _receivers.get(key)
    if st is None:
        _forget(model)  # one receiver per model: a new job replaces the old one
        st = _receivers[key] = _State(model, req)
    return st


def _busy(model):
    """Refuses (REFIT_ERR_BUSY) while a staging thread of this model's receiver runs: it pulls into the arena."""
    for k, st in _receivers.items():
        if k[0] == id(model) and st.stage is not None and st.stage.thread.is_alive():
            from .errors import RefitSglangError
            raise RefitSglangError(f"version {st.stage.version} is still staging on this worker (job {k[2]}): "
                                   "commit or abort it first", "refit sglang receiver", -47)  # REFIT_ERR_BUSY


def _pull(model, req, rank):
    """This worker's pull: (state, report dict, None) or (state or None, None, error dict)."""
    from ..core import RefitError
    st = _receivers.get(_key(model, req))
    t0 = time.perf_counter()
    try:
        _busy(model)
        st = _bind(model, req)
        st.stage = None  # a staged, uncommitted version is overwritten by this pull (staged mode)
        want = req.get("version", "newest")
        rep = st.rx.pull(None if want == "newest" else int(want), int(req.get("timeout_ms", 60000)))
    except RefitError as e:
        written = st is not None and not st.rx.usable and st.binding.mode == "direct"
        return st, None, _error(rank, e, "the transfer had begun: direct parameters may hold a mix of versions"
                                if written else "nothing was written to the live parameters")
    except Exception as e:  # an unexpected error must not kill SGLang's scheduler either
        return st, None, _error(rank, e)
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


def _op_update(model, req, rank, tp):
    st, rep, err = _pull(model, req, rank)
    outcomes = _agree({"rank": rank, "report": rep, "error": err, "init": st.init if st is not None else None}, tp)
    failed = [o["error"] for o in outcomes if o["error"] is not None]
    if not failed:
        # Every worker applies, then all learn every worker's apply time (rank 0 writes the outcome; before this
        # second exchange it held only its own, and the other workers' reports had no apply_ms).
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
    return {"ok": not failed, "errors": failed, "workers": outcomes}


def _op_stage(model, req, rank, tp):
    st, err = _receivers.get(_key(model, req)), None
    try:
        _busy(model)
        st = _bind(model, req)
        if st.binding.mode != "staged":
            from .errors import RefitSglangError
            raise RefitSglangError("stage needs mode='staged' (a staging arena beside the live parameters); a "
                                   "direct-mode receiver pulls into the live parameters, which the engine reads")
        st.stage = _Stage(st, req, rank)
    except Exception as e:
        err = _error(rank, e)
    outcomes = _agree({"rank": rank, "error": err, "init": st.init if st is not None else None,
                       "staging": st.stage.version if err is None else None}, tp)
    failed = [o["error"] for o in outcomes if o["error"] is not None]
    return {"ok": not failed, "errors": failed, "workers": outcomes}


def _op_commit(model, req, rank, tp):
    st = _receivers.get(_key(model, req))
    stg = st.stage if st is not None else None
    want = req.get("version", "newest")
    t = time.perf_counter()
    if stg is not None and stg.thread.is_alive():
        stg.thread.join()  # the driver commits once staged (RefitSglang.wait_staged); else the pause waits here
    wait_ms = (time.perf_counter() - t) * 1e3
    err = None
    if stg is None:
        err = {"rank": rank, "status": -6, "type": "RefitSglangError", "detail": "nothing is staged",
               "written": "nothing was written to the live parameters"}  # REFIT_ERR_NOT_FOUND
    elif stg.error is not None:
        err = dict(stg.error, detail=f"staging version {stg.version} failed: {stg.error['detail']}")
    elif want != "newest" and int(want) != stg.version:
        err = {"rank": rank, "status": -6, "type": "RefitSglangError",
               "detail": f"version {stg.version} is staged, not {want}",
               "written": "nothing was written to the live parameters"}
    mine = {"rank": rank, "error": err, "wait_ms": wait_ms, "stage": stg.record() if stg is not None else None,
            "report": dict(stg.report) if stg is not None and stg.report is not None else None}
    outcomes = _agree(mine, tp)
    failed = [o["error"] for o in outcomes if o["error"] is not None]
    if not failed and len({o["stage"]["version"] for o in outcomes}) > 1:  # "newest" staged at different times
        failed = [{"rank": o["rank"], "status": -6, "type": "RefitSglangError",
                   "detail": f"has version {o['stage']['version']} staged",
                   "written": "nothing was written to the live parameters"} for o in outcomes]
        err = failed[rank]
    if not failed:
        applied = _apply(st)
        rep = dict(stg.report, **applied)
        st.reports.append(rep)
        st.stage = None
        for o, a in zip(outcomes, _agree(applied, tp)):
            o["report"].update(a)
        failed = [dict(o["report"]["apply_error"], rank=o["rank"]) for o in outcomes
                  if o["report"].get("apply_error")]
    elif err is None:
        # This worker staged it, another could not commit it: nothing applied anywhere; the receiver (which counts
        # the version as held) is dropped with what it staged, so that the next stage binds and pulls afresh.  (A
        # worker refusing for itself, e.g. another version asked, keeps what it staged.)
        _forget(model)
    return {"ok": not failed, "errors": failed, "workers": outcomes}


def _op_abort(model, req, rank, tp):
    st = _receivers.get(_key(model, req))
    stg = st.stage if st is not None else None
    if stg is not None:
        stg.thread.join()
        if stg.error is None:
            _forget(model)  # its receiver holds the staged version; the next stage binds afresh
        else:
            st.stage = None
    outcomes = _agree({"rank": rank, "error": None, "dropped": stg.version if stg is not None else None}, tp)
    return {"ok": True, "errors": [], "workers": outcomes}


_OPS = {"update": _op_update, "stage": _op_stage, "commit": _op_commit, "abort": _op_abort}


def load(model, named_tensors):
    """SGLang's custom weight loader entry (see the module docstring).  Never raises."""
    rank, tp = 0, 1
    result = None
    try:
        req = decode_request(named_tensors)
        result = req.get("result")
        op = req.get("op", "update")
        if op == "label":
            return
        if op not in _OPS:
            raise ValueError(f"unknown op {op!r}")
        rank, tp = _geometry()
        doc = _OPS[op](model, req, rank, tp)
        doc["op"] = op
        doc["request"] = {k: v for k, v in req.items() if k != "result"}
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
