"""The engine: RefitWeightTransferEngine, the `refit` weight-transfer backend vLLM creates in every worker
(refit.vllm.plugin registers it).  Each worker is one refit Receiver bound to its live model (bind.VllmBinding);
an update is a pull, an agreement of every tensor-parallel worker on its outcome, then the post-load step.  A
speculative draft model is a second target (refit.vllm.draft): its own binding and receiver, made at the first
draft session (vLLM's start_draft_weight_update), updated single-phase."""
import json
import os
import re
import socket
import time
from typing import List, Optional

from vllm.distributed.weight_transfer.base import WeightTransferEngine
from vllm.logger import init_logger

from ..core import Receiver, RefitError
from .bind import VllmBinding
from .classify import moe_backend
from .draft import draft_identity, draft_kind
from .errors import RefitVllmError
from .info import RefitInitInfo, RefitUpdateInfo

logger = init_logger("vllm.refit")  # vLLM's format and level, prefixed with the worker in its log


def _agree(outcome):
    """outcome of every tensor-parallel worker of this model (gloo all_gather of small objects), in rank order."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group
    tp = get_tp_group()
    if tp.world_size == 1 or not dist.is_initialized():
        return [outcome]
    out = [None] * tp.world_size
    dist.all_gather_object(out, outcome, group=tp.cpu_group)
    return out


def _agree_fast(ok: bool, version):
    """(True, how) when every tensor-parallel worker reports ok with the same integer version: one all_reduce(MAX)
    of three integers on the gloo group, [not ok, version, -version] (no pickling, one collective, against the object
    gather's two).  (False, how) tells every worker alike to gather the outcomes for the details.  how: "all_reduce",
    or "local" where there is no other worker."""
    import torch
    import torch.distributed as dist
    from vllm.distributed import get_tp_group
    tp = get_tp_group()
    if tp.world_size == 1 or not dist.is_initialized():
        return ok, "local"
    if isinstance(version, bool) or not isinstance(version, int) or not -2**63 < version < 2**63:
        ok, version = False, -1  # not an int64 version: the gather decides, on every worker alike
    t = torch.tensor([0 if ok else 1, version, -version], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tp.cpu_group)
    return int(t[0]) == 0 and int(t[1]) == -int(t[2]) == version, "all_reduce"


def _init_report(b: VllmBinding) -> dict:
    return {"layout": b.layout_str, "rank": b.geometry["rank"], "model": b.rmodel.name, "names": b.names,
            "platform": b.platform, "classes": b.classes,
            "moe_backend": sorted({moe_backend(it.module) for it in b.items
                                   if hasattr(it.module, "global_num_experts")}),
            "regions": len(b.regions), "staging_bytes": b.staging.numel(), "init_ms": b.init_ms,
            "mla_layers": [n for n, _ in b.mla], "derived": b.derived, "buffers": b.buffers,
            "experts": {"placement": b.geometry["placement"], "eplb": b.geometry["eplb"],
                        "remapped": b.experts_remapped, "slots": b.expert_slots}}


def _update_record(rep, pull_ms: float, apply_ms: dict, apply_total_ms: float) -> dict:
    return {"version": rep.version, "bytes": rep.bytes, "sources": rep.sources, "transport": rep.transport,
            "planned": rep.planned, "wait_ms": rep.wait_ms, "discover_ms": rep.discover_ms, "plan_ms": rep.plan_ms,
            "transfer_ms": rep.transfer_ms, "verify_ms": rep.verify_ms, "pull_ms": pull_ms, "apply_ms": apply_ms,
            "apply_total_ms": apply_total_ms}


class RefitWeightTransferEngine(WeightTransferEngine[RefitInitInfo, RefitUpdateInfo]):
    """The `refit` weight-transfer backend of vLLM: one refit Receiver per worker (see refit.vllm)."""

    init_info_cls = RefitInitInfo
    update_info_cls = RefitUpdateInfo
    supports_draft_weight_update = True  # DeepSeek MTP drafts and draft models (refit.vllm.draft)

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.binding: Optional[VllmBinding] = None
        self.rx: Optional[Receiver] = None
        self.draft_binding: Optional[VllmBinding] = None  # made at the first draft session
        self.draft_rx: Optional[Receiver] = None
        self.draft_init_report: dict = {}
        self.info: Optional[RefitInitInfo] = None
        self.report: dict = {}
        self.reports: List[dict] = []
        self._session: Optional[dict] = None
        self.stager = None  # inflight.Stager with init_info stage="host"

    def init_transfer_engine(self, init_info: RefitInitInfo) -> None:
        committed = self.stager.committed if self.stager is not None else None
        if self.rx is not None:
            self.shutdown()
        two = init_info.stage == "host"
        b = VllmBinding(self._default_model, self.vllm_config, init_info.model, stage_all=two,
                        staging_budget=init_info.staging_budget, staging_hugepages=init_info.staging_hugepages)
        rx = Receiver(b.manifest, registry=init_info.registry, job=init_info.job, group=init_info.group,
                      transports=init_info.transports, transport_options=init_info.transport_options,
                      device=self._device_index(), threads=init_info.stage_threads if two else 0)
        b.attach(rx)
        if two:
            from .inflight import Stager
            try:
                self.stager = Stager(b, rx, self.vllm_config)
                self.stager.copy_mode = init_info.commit_copy
                self.stager.committed = committed  # a re-init does not change what the engine serves
            except BaseException:
                rx.close()
                raise
        self.binding, self.rx, self.info = b, rx, init_info
        self.init_report = dict(_init_report(b), stage=init_info.stage, stage_need=b.stage_need,
                                staging_hugepages=b.staging_hugepages,
                                staging_huge_bytes=self.stager.huge_bytes if two else None)
        logger.info("refit: worker rank %d is %s rank %d of %s; expert names: %s; paths: %s",
                    b.geometry["rank"], b.layout_str, b.geometry["rank"], b.rmodel.name, b.names or "none (dense)",
                    {k: v["tensors"] for k, v in b.classes.items()})

    def _device_index(self) -> int:
        dev = self.device.index if getattr(self.device, "type", "cpu") == "cuda" else -1
        return 0 if dev is None else dev

    def _is_draft(self) -> bool:
        """This session's target is the draft model (vLLM's start_draft_weight_update set it)."""
        return self.model is not self._default_model

    def _bind_draft(self) -> None:
        """The draft's binding and receiver (refit.vllm.draft), made for the draft model vLLM set as the target, once
        (again only after a re-init); a refusal names what refit does not describe and changes nothing."""
        if self.draft_binding is not None and self.draft_binding.model is self.model:
            return
        self._drop_draft()
        kind = draft_kind(self.vllm_config, self.model)
        info = self.info
        b = VllmBinding(self.model, self.vllm_config, draft_identity(kind, info), model_config=self.model_config,
                        draft=kind, target=self._default_model)
        # The draft's receiver is a reader of its own: the default name (host:pid:r<rank>) is the target
        # receiver's, and leases and the publishers' acks are counted by name.
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:60] or "host"
        rx = Receiver(b.manifest, registry=info.registry, job=info.job, group=info.draft_group or info.group,
                      transports=info.transports, transport_options=info.transport_options,
                      reader=f"{host}:{os.getpid()}:r{b.geometry['rank']}:draft", device=self._device_index(),
                      threads=0)
        b.attach(rx)
        self.draft_binding, self.draft_rx = b, rx
        self.draft_init_report = dict(_init_report(b), draft=kind, group=info.draft_group or info.group,
                                      shared_with_target=b.shared)
        logger.info("refit: worker rank %d binds the %s draft (%s) as %s rank %d of %s; shared with the target: %s; "
                    "paths: %s", b.geometry["rank"], kind, type(self.model).__name__, b.layout_str, b.geometry["rank"],
                    b.rmodel.name, b.shared or "none", {k: v["tensors"] for k, v in b.classes.items()})

    def _drop_draft(self) -> None:
        if self.draft_rx is not None:
            self.draft_rx.close()
        self.draft_binding, self.draft_rx, self.draft_init_report = None, None, {}

    def parse_update_info(self, update_dict) -> RefitUpdateInfo:
        """{"version": N}, {"version": "newest"}, {} (newest), or the bare value (N or "newest")."""
        if isinstance(update_dict, (int, str)) and not isinstance(update_dict, bool):
            update_dict = {"version": update_dict}
        return super().parse_update_info(update_dict)

    def _need(self):
        if self.rx is None:
            raise RefitVllmError("the refit backend is not initialized: call init_weight_transfer_engine first")

    def start_weight_update(self) -> None:
        self._need()
        draft = self._is_draft()
        if draft:  # start_draft_weight_update: vLLM has set the draft model as the target
            self._bind_draft()
        self._session = {"start": time.perf_counter(), "updates": [], "target": "draft" if draft else "model"}

    def _pull(self, update_info: RefitUpdateInfo, b: VllmBinding, rx: Receiver):
        """This worker's pull: (report, None) or (None, (status, detail naming the worker and what was written))."""
        want = None if update_info.version == "newest" else update_info.version
        try:
            return rx.pull(want, self.info.timeout_ms), None
        except RefitError as e:
            after = ("nothing was written" if rx.usable else
                     "the transfer had begun: parameters written in place (the direct ones) may hold a mix of "
                     "versions until an update succeeds")
            return None, (e.status, f"worker rank {b.geometry['rank']}: {e.detail}; {after}")

    def _follow_experts(self, when: str) -> None:
        """Expert load balancing (refit.vllm.experts): no update while EPLB is rebalancing; a binding whose plan
        was made for an expert placement that EPLB has since changed is made again from the live maps first."""
        busy = self.binding.experts_busy()
        if busy:
            raise RefitVllmError(f"update refused {when}: {busy}; nothing was written, retry once the rebalance "
                                 "has committed", "update_weights", -47)
        moved = self.binding.experts_moved()
        if moved:
            logger.info("refit: %s since the plan was made: binding again from the live expert maps", moved)
            if self.stager is not None:
                self.stager.wait(self.info.timeout_ms / 1e3)
            self.init_transfer_engine(self.info)

    def receive_weights(self, update_info: RefitUpdateInfo) -> None:
        self._need()
        if self._is_draft():
            return self._draft_update(update_info)
        if update_info.phase in ("stage", "update"):
            self._follow_experts(f"before version {update_info.version}")
        if self.stager is not None:
            return self._two_phase(update_info)
        if update_info.phase != "update":
            raise RefitVllmError(f"phase {update_info.phase!r} needs init_info stage=\"host\" (this engine was "
                                 "initialized with stage=\"none\": single-phase updates)", "update_weights")
        self._single(update_info, self.binding, self.rx)

    def _draft_update(self, u: RefitUpdateInfo) -> None:
        """An update in a draft session: single phase, into the draft's own binding."""
        if u.phase != "update":
            raise RefitVllmError(f"phase {u.phase!r} in a draft session: draft updates are single-phase (phase "
                                 "\"update\"); nothing was written", "update_weights")
        self._bind_draft()
        busy = self.draft_binding.experts_busy() or self.draft_binding.experts_moved()
        if busy:
            raise RefitVllmError(f"draft update refused before version {u.version}: {busy}; nothing was written "
                                 "(re-initialize the backend after the rebalance)", "update_weights", -47)
        self._single(u, self.draft_binding, self.draft_rx)

    def _single(self, update_info: RefitUpdateInfo, b: VllmBinding, rx: Receiver) -> None:
        """Pull into binding b through rx, agree with every worker, then run b's post-load steps."""
        g = b.geometry
        t0 = time.perf_counter()
        rep, err = self._pull(update_info, b, rx)
        moved = None if err is not None else (b.experts_busy() or b.experts_moved())
        if moved:
            err = (-47, f"worker rank {g['rank']}: EPLB moved experts during the pull ({moved}); the expert slots "
                        "written may hold other experts' bytes until an update succeeds")
        # Every worker of the model learns every worker's outcome before any applies: no worker runs a version
        # that another failed to pull, and every worker raises the same error.
        outcomes = _agree(err)
        failed = [o for o in outcomes if o is not None]
        if failed:
            mine = "" if err is not None else (
                f" (worker rank {g['rank']} pulled version {rep.version}; its staged layers were not rebuilt and its "
                "direct parameters hold that version until an update succeeds)")
            draft = b is self.draft_binding
            what, grp = ("draft update", self.info.draft_group or self.info.group) if draft else ("update",
                                                                                                  self.info.group)
            raise RefitVllmError(f"{what} to version {update_info.version} failed ({b.layout_str}, job "
                                 f"{self.info.job}, group {grp}): " + " | ".join(m for _, m in failed)
                                 + mine + "; staged layers keep the previous version",
                                 "update_weights", failed[0][0])
        t1 = time.perf_counter()
        apply_ms = b.apply()
        t2 = time.perf_counter()
        rec = _update_record(rep, (t1 - t0) * 1e3, apply_ms, (t2 - t1) * 1e3)
        rec["target"] = "draft" if b is self.draft_binding else "model"
        if self._session is not None:
            self._session["updates"].append(rec)
        self.report = rec

    # -- two-phase updates (init_info stage="host"; refit.vllm.inflight has the protocol)

    def _two_phase(self, u: RefitUpdateInfo) -> None:
        st, rank = self.stager, self.binding.geometry["rank"]
        if u.phase == "stage":
            st.start(u.version, self.info.timeout_ms, rank)
            return
        if u.phase == "abort":
            st.abort()
            return
        if u.phase == "update":  # stage here, then commit: today's single call, through the staging memory
            st.start(u.version, self.info.timeout_ms, rank, wait=True)
        self._commit(u)

    def _commit(self, u: RefitUpdateInfo) -> None:
        """No worker writes a live byte before the version is known to be staged on every worker: inflight.commit
        read it before the pause (update_info staged_everywhere), or the workers agree here."""
        st, rank = self.stager, self.binding.geometry["rank"]
        t0 = time.perf_counter()
        st.wait(self.info.timeout_ms / 1e3)
        tw = time.perf_counter()
        why = st.ready(u.version)
        if why is None:  # EPLB moved experts after the plan the staged bytes follow: their slots would be wrong
            why = self.binding.experts_busy() or self.binding.experts_moved()
        te = time.perf_counter()
        mine = st.mixed["to"] if st.mixed is not None else st.staged
        bad = []
        if u.staged_everywhere and not self.binding.geometry["eplb"]:
            # inflight.commit read every worker's state just before the pause: all had this version staged and
            # nothing staging, and only vLLM's start and pause calls (which change nothing staged) have reached a
            # worker since.  No collective under the pause.  (Not with EPLB: a rebalance can move one worker's
            # experts in between.)
            if why is not None:  # another caller between the read and this call; the others may commit
                raise RefitVllmError(f"commit of version {u.version} ({self.binding.layout_str}, job {self.info.job})"
                                     f": update_info said every worker had it staged, but worker rank {rank}: {why}; "
                                     "the other workers may have committed it: stage it again on every worker and "
                                     "commit it", "update_weights", -47)
            agreed, how = True, "checked_before_pause"
        else:
            # the common case in one small all_reduce; any worker not ready, or versions that differ, and every
            # worker gathers the outcomes to name who and why
            agreed, how = _agree_fast(why is None, mine)
        if not agreed:
            how = "gather"
            outcomes = _agree((why, mine, st.error[0] if st.error else (-47 if st.busy() else -6)))
            bad = [(r, o) for r, o in enumerate(outcomes) if o[0] is not None]
            if not bad and len({o[1] for o in outcomes}) > 1:
                bad = [(r, (f"has version {o[1]} staged", o[1], -6)) for r, o in enumerate(outcomes)]
        if bad:
            raise RefitVllmError(f"commit of version {u.version} refused ({self.binding.layout_str}, job "
                                 f"{self.info.job}): " + " | ".join(f"worker rank {r}: {o[0]}" for r, o in bad)
                                 + f"; nothing was written, the engine keeps version {st.committed}",
                                 "update_weights", bad[0][1][2])
        t1 = time.perf_counter()
        rec = st.commit(rank)
        rec.update(agreement=how, agree_ms=(t1 - t0) * 1e3, commit_ms=(time.perf_counter() - t0) * 1e3,
                   agree_parts_ms={"stage_thread_join": (tw - t0) * 1e3, "checks": (te - tw) * 1e3,
                                   "workers": (t1 - te) * 1e3})
        rec = dict(rec, stage=st.last_stage)
        if self._session is not None:
            self._session["updates"].append(rec)
        self.report = rec

    def versions(self) -> dict:
        """This worker's weight versions: committed (None: the checkpoint vLLM loaded), staged, staging, the last
        stage's error, mixed (a commit stopped after live writes), the last stage's and commit's records, and draft:
        the version the draft model's receiver last pulled (None: none yet).  With stage="none": committed is the
        receiver's last pulled version."""
        self._need()
        d = self.draft_rx.committed if self.draft_rx is not None else 0
        if self.stager is None:
            c = self.rx.committed
            return {"committed": c if c > 0 else None, "staged": None, "staging": None, "error": None,
                    "mixed": None, "last_stage": {}, "last_commit": {}, "draft": d if d > 0 else None}
        return dict(self.stager.versions(), draft=d if d > 0 else None)

    def is_staged(self, version: int) -> bool:
        return self.versions()["staged"] == version

    def is_committed(self, version: int) -> bool:
        v = self.versions()
        return v["committed"] == version and v["mixed"] is None

    def finish_weight_update(self) -> None:
        self._need()
        if self._session is None:
            return
        s, self._session = self._session, None
        s["total_ms"] = (time.perf_counter() - s.pop("start")) * 1e3
        self.reports.append(s)
        if not s["updates"]:  # a session that only started staging (or aborted): no update of its own to report
            return
        self.report = dict(self.report, session_ms=s["total_ms"])
        logger.info("refit: update done on rank %d: %s", self.binding.geometry["rank"], json.dumps(self.report))

    def shutdown(self) -> None:
        self._drop_draft()
        if self.stager is not None:
            self.stager.wait(self.info.timeout_ms / 1e3 if self.info else 60)
            self.stager = None
        if self.rx is not None:
            self.rx.close()
        self.rx = None
