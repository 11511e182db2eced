"""Refit while generating (issue 32): the two-phase update of the `refit` backend, init_info stage="host".

stage  (update_info {"version": N, "phase": "stage"}): returns at once; a thread of the worker pulls version N into
       the staging arena (host memory beside the live weights: every tensor of the rank, in the loader's layout)
       and then runs vLLM's own post-load steps on the staged bytes, into objects the engine does not use yet
       (a new oneDNN / sgl-kernel handle per CPU linear and per CPU embedding holder, the CPU MoE experts
       prepacked into buffers of the live shape).  Nothing the engine reads is written: it keeps stepping.
commit (update_info {"version": N, "phase": "commit"}, under vLLM's pause in "keep" mode, see commit() below):
       local work only: the workers check that N is staged on all of them (commit() reads every worker's state
       before the pause; a caller that did not makes them agree under it), then the staged bytes are copied into the
       live storage (same addresses: norms, embeddings, prepacked experts, CUDA parameters) and each CPU matmul
       handle's pointer is exchanged with its staged twin's (the handle object, its tensor and the closure vLLM
       calls stay the same objects; the old packed weights are released with the twin).
abort  drops what is staged.

A failure while staging leaves the live weights untouched (the pull and the post-load steps only write staging
memory).  A failure inside commit before the first live write (an injected post-load failure, a worker that has
not staged N) leaves the engine on the previous version; one after it (a copy that raised) leaves the engine
"mixed": the worker says so (versions()["mixed"]), commit() keeps the scheduler paused and raises
RefitVllmCommitIncomplete, and committing N again finishes the remaining steps from the intact staging memory.

The memory: the arena (the rank's loader bytes) + the staged CPU handles (about the linear and embedding bytes
again) + the prepacked experts (the live experts' bytes); init_info staging_budget (bytes) bounds it, and the
host's MemAvailable always does: RefitVllmStagingBudget names both figures at init.
"""
import contextlib
import ctypes
import logging
import os
import threading
import time
from typing import Dict, List, Optional

import torch

from .errors import RefitVllmError

logger = logging.getLogger("vllm.refit")

FAULTS = ("stage-postload", "commit-postload", "commit-copy")  # test hooks (engine.fault), tests/python


class RefitVllmStagingBudget(RefitVllmError):
    """The staging memory two-phase updates need does not fit the budget (or the host's available memory)."""


class RefitVllmCommitIncomplete(RefitVllmError):
    """A commit stopped after some live writes: the engine holds a mix until N is committed again."""


def _closure(fn) -> dict:
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return {}
    return dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__)))


def handle_kind(fn) -> Optional[str]:
    """How vLLM 0.32's CPU matmul closure (layer.cpu_linear, model_executor/layers/utils.py) holds its weight:
    "onednn" (a CPUDNNLGEMMHandler: a pointer in a 0-d int64 tensor), "sgl" (a packed tensor), or None."""
    c = _closure(fn)
    if "handler" in c and hasattr(c["handler"], "handler_tensor"):
        return "onednn"
    if "packed_weight" in c and isinstance(c["packed_weight"], torch.Tensor):
        return "sgl"
    return None


def _holders(model, param):
    return [mod for mod in model.modules()
            if any(p is param for p in mod._parameters.values()) and getattr(mod, "quant_method", None)]


def need_bytes(items, model, platform: str, arena: int) -> Dict[str, int]:
    """Staging memory per part: the arena, the staged CPU handles (estimated as their loader bytes), the
    prepacked experts (the live bytes)."""
    handles = packed = 0
    for it in items:
        if it.path == "linear-cpu":
            handles += it.local.nbytes
        elif it.path == "embedding" and platform == "cpu":
            handles += it.local.nbytes * max(1, len(_holders(model, it.param)))
        elif it.path == "moe-cpu":
            packed += it.param.numel() * it.param.element_size()
    return {"arena": arena, "handles": handles, "packed": packed, "total": arena + handles + packed}


HUGE = 2 << 20


def host_buffer(nbytes: int, hugepages: bool) -> torch.Tensor:
    """Zeroed host memory for staging.  hugepages: an anonymous mapping advised MADV_HUGEPAGE (transparent huge
    pages, where the kernel's setting is "madvise" or "always"), 2 MiB-aligned; else torch's allocator."""
    if not hugepages:
        return torch.zeros(nbytes, dtype=torch.uint8)
    import mmap
    mm = mmap.mmap(-1, nbytes + 2 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass  # no THP here: plain pages
    whole = torch.frombuffer(mm, dtype=torch.uint8)  # holds a reference to the mapping
    skip = (-whole.data_ptr()) % HUGE
    t = whole[skip:skip + nbytes]
    t.zero_()  # fault it in now, outside any pause
    return t


def huge_bytes(t: torch.Tensor) -> int:
    """Bytes of transparent huge pages backing the mapping that holds t (/proc/self/smaps AnonHugePages), or -1."""
    addr = t.data_ptr()
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= addr < hi
                elif inside and head == "AnonHugePages:":
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return -1


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def check_budget(need: Dict[str, int], budget: Optional[int], what: str):
    avail = mem_available()
    limit = min(avail, budget) if budget is not None else avail
    if need["total"] > limit:
        raise RefitVllmStagingBudget(
            f"RefitVllmStagingBudget: two-phase updates of {what} need {need['total']} bytes of host staging memory "
            f"(arena {need['arena']}, staged CPU handles ~{need['handles']}, prepacked experts {need['packed']}); "
            f"staging_budget is {budget if budget is not None else 'unset'}, MemAvailable {avail}: raise the budget "
            "or use stage=\"none\" (single-phase updates)", "init_weight_transfer_engine", -40)


COMMIT_COPIES = ("memmove", "torch")  # init_info commit_copy


def _copy(dst: torch.Tensor, src: torch.Tensor, mode: str = "memmove"):
    """dst <- src.  Host to host, contiguous, same dtype and shape: the bytes as one flat uint8 copy, by torch
    (mode "torch": its copy kernel split over the worker's intra-op threads, which are idle while the engine is
    paused) or by one memmove in this thread ("memmove").  Otherwise torch's copy_ (CUDA: from the pinned arena)."""
    if (dst.device.type == "cpu" and src.device.type == "cpu" and dst.dtype == src.dtype
            and dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous()):
        if mode == "memmove":
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())
        else:
            dst.reshape(-1).view(torch.uint8).copy_(src.reshape(-1).view(torch.uint8))
    else:
        dst.copy_(src)


def _background() -> dict:
    """Makes the staging thread (and the threads it starts: the pull's copy threads, its torch team) background
    work: nice 19, allowed on every CPU.  Measured on the 354 MB model at tp=1 (bench/inflight-vllm-cpu.sh): at the
    default priority no decode step ended during a 150-300 ms pull; at nice 19, 3 of 5 pulls saw steps end (the
    steps still ran 5-10x slower).  The CPU set is a precaution: a thread inherits its creator's binding, and vLLM's
    CPU worker can bind its OpenMP threads (VLLM_CPU_OMP_THREADS_BIND); at tp=1 here it inherited both CPUs."""
    out = {}
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        out["nice"] = os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, AttributeError) as e:
        out["nice"] = f"unchanged: {e}"
    try:
        before = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
        out["cpus_inherited"], out["cpus"] = before, sorted(os.sched_getaffinity(0))
    except (OSError, AttributeError) as e:
        out["cpus"] = f"unchanged: {e}"
    return out


def _thread_usage():
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_THREAD)
    except (ImportError, AttributeError, OSError):
        return None


def _usage_since(ru0) -> dict:
    ru1 = _thread_usage()
    if ru0 is None or ru1 is None:
        return {}
    return {"pull_minflt": ru1.ru_minflt - ru0.ru_minflt, "pull_majflt": ru1.ru_majflt - ru0.ru_majflt,
            "pull_vol_switches": ru1.ru_nvcsw - ru0.ru_nvcsw,
            "pull_cpu_ms": round((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) * 1e3, 1),
            "pull_sys_ms": round((ru1.ru_stime - ru0.ru_stime) * 1e3, 1),
            "pull_invol_switches": ru1.ru_nivcsw - ru0.ru_nivcsw}


class _Step:
    """One live write of a commit: a copy of staged bytes into live storage, or a handle pointer exchange."""
    __slots__ = ("kind", "name", "live", "src", "done")

    def __init__(self, kind, name, live, src):
        self.kind, self.name, self.live, self.src, self.done = kind, name, live, src, False

    def run(self, copy_mode: str = "memmove"):
        if self.kind == "copy":
            _copy(self.live, self.src, copy_mode)
        elif self.kind == "onednn":  # exchange the pointers: the live handle serves the new weights, the twin
            a, b = self.live.handler_tensor, self.src.handler_tensor  # releases the old ones when dropped
            pa, pb = int(a.item()), int(b.item())
            a.fill_(pb)
            b.fill_(pa)
        elif self.kind == "derive":  # vLLM's own post-load step of a layer whose inputs the copies above wrote
            from .derived import refresh
            refresh([(self.name, self.live)], self.src)
        self.done = True

    def nbytes(self):
        return self.src.numel() * self.src.element_size() if self.kind == "copy" else 0  # derive: src a dtype


class Stager:
    """The worker's two-phase state: what is committed and staged, the staging thread, the prepared steps."""

    def __init__(self, binding, rx, vllm_config):
        self.b, self.rx, self.vllm_config = binding, rx, vllm_config
        huge = binding.staging_hugepages
        self.packed = {it.name: host_buffer(it.param.numel() * it.param.element_size(), huge)
                       .view(it.param.dtype).view(it.param.shape) for it in binding.items if it.path == "moe-cpu"}
        self.huge_bytes = {"arena": huge_bytes(binding.staging),
                           "packed": sum(huge_bytes(t) for t in self.packed.values()) if huge else 0}
        self.committed: Optional[int] = None  # None: the checkpoint vLLM loaded
        self.staged: Optional[int] = None
        self.staging: Optional[object] = None  # the version asked for while the thread runs
        self.pulling: Optional[object] = None  # set once the thread has begun the pull (it may wait there)
        self.phase: Optional[str] = None  # where the staging thread is ("pull", "post-load NAME i/n"), for a stage
        self.phase_since: Optional[float] = None  # that does not end: versions() says where it stands, since when
        self.error: Optional[tuple] = None  # (status, message) of the last failed stage
        self.mixed: Optional[dict] = None
        self.steps: List[_Step] = []
        self.retired: List[_Step] = []  # a commit's steps: their twins hold the old handles, freed after the pause
        self.thread: Optional[threading.Thread] = None
        self.last_stage: dict = {}
        self.last_commit: dict = {}
        self.fault: Optional[str] = None
        self.copy_mode = "torch"  # init_info commit_copy (COMMIT_COPIES)
        for it in binding.items:  # refuse at init what commit could not exchange
            if it.path in ("linear-cpu",) or (it.path == "embedding" and binding.platform == "cpu"):
                for mod in ([it.module] if it.path == "linear-cpu" else _holders(binding.model, it.param)):
                    if handle_kind(getattr(mod, "cpu_linear", None)) is None:
                        raise RefitVllmError(f"{it.name}: vLLM's CPU matmul of this layer is neither a oneDNN nor "
                                             "an sgl-kernel handle (a torch fallback or zentorch): stage=\"host\" "
                                             "cannot exchange it; use stage=\"none\"", "init_weight_transfer_engine")

    # -- state

    def versions(self) -> dict:
        return {"committed": self.committed, "staged": self.staged,
                "staging": self.staging if self.thread is not None and self.thread.is_alive() else None,
                "pulling": self.pulling,
                "phase": self.phase if self.busy() else None,
                "phase_s": round(time.time() - self.phase_since, 3) if self.busy() and self.phase_since else None,
                "error": self.error[1] if self.error else None, "mixed": self.mixed,
                "last_stage": self.last_stage, "last_commit": self.last_commit}

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # -- stage

    def start(self, version, timeout_ms: int, rank: int, wait: bool = False):
        if self.busy():
            raise RefitVllmError(f"worker rank {rank}: staging of version {self.staging} is in progress; wait for it "
                                 "(is_staged) or commit it before staging another", "update_weights", -47)
        if self.mixed is not None:
            raise RefitVllmCommitIncomplete(
                f"RefitVllmCommitIncomplete: worker rank {rank} holds a mix ({self.mixed}); commit version "
                f"{self.mixed['to']} again before staging another", "update_weights", -47)
        self.staged, self.steps, self.error, self.staging = None, [], None, version
        self.thread = threading.Thread(target=self._run, args=(version, timeout_ms, rank), daemon=True,
                                       name="refit-stage")
        self.thread.start()
        if wait:
            self.thread.join()

    def _run(self, version, timeout_ms, rank):
        from vllm.config import set_current_vllm_config

        from ..core import RefitError
        prio = _background()
        t = time.perf_counter()
        self.retired = []  # releases the previous version's handles (oneDNN frees them) outside any pause
        rec = {"version_asked": version, "release_ms": (time.perf_counter() - t) * 1e3, "thread": prio,
               "pull_start": time.time()}
        self.pulling = version  # the pull has begun (it may be waiting for the version to be published)
        self._at("pull")
        t0 = time.perf_counter()
        ru0 = _thread_usage()  # this thread's own counts only: with stage_threads=1 (the default) the copy runs here
        try:
            want = None if version == "newest" else version
            rep = self.rx.pull(want, timeout_ms)
            prio.update(_usage_since(ru0))
            rec.update(pull_end=time.time(), pull_ms=(time.perf_counter() - t0) * 1e3, version=rep.version,
                       bytes=rep.bytes, wait_ms=rep.wait_ms, transfer_ms=rep.transfer_ms, verify_ms=rep.verify_ms,
                       transport=rep.transport)
            t1 = time.perf_counter()
            with torch.no_grad(), set_current_vllm_config(self.vllm_config):
                steps = self._prepare()
            rec.update(prepare_ms=(time.perf_counter() - t1) * 1e3, prepare_end=time.time(), steps=len(steps))
            self.steps, self.staged = steps, rep.version
        except RefitError as e:
            prio.update(_usage_since(ru0))
            rec.update(pull_end=time.time(), failed=str(e))
            self.error = (e.status, f"worker rank {rank}: staging version {version} failed: {e.detail}; the live "
                                    "weights were not written")
        except Exception as e:  # a post-load step that raised: only staging memory was written
            rec.update(pull_end=time.time(), failed=f"{type(e).__name__}: {e}")
            self.error = (-4, f"worker rank {rank}: staging version {version} failed in a post-load step: "
                              f"{type(e).__name__}: {e}; the live weights were not written")
        finally:
            self.last_stage = rec
            self.pulling = None
            self.staging = None

    def _at(self, phase: str):
        self.phase, self.phase_since = phase, time.time()

    def _prepare(self) -> List[_Step]:
        """vLLM's post-load steps on the staged bytes, into objects the engine does not read; the commit's steps."""
        b, steps, seen = self.b, [], set()
        for i, it in enumerate(b.items):
            self._at(f"post-load {it.name} ({it.path}) {i + 1}/{len(b.items)}")
            view = b.staged_views[it.name]
            if it.path == "direct":
                steps.append(_Step("copy", it.name, it.param.data, view))
            elif it.path == "embedding":
                steps.append(_Step("copy", it.name, it.param.data, view))
                if b.platform == "cpu":
                    for mod in _holders(b.model, it.param):
                        steps.append(self._twin(it.name, mod, view, embedding=True))
            elif it.path == "linear-cpu":
                steps.append(self._twin(it.name, it.module, view, embedding=False))
            elif it.path == "moe-cpu":
                if id(it.module) in seen:
                    continue
                seen.add(id(it.module))
                prefix = it.name.rpartition(".")[0]
                self._prepack(it.module, prefix)
                for a in ("w13_weight", "w2_weight"):
                    steps.append(_Step("copy", f"{prefix}.{a}", getattr(it.module, a).data,
                                       self.packed[f"{prefix}.{a}"]))
            if self.fault == "stage-postload":
                raise RuntimeError("injected fault: a post-load step raised while staging (stage-postload)")
        # MLA's W_UK_T / W_UV (derived.py): derived from the live kv_b_proj, so after every copy of the commit
        from .derived import act_dtype
        steps += [_Step("derive", name, mod, act_dtype(b.vllm_config)) for name, mod in b.mla]
        return steps

    def _twin(self, name, mod, view, embedding: bool) -> _Step:
        """vLLM's own process_weights_after_loading of `mod` run on a stand-in layer holding the staged weight:
        a new matmul closure, exchanged with the live one at commit."""
        proxy = torch.nn.Module()
        w = view
        live_w = getattr(mod, "weight", None)
        if live_w is not None and w.dtype != live_w.dtype:
            w = w.to(live_w.dtype)
        proxy.register_parameter("weight", torch.nn.Parameter(w, requires_grad=False))
        proxy.register_parameter("bias", None)
        for a in ("_cpu_skip_gemm_dispatch", "allow_rocm_bf16x3_router_gemm"):  # read by vLLM's step (the gate)
            if hasattr(mod, a):
                setattr(proxy, a, getattr(mod, a))
        mod.quant_method.process_weights_after_loading(proxy)
        live_fn, new_fn = mod.cpu_linear, getattr(proxy, "cpu_linear", None)
        kind, new_kind = handle_kind(live_fn), handle_kind(new_fn)
        if kind is None or kind != new_kind:
            raise RefitVllmError(f"{name}: the staged matmul handle is {new_kind}, the live one {kind}")
        if kind == "onednn":
            lh, nh = _closure(live_fn)["handler"], _closure(new_fn)["handler"]
            if (lh.n, lh.k) != (nh.n, nh.k):
                raise RefitVllmError(f"{name}: staged oneDNN handle is {nh.n}x{nh.k}, the live one {lh.n}x{lh.k}")
            return _Step("onednn", name, lh, nh)
        lp, np_ = _closure(live_fn)["packed_weight"], _closure(new_fn)["packed_weight"]
        if lp.shape != np_.shape or lp.dtype != np_.dtype:
            raise RefitVllmError(f"{name}: staged sgl-kernel weight is {np_.dtype} {list(np_.shape)}, the live one "
                                 f"{lp.dtype} {list(lp.shape)}")
        return _Step("copy", name, lp, np_)

    def _prepack(self, layer, prefix):
        """The CPU MoE kernel's post-load step from the staged experts into the packed buffers (postload.moe_cpu,
        aimed at staging memory instead of the live storage)."""
        from .classify import CPU_MOE_KERNELS
        sv = self.b.staged_views
        kernel = layer.quant_method.moe_kernel.fused_experts
        mc = getattr(kernel, "moe_config", None)
        if (type(kernel).__name__ in CPU_MOE_KERNELS and getattr(kernel, "_use_zentorch", True) is False
                and mc is not None and kernel._padded_intermediate_size(mc) == mc.intermediate_size_per_partition
                and hasattr(torch.ops._C, "prepack_moe_weight")):
            for a in ("w13_weight", "w2_weight"):
                torch.ops._C.prepack_moe_weight(sv[f"{prefix}.{a}"], self.packed[f"{prefix}.{a}"], kernel.isa)
            return
        proxy = torch.nn.Module()
        for a in ("moe_config", "activation"):
            if hasattr(layer, a):
                object.__setattr__(proxy, a, getattr(layer, a))
        for a in ("w13_weight", "w2_weight"):
            proxy.register_parameter(a, torch.nn.Parameter(sv[f"{prefix}.{a}"].clone(), requires_grad=False))
        kernel.process_weights_after_loading(proxy)
        for a in ("w13_weight", "w2_weight"):
            new, dst = getattr(proxy, a), self.packed[f"{prefix}.{a}"]
            if new.shape != dst.shape or new.dtype != dst.dtype:
                raise RefitVllmError(f"{prefix}.{a}: the CPU MoE prepacking gave {new.dtype} {list(new.shape)}, the "
                                     f"live parameter is {dst.dtype} {list(dst.shape)}")
            dst.copy_(new)

    # -- commit

    def wait(self, timeout_s: float):
        if self.thread is not None:
            self.thread.join(timeout_s)

    def ready(self, version) -> Optional[str]:
        """None when `version` is staged here and may be committed, else why not."""
        if self.busy():
            return f"staging of version {self.staging} is still in progress"
        if self.mixed is not None:
            return None if version in (self.mixed["to"], "newest") else \
                f"the engine holds a mix; only version {self.mixed['to']} can be committed"
        if self.staged is None:
            return "nothing is staged" + (f" (the last stage failed: {self.error[1]})" if self.error else "")
        if version not in (self.staged, "newest"):
            return f"version {self.staged} is staged, not {version}"
        return None

    def commit(self, rank: int) -> dict:
        """The live writes; the caller checked ready() on every worker."""
        to = self.mixed["to"] if self.mixed is not None else self.staged
        prev = self.mixed["from"] if self.mixed is not None else self.committed
        if self.fault == "commit-postload":
            raise RefitVllmError(f"worker rank {rank}: injected fault: the commit's post-load step raised before any "
                                 f"live write (commit-postload); the engine keeps version {prev}", "update_weights",
                                 -24)
        t0 = time.perf_counter()
        todo = [s for s in self.steps if not s.done]
        nbytes = 0
        kind_ms = {}
        for i, s in enumerate(todo):
            ts = time.perf_counter()
            try:
                if self.fault == "commit-copy" and i == len(todo) // 2 and self.mixed is None:
                    raise RuntimeError("injected fault: a live copy raised (commit-copy)")
                s.run(self.copy_mode)
            except Exception as e:  # any step may have written live bytes: the engine holds a mix until N is again
                if self.mixed is None:
                    self.mixed = {"from": prev, "to": to, "done": sum(x.done for x in self.steps),
                                  "steps": len(self.steps), "stopped_at": s.name}
                raise RefitVllmCommitIncomplete(
                    f"RefitVllmCommitIncomplete: worker rank {rank}: the commit's {s.kind} step of {s.name} raised "
                    f"({type(e).__name__}: {e}) after {sum(x.done for x in self.steps)} of {len(self.steps)} steps; "
                    f"the engine holds a mix of versions {prev} and {to} until version {to} is committed again",
                    "update_weights", -47) from e
            kind_ms[s.kind] = kind_ms.get(s.kind, 0.0) + (time.perf_counter() - ts) * 1e3
            nbytes += s.nbytes()
        ms = (time.perf_counter() - t0) * 1e3
        self.last_commit = {"version": to, "from": prev, "copy_ms": ms, "bytes_copied": nbytes,
                            "ms_by_kind": kind_ms, "copy_mode": self.copy_mode,
                            "handles_exchanged": sum(1 for s in todo if s.kind == "onednn"),
                            "derived": sum(1 for s in todo if s.kind == "derive"), "steps": len(todo),
                            "resumed_mixed": self.mixed is not None}
        self.committed, self.staged, self.mixed = to, None, None
        self.retired, self.steps = self.steps, []  # not freed here: freeing the old handles is not commit work
        return self.last_commit

    def abort(self):
        if self.busy():
            raise RefitVllmError("staging is in progress; it cannot be dropped before it ends", "update_weights", -47)
        if self.mixed is not None:
            raise RefitVllmCommitIncomplete(f"RefitVllmCommitIncomplete: the engine holds a mix ({self.mixed}); "
                                            "commit it, do not drop it", "update_weights", -47)
        self.staged, self.steps = None, []


# ---------------------------------------------------------------- driver side (the process holding the LLM)


def _w_versions(worker):
    e = worker.weight_transfer_engine
    return e.versions()


def _w_set_fault(worker, fault):
    e = worker.weight_transfer_engine
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault is one of {FAULTS} or None")
    e.stager.fault = fault
    return fault


def versions(llm) -> List[dict]:
    """Each worker's versions(): committed, staged, staging, error, mixed, last_stage, last_commit."""
    return llm.collective_rpc(_w_versions)


def is_staged(llm, version: int) -> bool:
    return all(v["staged"] == version for v in versions(llm))


def is_committed(llm, version: int) -> bool:
    return all(v["committed"] == version and v["mixed"] is None for v in versions(llm))


def _update(llm, info):
    """One stage or abort call through vLLM's update session; after a failure, vLLM's executor is brought back in
    step and the sessions left open on the workers that did not raise are closed, so the next call is not refused."""
    try:
        llm.start_weight_update()
        llm.update_weights({"update_info": info})
        llm.finish_weight_update()
    except BaseException:
        if _realign(llm) is not None:
            try:
                llm.collective_rpc(_w_close_session)
            except Exception as e2:  # noqa: BLE001 - the original error is the one to report
                logger.warning("refit: closing the workers' update sessions after a failed call: %s", e2)
        raise


def _realign(llm) -> Optional[int]:
    """After a failed call: vLLM 0.32's multiprocess executor leaves the workers' replies after the first error
    queued (docs/vllm.md, known problem 4), and versions() would read them.  Drops them; returns how many (0 with one
    worker), or None where that cannot be done (the engine core in its own process, a worker that does not answer)."""
    from .executor import realign_worker_replies
    try:
        pc = llm.llm_engine.vllm_config.parallel_config
        if pc.tensor_parallel_size * pc.pipeline_parallel_size <= 1:
            return 0
    except AttributeError:
        pass  # not known: try
    try:
        return realign_worker_replies(llm)
    except Exception as e:  # noqa: BLE001 - any failure means the replies cannot be trusted
        logger.warning("refit: the workers' replies could not be realigned: %s", e)
        return None


def stage(llm, version):
    """Starts staging `version` on every worker and returns at once (the engine keeps serving)."""
    _update(llm, {"version": version, "phase": "stage"})


def _w_close_session(worker):
    """After a failed call: vLLM closes a worker's weight-update session only where update_weights raised (or never
    opened it where start_weight_update raised); a session left open (the other workers', or every worker's when the
    pause itself failed) makes the next start_weight_update refuse.  Closes it.  Returns whether one was open."""
    if getattr(worker, "_weight_update_active", False):
        worker.finish_weight_update()
        return True
    return False


def _staged_everywhere(vs: List[dict], version) -> bool:
    """Every worker has `version` (the same one: "newest" is what they staged) staged, nothing staging, nothing
    mixed."""
    want = vs[0]["staged"] if version == "newest" else version
    return want is not None and all(v["staged"] == want and v["staging"] is None and v["mixed"] is None for v in vs)


def commit(llm, version, pause: bool = True, quiet_wait: bool = True) -> dict:
    """Commits the staged `version` under vLLM's pause in "keep" mode (LLM.sleep(level=0, mode="keep"): requests stay
    in flight with their KV cache; the scheduler runs no step), sets vLLM's weight version to str(version) (each
    request's output then names the versions that generated its tokens: CompletionOutput.weight_versions), and
    resumes.  Before the pause it reads every worker's versions(): when all have `version` staged (and nothing
    staging or mixed), the workers commit without agreeing among themselves under the pause (update_info
    staged_everywhere); vLLM's start_weight_update is called before the pause too.  A commit that failed before any
    live write resumes and raises; one that left a mix (a worker mid-copy, or workers that hold different versions)
    keeps the scheduler paused and raises RefitVllmCommitIncomplete (stage the version again where needed and commit
    it).  quiet_wait: this process waits for the workers' commit replies asleep, not spinning beside their copies
    (executor.quiet_reply_wait; tp > 1 with the engine core in this process).  Returns pause_ms and its parts."""
    from .executor import quiet_reply_wait
    tv = time.perf_counter()
    try:
        vs = versions(llm)
    except BaseException:
        _realign(llm)  # nothing was opened or paused; later calls must not read this call's replies
        raise
    if not all(isinstance(v, dict) for v in vs):
        raise RefitVllmError(f"commit of version {version}: the workers' versions() replies are not theirs ({vs!r}); "
                             "nothing was paused or written", "commit", -47)
    everywhere = _staged_everywhere(vs, version)
    if everywhere and version == "newest":
        version = vs[0]["staged"]  # what every worker has staged: the label says which version it is
    tw = time.perf_counter()
    slept, quiet = False, None
    t0 = t1 = tb = tw
    try:
        llm.start_weight_update()  # opens vLLM's update session on every worker; nothing the engine reads changes
        t0 = time.perf_counter()
        if pause:
            slept = True  # before the call: vLLM pauses the scheduler first, then may raise (a worker's sync)
            llm.sleep(level=0, mode="keep")
        t1 = time.perf_counter()
        with quiet_reply_wait(llm) if quiet_wait else contextlib.nullcontext() as quiet:
            llm.update_weights({"update_info": {"version": version, "phase": "commit",
                                                "staged_everywhere": everywhere}})
        tb = time.perf_counter()
        llm.finish_weight_update(weight_version=str(version))  # vLLM's label of the tokens generated from now on
    except BaseException as e:
        _after_failed_commit(llm, version, e, slept)
        raise
    t2 = time.perf_counter()
    if pause:
        llm.wake_up(tags=["scheduling"])
    t3 = time.perf_counter()
    return {"pause_ms": (t3 - t0) * 1e3, "enter_pause_ms": (t1 - t0) * 1e3, "commit_rpc_ms": (t2 - t1) * 1e3,
            "update_ms": (tb - t1) * 1e3, "finish_ms": (t2 - tb) * 1e3, "resume_ms": (t3 - t2) * 1e3,
            "before_pause": {"versions_ms": (tw - tv) * 1e3, "start_ms": (t0 - tw) * 1e3},
            "staged_everywhere": everywhere, "quiet_wait": bool(quiet is not None and quiet.changed),
            "version": version}


def _after_failed_commit(llm, version, e: Exception, slept: bool) -> None:
    """The state after a failed commit call: raises where the engine must stay paused, else resumes (the caller
    re-raises e)."""
    restart = ("the scheduler stays paused; restart the engine" if slept else
               "nothing was paused; restart the engine before the next update")
    realigned = _realign(llm)
    if realigned is None:
        raise RefitVllmError(f"commit of version {version} failed ({e}); vLLM's executor could not be brought back "
                             "in step after the failed call (docs/vllm.md, known problem 4: the engine core in its "
                             "own process, or a worker that does not answer), so the workers' versions cannot be "
                             f"read: {restart}", "commit", -47) from e
    try:
        llm.collective_rpc(_w_close_session)
        vs = versions(llm)
    except Exception as e2:
        raise RefitVllmError(f"commit of version {version} failed ({e}), and the workers' state could not be read "
                             f"after it ({e2}): {restart}", "commit", -47) from e
    mixed = [v["mixed"] for v in vs if v["mixed"] is not None]
    if mixed:
        raise RefitVllmCommitIncomplete(f"RefitVllmCommitIncomplete: commit of version {version} stopped after "
                                        f"live writes ({mixed}); the scheduler stays paused until version "
                                        f"{version} is committed again: {e}", "commit", -47) from e
    held = [v["committed"] for v in vs]
    if len(set(held)) > 1:  # some workers committed, others did not: the model is a mix across workers
        raise RefitVllmCommitIncomplete(
            f"RefitVllmCommitIncomplete: after a failed commit of version {version} the workers hold different "
            f"versions {dict(enumerate(held))}; the scheduler stays paused until "
            f"version {version} is staged again on every worker and committed: {e}", "commit", -47) from e
    if slept:
        llm.wake_up(tags=["scheduling"])


def _w_set_commit_copy(worker, mode):
    if mode not in COMMIT_COPIES:
        raise ValueError(f"commit_copy is one of {COMMIT_COPIES}, not {mode!r}")
    worker.weight_transfer_engine.stager.copy_mode = mode
    return mode


def set_commit_copy(llm, mode: str):
    """How the next commits copy host bytes (COMMIT_COPIES; init_info commit_copy), e.g. for an A/B run."""
    return llm.collective_rpc(_w_set_commit_copy, args=(mode,))


def set_fault(llm, fault: Optional[str]):
    """Test hook: make the next stage / commit of every worker fail at `fault` (FAULTS), or None."""
    return llm.collective_rpc(_w_set_fault, args=(fault,))
