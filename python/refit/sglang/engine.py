"""The driver side: RefitSglang, next to an sglang.Engine started with refit.sglang.engine_args().

    eng = sglang.Engine(model_path=..., **refit.sglang.engine_args(), ...)
    rs = refit.sglang.RefitSglang(eng, registry="file:/shared/reg", job="train")
    rep = rs.update(version=3)            # or rs.update() for the newest complete version

update() opens SGLang's weight-update session (begin_weight_update), sends one request through
update_weights_from_tensor with load_format=LOADER (every TP worker pulls its own shard with refit and all agree
before any applies: refit.sglang.worker), closes the session (end_weight_update: it runs even when the update
failed), reads the agreed outcome the workers wrote, and raises RefitSglangError naming every failed worker, or
returns the outcome (per-worker pull reports and timings)."""
import json
import os
import shutil
import tempfile
import time
from typing import Optional

from .errors import RefitSglangError
from .worker import LOADER, encode_request


def engine_args() -> dict:
    """The sglang.Engine / ServerArgs keywords refit needs: its custom weight loader, allowed by name."""
    return {"custom_weight_loader": [LOADER]}


def _ok(ret):
    """(success, message) of an SGLang control call's return (a tuple or an object with .success)."""
    if isinstance(ret, tuple):
        return bool(ret[0]), str(ret[1]) if len(ret) > 1 else ""
    return bool(getattr(ret, "success", ret)), str(getattr(ret, "message", ""))


class RefitSglang:
    """refit updates of one sglang.Engine (see the module docstring)."""

    def __init__(self, engine, *, registry: str, job: str, group: Optional[str] = None, timeout_ms: int = 60000,
                 transports: Optional[str] = None, mode: str = "staged", identity: Optional[str] = None):
        self.engine = engine
        self.base = {"registry": registry, "job": job, "group": group, "timeout_ms": timeout_ms,
                     "transports": transports, "mode": mode, "identity": identity}
        self._dir = tempfile.mkdtemp(prefix="refit-sglang-")
        self._n = 0
        self.last: dict = {}

    def update(self, version="newest", *, flush_cache: bool = True) -> dict:
        self._n += 1
        result = os.path.join(self._dir, f"update-{self._n}.json")
        req = dict(self.base, op="update", version=version, result=result)
        t0 = time.perf_counter()
        ok, msg = _ok(self.engine.begin_weight_update())
        if not ok:
            raise RefitSglangError(f"begin_weight_update refused: {msg}", "refit sglang update", -1)
        t1 = time.perf_counter()
        try:
            ret = self.engine.update_weights_from_tensor(named_tensors=encode_request(req), load_format=LOADER,
                                                         flush_cache=flush_cache)
        finally:
            t2 = time.perf_counter()
            end = _ok(self.engine.end_weight_update())
            t3 = time.perf_counter()
        sent_ok, sent_msg = _ok(ret)
        try:
            with open(result) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise RefitSglangError(f"update to version {version}: no outcome from TP rank 0 ({e}); SGLang answered "
                                   f"{sent_ok}, {sent_msg!r}", "refit sglang update", -1) from None
        finally:
            try:
                os.unlink(result)
            except OSError:
                pass
        doc["driver"] = {"begin_ms": (t1 - t0) * 1e3, "update_ms": (t2 - t1) * 1e3, "end_ms": (t3 - t2) * 1e3,
                         "total_ms": (t3 - t0) * 1e3, "sglang_answer": [sent_ok, sent_msg], "end": list(end)}
        self.last = doc
        if not doc["ok"]:
            errs = doc["errors"]
            status = next((e["status"] for e in errs if e.get("status", -1) != -1), -1)
            raise RefitSglangError(
                f"update to version {version} failed (job {self.base['job']}, group {self.base['group']}): "
                + " | ".join(f"worker rank {e['rank']}: {e.get('type')}: {e['detail']}; {e.get('written')}"
                             for e in errs) + "; every worker keeps the weights it served before",
                "refit sglang update", status)
        if not sent_ok:
            raise RefitSglangError(f"update to version {version}: the workers applied it but SGLang answered "
                                   f"{sent_msg!r}", "refit sglang update", -1)
        if not end[0]:
            raise RefitSglangError(f"end_weight_update refused: {end[1]}", "refit sglang update", -1)
        return doc

    def close(self):
        shutil.rmtree(self._dir, ignore_errors=True)
