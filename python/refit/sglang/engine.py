"""The driver side: RefitSglang, next to an sglang.Engine started with refit.sglang.engine_args().

    eng = sglang.Engine(model_path=..., **refit.sglang.engine_args(), ...)
    rs = refit.sglang.RefitSglang(eng, registry="file:/shared/reg", job="train")
    rep = rs.update(version=3)            # or rs.update() for the newest complete version

update() opens SGLang's weight-update session (begin_weight_update), sends one request through
update_weights_from_tensor with load_format=LOADER (every TP worker pulls its own shard with refit and all agree
before any applies: refit.sglang.worker), closes the session (end_weight_update: it runs even when the update
failed), reads the agreed outcome the workers wrote, and raises RefitSglangError naming every failed worker, or
returns the outcome (per-worker pull reports and timings).

While requests are being generated (the in-flight path; docs/sglang.md "Refit while generating"):

    rs.update(4, pause="in_place")        # pause in place (requests keep their KV cache), update, continue
    rs.stage(5)                           # pause, start every worker's staging pull, continue: returns at once
    rs.wait_staged(5)                     # SGLang generates meanwhile (status files of the staging threads)
    rs.commit(5)                          # pause in place, copy staged -> live on every worker or none,
                                          # label SGLang's weight_version "5", continue

Why the pause: SGLang's tokenizer manager runs update_weights_from_tensor and begin/end_weight_update under its
model_update_lock's writer lock unless the engine is paused (tokenizer_control_mixin.py), and every generate
request holds the reader lock for its whole life (tokenizer_manager.py), so without a pause an update waits for
every request in flight to finish.  Paused in place, those calls reach the scheduler at once, the requests keep
their KV cache, and continue_generation resumes them.  Every method has an async twin (aupdate, astage, acommit,
aabort, await_staged) to await inside the engine's event loop (eng.loop), e.g. beside eng.async_generate tasks;
the plain methods run the twin with eng.loop.run_until_complete, which also runs such tasks meanwhile."""
import asyncio
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
        self.tp = None  # learnt from the first outcome

    # ------------------------------------------------------------------ the SGLang calls

    def _run(self, coro):
        loop = self.engine.loop
        if loop.is_running():
            coro.close()
            raise RuntimeError("the engine's event loop is running (this is called from inside it): await the "
                               "async method instead (aupdate, astage, acommit, aabort, await_staged)")
        return loop.run_until_complete(coro)

    async def _send(self, req: dict, *, flush_cache: bool = False, weight_version: Optional[str] = None):
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        named = encode_request(req)
        # what Engine.update_weights_from_tensor sends (one serialized copy per TP rank), awaited here directly
        obj = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=self.engine._serialize_tensors_per_rank(named, LOADER), load_format=LOADER,
            flush_cache=flush_cache, weight_version=weight_version)
        return _ok(await self.engine.tokenizer_manager.update_weights_from_tensor(obj, None))

    async def _call(self, op: str, version, *, flush_cache: bool, pause: Optional[str], label: bool = False):
        """pause (optional) -> begin_weight_update -> op -> [label] -> end_weight_update -> continue; returns the
        agreed outcome TP rank 0 wrote, with the driver's timings, or raises RefitSglangError."""
        from sglang.srt.managers.io_struct import (BeginWeightUpdateReqInput, ContinueGenerationReqInput,
                                                   EndWeightUpdateReqInput, PauseGenerationReqInput)
        if pause not in (None, "in_place", "retract"):
            raise ValueError(f"pause={pause!r}: None, 'in_place' or 'retract' ('abort' ends the requests: pause "
                             "SGLang yourself for that)")
        tm = self.engine.tokenizer_manager
        self._n += 1
        result = os.path.join(self._dir, f"outcome-{self._n}-{op}.json")  # not a status file's name
        req = dict(self.base, op=op, version=version, result=result, status_dir=self._dir)
        t = {"t0": time.perf_counter()}
        paused = False
        sent = end = (False, "not sent")
        label_ans = None
        try:
            if pause:
                await tm.pause_generation(PauseGenerationReqInput(mode=pause))
                paused = True
            t["paused"] = time.perf_counter()
            ok, msg = _ok(await tm.begin_weight_update(BeginWeightUpdateReqInput(), None))
            if not ok:
                raise RefitSglangError(f"begin_weight_update refused: {msg}", "refit sglang update", -1)
            t["begun"] = time.perf_counter()
            try:
                sent = await self._send(req, flush_cache=flush_cache)
                t["sent"] = time.perf_counter()
                doc = self._read(result, op, version, sent)
                if label and doc["ok"]:
                    # SGLang's weight_version label, only once the workers agreed and applied: SGLang records the
                    # label of any call it answers "Success", and it answers so for a failed refit too
                    label_ans = await self._send({"op": "label"}, weight_version=str(doc["workers"][0]["report"]
                                                                                      ["version"]))
                t["labelled"] = time.perf_counter()
            finally:
                end = _ok(await tm.end_weight_update(EndWeightUpdateReqInput(), None))
                t["ended"] = time.perf_counter()
        finally:
            if paused:
                await tm.continue_generation(ContinueGenerationReqInput(torch_empty_cache=False))
            t["t1"] = time.perf_counter()
        ms = lambda a, b: (t[b] - t[a]) * 1e3 if a in t and b in t else None  # noqa: E731
        doc["driver"] = {"pause": pause, "pause_ms": ms("t0", "t1") if pause else None,
                         "pause_call_ms": ms("t0", "paused"), "begin_ms": ms("paused", "begun"),
                         "update_ms": ms("begun", "sent"), "label_ms": ms("sent", "labelled"),
                         "end_ms": ms("labelled", "ended") or ms("sent", "ended"), "total_ms": ms("t0", "t1"),
                         "sglang_answer": list(sent), "end": list(end),
                         "label_answer": list(label_ans) if label_ans else None}
        self.last = doc
        if doc.get("workers"):
            self.tp = len(doc["workers"])
        return self._check(doc, op, version, sent, end)

    def _read(self, result, op, version, sent):
        try:
            with open(result) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise RefitSglangError(f"{op} of version {version}: no outcome from TP rank 0 ({e}); SGLang answered "
                                   f"{sent[0]}, {sent[1]!r}", "refit sglang update", -1) from None
        finally:
            try:
                os.unlink(result)
            except OSError:
                pass

    def _check(self, doc, op, version, sent, end):
        what = {"update": "update to", "stage": "stage of", "commit": "commit of", "abort": "abort of"}[op]
        if not doc["ok"]:
            errs = doc["errors"]
            status = next((e["status"] for e in errs if e.get("status", -1) != -1), -1)
            keeps = {"stage": "; the live weights are untouched",
                     "abort": ""}.get(op, "; every worker keeps the weights it served before")
            raise RefitSglangError(
                f"{what} version {version} failed (job {self.base['job']}, group {self.base['group']}): "
                + " | ".join(f"worker rank {e['rank']}: {e.get('type')}: {e['detail']}; {e.get('written')}"
                             for e in errs) + keeps, "refit sglang update", status)
        if not sent[0]:
            raise RefitSglangError(f"{what} version {version}: the workers completed it but SGLang answered "
                                   f"{sent[1]!r}", "refit sglang update", -1)
        if not end[0]:
            raise RefitSglangError(f"end_weight_update refused: {end[1]}", "refit sglang update", -1)
        return doc

    # ------------------------------------------------------------------ single phase

    @staticmethod
    def _flush(flush_cache, pause):
        if flush_cache is None:
            return pause != "in_place"
        if flush_cache and pause == "in_place":
            raise ValueError("flush_cache=True with pause='in_place': SGLang refuses to flush the cache while "
                             "requests are in the running batch (the update would be answered as failed); use "
                             "pause='retract' for a flush")
        return flush_cache

    async def aupdate(self, version="newest", *, flush_cache: Optional[bool] = None, pause: Optional[str] = None):
        """One update (see update)."""
        return await self._call("update", version, flush_cache=self._flush(flush_cache, pause), pause=pause,
                                label=pause is not None)

    def update(self, version="newest", *, flush_cache: Optional[bool] = None, pause: Optional[str] = None) -> dict:
        """Pull and apply `version` on every TP worker, or on none.
        pause=None (default): SGLang runs the update once no request is in flight, and flushes its prefix cache.
        pause="in_place": the requests in flight stop with their KV cache, the update runs, SGLang's weight_version
          becomes str(version), they continue; no flush (SGLang refuses one with requests running): their KV and
          SGLang's prefix cache keep what the previous weights computed, and a new request sharing a prefix reuses
          it until the cache is flushed (eng.flush_cache() once idle; docs/sglang.md).
        pause="retract": the requests in flight go back to the waiting queue, the update runs, the cache is
          flushed, they continue, recomputing their KV (prompt and tokens so far) with the new weights."""
        return self._run(self.aupdate(version, flush_cache=flush_cache, pause=pause))

    # ------------------------------------------------------------------ two phase (staged mode)

    async def astage(self, version="newest"):
        return await self._call("stage", version, flush_cache=False, pause="in_place")

    def stage(self, version="newest") -> dict:
        """Start every worker's staging pull of `version` and return: the workers pull into their staging arenas
        in threads while SGLang generates (a short in_place pause covers the request).  The outcome says that
        every worker started; wait_staged / staged() tell when they are done."""
        return self._run(self.astage(version))

    def staged(self) -> list:
        """Each worker's staging status, from the status files its staging thread writes ({"rank", "version",
        "state": "staging" | "staged" | "failed", "report", "error"}); [] before the first stage.  The files are
        in this process's directory: every TP worker must run on this host (as on the CPU here)."""
        out = []
        for r in range(self.tp or 0):
            try:
                with open(os.path.join(self._dir, f"stage-rank{r}.json")) as f:
                    out.append(json.load(f))
            except (OSError, ValueError) as e:
                out.append({"rank": r, "version": None, "state": "unknown", "why": f"{type(e).__name__}: {e}"})
        return out

    def is_staged(self, version) -> bool:
        """True once every worker has staged `version`; RefitSglangError if a worker's staging failed."""
        st = self.staged()
        bad = [s for s in st if s["state"] == "failed"]
        if bad:
            e = bad[0]["error"] or {}
            raise RefitSglangError(f"staging version {version} failed: " + " | ".join(
                f"worker rank {s['rank']}: {(s['error'] or {}).get('detail')}" for s in bad)
                + "; the live weights are untouched", "refit sglang stage", e.get("status", -1))
        return bool(st) and all(s["state"] == "staged" and (version == "newest" or s["version"] == version)
                                for s in st)

    async def await_staged(self, version="newest", timeout_s: float = 600, poll_s: float = 0.01):
        t = time.perf_counter()
        while not self.is_staged(version):
            if time.perf_counter() - t > timeout_s:
                raise RefitSglangError(f"version {version} not staged after {timeout_s} s: {self.staged()}",
                                       "refit sglang stage", -42)
            await asyncio.sleep(poll_s)
        return self.staged()

    def wait_staged(self, version="newest", timeout_s: float = 600, poll_s: float = 0.01) -> list:
        """Waits (running the engine's event loop, so its requests progress) until every worker staged `version`."""
        return self._run(self.await_staged(version, timeout_s, poll_s))

    async def acommit(self, version="newest", *, pause: str = "in_place", flush_cache: Optional[bool] = None):
        if pause is None:
            raise ValueError("commit needs a pause ('in_place' or 'retract'): without one SGLang holds the call "
                             "until every request in flight has finished")
        return await self._call("commit", version, flush_cache=self._flush(flush_cache, pause), pause=pause,
                                label=True)

    def commit(self, version="newest", *, pause: str = "in_place", flush_cache: Optional[bool] = None) -> dict:
        """Under a pause (in_place, default, or retract: see update): every worker checks that it staged `version`
        (waiting for its staging thread if still running), all agree, then each copies its staging arena into the
        live parameters, or none does; SGLang's weight_version becomes str(version); the requests continue.  A
        refused commit leaves every worker on the weights it served; a worker that had staged the version drops
        it (stage again)."""
        return self._run(self.acommit(version, pause=pause, flush_cache=flush_cache))

    async def aabort(self):
        return await self._call("abort", None, flush_cache=False, pause="in_place")

    def abort(self) -> dict:
        """Drop what is staged (after a running staging pull ends)."""
        return self._run(self.aabort())

    def close(self):
        shutil.rmtree(self._dir, ignore_errors=True)
