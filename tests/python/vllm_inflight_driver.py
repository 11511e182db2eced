"""Refit while generating (issue 32) in the real vLLM 0.32 (CPU): the two-phase update of the `refit` backend
(init_info stage="host", python/refit/vllm/inflight.py) measured and checked; tests/python/test_vllm_inflight.py
and bench/inflight-vllm-cpu.sh run it and read the JSON it writes.

    python vllm_inflight_driver.py CONFIG.json OUT.json

CONFIG: {"v1": dir, "v2": dir, "tp": 1, "refit": refit binary, "work": dir, "updates": U (two-phase updates
         measured), "single": S (single-phase updates measured first), "faults": bool, "max_tokens": n,
         "mla_unalias": bool (issue 35: vllm_driver.w_mla_unalias on the refit engine before its first update)}

Steps (every vLLM is LLM(..., skip_tokenizer_init=True, enforce_eager=True); the engine core in this process):
  1. references: a vLLM started on v1, then one on v2: every worker's live state (vllm_driver.w_dump: parameters,
     buffers, each packed CPU matmul's effective weight) and greedy generation;
  2. the trainer stand-in: a publisher in this process (the hf layout, one rank) whose version k holds v2's bytes
     for odd k and v1's for even k, so that every update changes every tensor;
  3. vLLM started on v1 with the refit backend; S single-phase updates (stage="none": the engine does not step
     during the pull; pause = the whole update), each checked against its reference;
  4. re-init with stage="host"; U two-phase updates while 4 requests decode: stage(k) returns at once, the driver
     keeps stepping the engine and counts the tokens produced while the pull ran (the worker's wall-clock pull
     window), then commit(k) under LLM.sleep(level=0, mode="keep") / wake_up(["scheduling"]); pause_ms is that
     whole call; the state is compared with the reference of k; local_copy_ms is a plain torch copy of the rank's
     bytes in this process, measured beside it; requests spanning a commit report their weight versions;
  5. with "faults": a stage whose source bytes change after publishing (digest mismatch), a stage whose
     publisher process is killed while it pulls, a post-load step raising while staging, the commit's post-load
     step raising (before any live write), a live copy raising mid-commit (the engine mixed, the scheduler kept
     paused, then the same version committed again); after each the state is compared byte for byte.
"""
import gc
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vllm_driver import (PROMPTS, _set_env, _vllm_shm, compare, generate, start_llm, stop_llm, w_dump,  # noqa: E402
                         w_mla_unalias, w_rank)


def hf_publisher(ckpts, reg, job, digest=True):
    """One rank holding the whole checkpoint (the hf layout); fill(ver) copies that checkpoint's bytes in."""
    import numpy as np
    import refit
    model = refit.Model(ckpts["v2"])
    tensors = model.tensors()
    m = refit.Manifest.build(model.name, "hf", 0, 1)
    offs, off = {}, 0
    for t in tensors:
        offs[t.name] = off
        off += -(-t.nbytes // 256) * 256
    m.add_region(off)
    images = {}
    for ver in ("v1", "v2"):
        img = np.zeros(off, dtype=np.uint8)
        with refit.SafetensorsFile(os.path.join(ckpts[ver], "model.safetensors")) as f:
            for t in tensors:
                img[offs[t.name]:offs[t.name] + t.nbytes] = f.numpy(t.name).reshape(-1).view(np.uint8)
        images[ver] = img
    for t in tensors:
        m.add_canonical(t.name, t.dtype, t.shape)
        m.add_local(t.name, t.dtype, t.shape, 0, offs[t.name])
        m.add_placement(t.name, t.name, (0,) * len(t.shape), t.shape, (0,) * len(t.shape))
    m.finalize()
    pub = refit.Publisher(m, registry=reg, job=job, no_digest=not digest)
    arena = np.zeros(off, dtype=np.uint8)
    pub.attach(0, arena)
    return pub, arena, images, offs


def w_plain_copy_ms(worker, reps=3):
    """A plain torch copy of this worker's bytes (the last commit's bytes_copied) between two buffers of the worker
    process, started together on every tensor-parallel worker (a gloo barrier before each copy): the commit's copy
    with nothing of refit in it, on the same processes and with the same neighbours.  At tp=2 on one 2-core host
    both workers copy at once, as in the commit; the driver's local_copy_ms copies one rank's bytes with the machine
    to itself.  Median of reps, ms (the buffers are made and touched once per call, before the timed copies)."""
    import torch
    import torch.distributed as dist
    from vllm.distributed import get_tp_group
    n = worker.weight_transfer_engine.stager.last_commit["bytes_copied"]
    src, dst = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    dst.copy_(src)
    tp = get_tp_group()
    ms = []
    for _ in range(reps):
        if tp.world_size > 1:
            dist.barrier(group=tp.cpu_group)
        t = time.perf_counter()
        dst.copy_(src)
        ms.append((time.perf_counter() - t) * 1e3)
    return {"ms": sorted(ms)[len(ms) // 2], "bytes": n, "torch_threads": torch.get_num_threads()}


def w_set_fault_on(worker, rank, fault):
    """Test hook on tensor-parallel worker `rank` only: its next stage or commit fails at `fault` (inflight.FAULTS)."""
    e = worker.weight_transfer_engine
    if e.binding.geometry["rank"] == rank:
        e.stager.fault = fault
    return e.binding.geometry["rank"]


def w_drop_staged_on(worker, rank):
    """Drops the staged version on tensor-parallel worker `rank` only (the stager's abort); others keep theirs."""
    e = worker.weight_transfer_engine
    if e.binding.geometry["rank"] == rank:
        e.stager.abort()
    return e.binding.geometry["rank"]


def w_copy_probe(worker, rounds=5):
    """Diagnostic (cfg "copy_probe"): where a commit's copy time goes.  Re-runs the last commit's copy steps (the
    same staged bytes into the same live storage: a no-op for the state) interleaved with one flat memmove of as
    many bytes between two buffers of this process; per round: the steps by memmove and by torch, the flat copy."""
    import ctypes
    import torch
    from refit.vllm.inflight import _copy
    st = worker.weight_transfer_engine.stager
    steps = [s for s in st.retired if s.kind == "copy"]
    n = sum(s.nbytes() for s in steps)
    a, b = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    b.copy_(a)
    out = {"bytes": n, "steps": len(steps), "torch_threads": torch.get_num_threads(),
           "sizes_mb": sorted((round(s.nbytes() / 2**20, 1) for s in steps), reverse=True)[:8],
           "rounds": []}
    # fresh buffers of each step's size (allocated now, touched once): which side's memory makes the difference
    fsrc = [torch.ones(s.nbytes(), dtype=torch.uint8) for s in steps]
    fdst = [torch.zeros(s.nbytes(), dtype=torch.uint8) for s in steps]

    def mm(pairs):
        for d, s_, k in pairs:
            ctypes.memmove(d, s_, k)
    live_staged = [(s.live.data_ptr(), s.src.data_ptr(), s.nbytes()) for s in steps]
    fresh_dst = [(d.data_ptr(), s.src.data_ptr(), s.nbytes()) for d, s in zip(fdst, steps)]
    fresh_src = [(s.live.data_ptr(), x.data_ptr(), s.nbytes()) for x, s in zip(fsrc, steps)]
    fresh_both = [(d.data_ptr(), x.data_ptr(), d.numel()) for d, x in zip(fdst, fsrc)]
    staged_to_staged = [(s.src.data_ptr(), s.src.data_ptr(), s.nbytes()) for s in steps]  # onto itself: reads+writes
    # fresh destinations at the live tensor's offset within its page (and within 2 MiB): whether the slow pair is
    # a matter of where the two streams sit relative to each other
    def at_offset(nbytes, ptr):
        buf = torch.zeros(nbytes + 2 * 2**21, dtype=torch.uint8)
        skip = (ptr - buf.data_ptr()) % 2**21
        return buf, buf.data_ptr() + skip
    fl = [at_offset(s.nbytes(), s.live.data_ptr()) for s in steps]
    fresh_dst_liveoff = [(q, s.src.data_ptr(), s.nbytes()) for (_, q), s in zip(fl, steps)]
    out["addresses"] = [{"name": s.name, "mb": round(s.nbytes() / 2**20, 2), "live_mod4k": s.live.data_ptr() % 4096,
                         "staged_mod4k": s.src.data_ptr() % 4096,
                         "dst_minus_src_mod4k": (s.live.data_ptr() - s.src.data_ptr()) % 4096,
                         "dst_minus_src_mod2m": (s.live.data_ptr() - s.src.data_ptr()) % 2**21} for s in steps]
    def mapping(ptr):
        """The /proc/self/smaps entry holding ptr: its range, name and the counters that say how it is backed."""
        cur = None
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):
                    if cur is not None:
                        return cur
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    if lo <= ptr < hi:
                        cur = {"kb": (hi - lo) // 1024, "name": head[5] if len(head) > 5 else "", "perms": head[1]}
                elif cur is not None and head[0].rstrip(":") in ("Rss", "AnonHugePages", "Shared_Dirty",
                                                                    "Private_Dirty", "Swap", "THPeligible",
                                                                    "KSM", "Locked"):
                    cur[head[0].rstrip(":")] = int(head[1])
        return cur
    big = [s for s in steps if s.nbytes() >= 2**20]
    out["mappings"] = {s.name: {"live": mapping(s.live.data_ptr()), "staged": mapping(s.src.data_ptr())}
                       for s in big[:3]}
    out["mappings"]["fresh"] = mapping(fdst[0].data_ptr())
    live_to_fresh = [(d.data_ptr(), s.live.data_ptr(), s.nbytes()) for d, s in zip(fdst, steps)]
    per_step = [[] for _ in steps]
    per_step_fresh = [[] for _ in steps]
    per_step_write_live = [[] for _ in steps]  # fresh -> live
    per_step_read_live = [[] for _ in steps]  # live -> fresh
    for _ in range(rounds):
        r = {}
        for name, f in (("steps_memmove", lambda: mm(live_staged)),
                        ("flat_memmove", lambda: ctypes.memmove(b.data_ptr(), a.data_ptr(), n)),
                        ("staged_to_fresh", lambda: mm(fresh_dst)),
                        ("fresh_to_live", lambda: mm(fresh_src)),
                        ("fresh_to_fresh", lambda: mm(fresh_both)),
                        ("staged_onto_itself", lambda: mm(staged_to_staged)),
                        ("staged_to_fresh_at_live_offsets", lambda: mm(fresh_dst_liveoff)),
                        ("live_to_fresh", lambda: mm(live_to_fresh)),
                        ("steps_torch", lambda: [_copy(s.live, s.src, "torch") for s in steps]),
                        ("flat_torch", lambda: b.copy_(a))):
            t = time.perf_counter()
            f()
            r[name] = (time.perf_counter() - t) * 1e3
        for i, (pl, pf) in enumerate(zip(live_staged, fresh_dst)):
            t = time.perf_counter()
            ctypes.memmove(*pl)
            per_step[i].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            ctypes.memmove(*pf)
            per_step_fresh[i].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            ctypes.memmove(*fresh_src[i])
            per_step_write_live[i].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            ctypes.memmove(*live_to_fresh[i])
            per_step_read_live[i].append((time.perf_counter() - t) * 1e3)
        out["rounds"].append(r)
    # the largest step's pair copied other ways: in 1 MiB pieces, and through a 256 KiB buffer (reads and writes
    # of DRAM apart in time)
    big_i = max(range(len(steps)), key=lambda i: steps[i].nbytes())
    d0, s0, n0 = live_staged[big_i]
    bounce = torch.empty(256 * 1024, dtype=torch.uint8)
    bp = bounce.data_ptr()
    ways = {"direct": [], "pieces_1m": [], "bounce_256k": []}
    for _ in range(rounds):
        t = time.perf_counter()
        ctypes.memmove(d0, s0, n0)
        ways["direct"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        for o in range(0, n0, 2**20):
            ctypes.memmove(d0 + o, s0 + o, min(2**20, n0 - o))
        ways["pieces_1m"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        for o in range(0, n0, 256 * 1024):
            k = min(256 * 1024, n0 - o)
            ctypes.memmove(bp, s0 + o, k)
            ctypes.memmove(d0 + o, bp, k)
        ways["bounce_256k"].append((time.perf_counter() - t) * 1e3)
    out["largest_step_ways_min_ms"] = {"name": steps[big_i].name, **{k: round(min(v), 3) for k, v in ways.items()}}
    # the same copy right after a parallel torch op (its OpenMP team then spins a while) and after a 50 ms sleep
    after = {"after_torch_op": [], "after_sleep": []}
    small_a, small_b = torch.ones(2**22, dtype=torch.float32), torch.empty(2**22, dtype=torch.float32)
    for _ in range(rounds):
        torch.add(small_a, 1, out=small_b)
        t = time.perf_counter()
        ctypes.memmove(d0, s0, n0)
        after["after_torch_op"].append((time.perf_counter() - t) * 1e3)
        time.sleep(0.05)
        t = time.perf_counter()
        ctypes.memmove(d0, s0, n0)
        after["after_sleep"].append((time.perf_counter() - t) * 1e3)
    out["largest_step_after_min_ms"] = {k: round(min(v), 3) for k, v in after.items()}
    out["largest_step_after_ms"] = {k: [round(x, 2) for x in v] for k, v in after.items()}
    out["worker_env"] = {"affinity": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                         **{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
                                                           "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                                           "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD")}}
    for a_, x, y, w, r_ in zip(out["addresses"], per_step, per_step_fresh, per_step_write_live, per_step_read_live):
        a_["staged_to_live_min_ms"], a_["staged_to_fresh_min_ms"] = round(min(x), 3), round(min(y), 3)
        a_["fresh_to_live_min_ms"], a_["live_to_fresh_min_ms"] = round(min(w), 3), round(min(r_), 3)
    return out


def cpu_snapshot():
    """Nanoseconds each thread of each process on this host has run (/proc/PID/task/TID/schedstat), keyed by
    (pid, tid, process name, thread name): taken either side of a commit, the difference says what else ran."""
    snap = {"ticks": float(open("/proc/uptime").read().split()[0]) * os.sysconf("SC_CLK_TCK")}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            pname = open(f"/proc/{pid}/comm").read().strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                    tname = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                    start = int(open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[19])
                except (OSError, ValueError, IndexError):
                    continue
                snap[(int(pid), int(tid), pname, tname)] = (ns, start)
        except OSError:
            continue
    return snap


def _ours():
    """This process and its descendants (the engine's processes, the publishers)."""
    parent = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                parent[int(pid)] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    ours, me = set(), os.getpid()
    for pid in parent:
        p, seen = pid, 0
        while p and seen < 64:
            if p == me:
                ours.add(pid)
                break
            p, seen = parent.get(p, 0), seen + 1
    return ours


def cpu_between(a, b, wall_s, top=8):
    """The threads that ran between two snapshots, the busiest first (ms, `ours`: this process or a descendant),
    and the host's total and the part of it outside this run's processes, in CPUs."""
    ours = _ours()

    def ran(k):  # ns in the window: a thread missing from the first snapshot counts only if it started after it
        if k in a:
            return b[k][0] - a[k][0]
        return b[k][0] if b[k][1] >= a["ticks"] - 1 else 0
    d = sorted(((ran(k) / 1e6, k) for k in b if k != "ticks" and ran(k) > 0), reverse=True)
    per = (lambda xs: round(sum(xs) / 1e3 / wall_s, 2) if wall_s > 0 else None)
    return {"cpus_busy": per([x for x, _ in d]), "cpus_busy_others": per([x for x, k in d if k[0] not in ours]),
            "wall_ms": round(wall_s * 1e3, 1),
            "threads": [{"ms": round(x, 1), "pid": k[0], "process": k[2], "thread": k[3], "ours": k[0] in ours}
                        for x, k in d[:top]]}


def ver_of(k):
    return "v2" if k % 2 else "v1"


class Stepper:
    """Keeps len(PROMPTS) requests decoding in the engine; counts tokens per step with wall-clock times."""

    def __init__(self, llm, max_tokens):
        from vllm import SamplingParams
        self.llm, self.n = llm, 0
        self.sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        self.seen, self.log, self.finished = {}, [], []
        for _ in PROMPTS:
            self.add()

    def add(self):
        from vllm.inputs import TokensPrompt
        rid = f"r{self.n}"
        self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=PROMPTS[self.n % len(PROMPTS)]), self.sp)
        self.seen[rid] = 0
        self.n += 1

    def step(self):
        outs = self.llm.llm_engine.step()
        t, new = time.time(), 0
        for o in outs:
            c = o.outputs[0]
            new += len(c.token_ids) - self.seen.get(o.request_id, 0)
            self.seen[o.request_id] = len(c.token_ids)
            if o.finished:
                spans = [(s.version, s.start, s.end) for s in (c.weight_versions or [])]
                self.finished.append({"id": o.request_id, "tokens": len(c.token_ids), "versions": spans})
                self.add()
        self.log.append((t, new))
        return new

    def tokens_between(self, a, b):
        return sum(n for t, n in self.log if a < t <= b)


_copy_bufs = None


def local_copy_ms(nbytes, reps=3):
    """A plain memcpy of the rank's bytes (torch, this process): the floor of any commit that copies them."""
    import torch
    import ctypes
    global _copy_bufs
    if _copy_bufs is None or _copy_bufs[0].numel() != nbytes:
        _copy_bufs = (torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8))
    src, dst = _copy_bufs
    dst.copy_(src)
    ways = {"torch": lambda: dst.copy_(src), "memmove": lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)}
    best = {}
    for name, f in ways.items():
        ms = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ms.append((time.perf_counter() - t) * 1e3)
        best[name] = sorted(ms)[len(ms) // 2]
    _copy_ways.append(best)
    return min(best.values())  # the faster plain copy: the strict baseline


_copy_ways = []  # each local_copy_ms call's figures per way (recorded beside the minimum)


def main(cfg_path, out_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    tp = cfg["tp"]
    _set_env(tp)
    work = cfg["work"]
    reg = "file:" + os.path.join(work, "registry")
    os.makedirs(reg[5:], exist_ok=True)
    import torch
    import vllm
    from refit.vllm import inflight
    res = {"config": cfg, "env": {"vllm": vllm.__version__, "torch": torch.__version__, "cpus": os.cpu_count()},
           "single": [], "updates": [], "faults": {}}
    procs = []
    shm_before = _vllm_shm()

    def note(name, **kw):
        print(f"inflight_driver: {name} {json.dumps(kw, default=str)[:500]}", flush=True)

    def dump(llm, tag):
        d = os.path.join(work, tag)
        llm.collective_rpc(w_dump, args=(d,))
        return d

    try:
        # 1. references
        refs, gens = {}, {}
        for ver in ("v1", "v2"):
            ref, _ = start_llm(cfg[ver], cfg, refit=False)
            refs[ver] = dump(ref, "ref-" + ver)
            gens[ver] = generate(ref)
            stop_llm(ref)
            del ref
        res["refs_differ"] = not compare(refs["v1"], refs["v2"], tp)["equal"]
        note("references", differ=res["refs_differ"])

        # 2. the publisher
        # publisher_digest false (the benchmark): the publisher shares the engine's process and 2 cores, and the
        # content digests it computes after each publish slowed the engine's decode steps ~10x for ~1 s
        pub, arena, images, offs = hf_publisher(cfg, reg, "inflight", digest=cfg.get("publisher_digest", True))

        def publish(k):
            arena[:] = images[ver_of(k)]
            pub.publish(k)

        # 3. the engine on v1, single-phase updates
        llm, _ = start_llm(cfg["v1"], cfg, refit=True)
        assert compare(dump(llm, "start"), refs["v1"], tp)["equal"]
        if cfg.get("mla_unalias"):  # issue 35: MLA's derived tensors in storage of their own (vllm_driver)
            res["mla_unaliased"] = llm.collective_rpc(w_mla_unalias)
        llm.collective_rpc("init_weight_transfer_engine", args=({"registry": reg, "job": "inflight"},))
        k = 0
        for _ in range(int(cfg.get("single", 2))):
            k += 1
            publish(k)
            t = time.perf_counter()
            llm.start_weight_update()
            llm.update_weights({"update_info": {"version": k}})
            llm.finish_weight_update()
            ms = (time.perf_counter() - t) * 1e3
            rep = llm.collective_rpc(lambda w: w.weight_transfer_engine.report)
            eq = compare(dump(llm, f"single-{k}"), refs[ver_of(k)], tp)
            res["single"].append({"version": k, "pause_ms": ms, "pull_ms": max(r["pull_ms"] for r in rep),
                                  "apply_ms": max(r["apply_total_ms"] for r in rep), "verified": eq["equal"],
                                  "mismatches": eq["mismatches"][:5]})
            note("single", **res["single"][-1])

        # 4. two-phase updates while generating
        init = {"registry": reg, "job": "inflight", "stage": "host"}
        if cfg.get("budget_probe"):  # a budget too small is refused at init, naming the figures
            try:
                llm.collective_rpc("init_weight_transfer_engine", args=(dict(init, staging_budget=4096),))
                res["budget_refusal"] = None
            except Exception as e:
                res["budget_refusal"] = f"{type(e).__name__}: {e}"
            note("budget", refusal=(res["budget_refusal"] or "")[:300])
        llm.collective_rpc("init_weight_transfer_engine", args=(init,))
        res["init_report"] = llm.collective_rpc(lambda w: w.weight_transfer_engine.init_report)
        rank_bytes = max(r["staging_bytes"] for r in res["init_report"])
        # vLLM's weight version label, set at every commit: each request's output names the versions of its
        # tokens (CompletionOutput.weight_versions)
        llm.llm_engine.set_weight_version(str(k))
        res["commit_points"] = {}
        st = Stepper(llm, int(cfg.get("max_tokens", 48)))
        for _ in range(3):
            st.step()

        def stage_and_wait(k, limit_s=120, start=True):
            t0 = time.time()
            if start:
                inflight.stage(llm, k)
            t_ret = time.time()
            while True:
                v = inflight.versions(llm)
                if all(x["staging"] is None for x in v):
                    return v, t0, t_ret
                st.step()
                if time.time() - t0 > limit_s:  # say where each worker's staging thread stands, and since when
                    raise TimeoutError(f"staging {k} did not end in {limit_s} s: " + "; ".join(
                        f"worker {r}: {x.get('phase')} for {x.get('phase_s')} s" for r, x in enumerate(v)
                        if x["staging"] is not None))

        ab = cfg.get("commit_copy_ab")  # an interleaved A/B of the commit's host copies: one mode per update in turn
        for u in range(int(cfg.get("updates", 4))):
            k += 1
            if ab:
                inflight.set_commit_copy(llm, ab[u % len(ab)])
            hab = cfg.get("hugepages_ab")  # an interleaved A/B of the staging memory: a re-init per update in turn
            if hab:
                llm.collective_rpc("init_weight_transfer_engine",
                                   args=(dict(init, staging_hugepages=hab[u % len(hab)]),))
                huge = llm.collective_rpc(lambda w: w.weight_transfer_engine.init_report["staging_huge_bytes"])
            if cfg.get("stage_before_publish"):  # the worker waits for the trainer in the background
                t0 = time.time()
                inflight.stage(llm, k)
                t_ret = time.time()
                # the staging thread runs at nice 19: on a loaded host it may begin its pull only after a second;
                # publish once every worker's pull is waiting for the version, and 3 decode steps later
                while not all(x["pulling"] == k for x in inflight.versions(llm)):
                    st.step()
                    if time.time() - t0 > 120:
                        raise TimeoutError(f"the staging thread did not begin pulling {k} in 120 s")
                for _ in range(3):
                    st.step()
                publish(k)
                v, _, _ = stage_and_wait(k, start=False)
            else:
                publish(k)
                # the publisher shares this process and its 2 cores (a trainer would not): let the work its publish
                # leaves (if any) settle for a few steps, recorded, before the pull starts
                n_pub = len(st.log)
                for _ in range(int(cfg.get("steps_after_publish", 5))):
                    st.step()
                after_pub = [round((b[0] - a[0]) * 1e3, 1) for a, b in zip(st.log[n_pub - 1:], st.log[n_pub:])]
                v, t0, t_ret = stage_and_wait(k)
            stg = v[0]["last_stage"]
            assert all(x["staged"] == k for x in v), v
            assert inflight.is_staged(llm, k) and not inflight.is_committed(llm, k)
            state_staged = compare(dump(llm, f"staged-{k}"), refs[ver_of(k - 1)], tp)  # staging wrote no live byte
            during = st.tokens_between(stg["pull_start"], stg["pull_end"])
            during_stage = st.tokens_between(t0, stg["prepare_end"])
            lc_before = local_copy_ms(rank_bytes)
            snap0, w0 = cpu_snapshot(), time.perf_counter()
            qab = cfg.get("quiet_wait_ab")  # an interleaved A/B of the driver's wait for the commit's replies
            c = inflight.commit(llm, k, quiet_wait=qab[u % len(qab)] if qab else True)
            w1 = time.perf_counter()
            cpu_commit = cpu_between(snap0, cpu_snapshot(), w1 - w0)
            res["commit_points"][str(k)] = dict(st.seen)  # tokens each request had when k became live
            lc_after = local_copy_ms(rank_bytes)
            lc_ways = _copy_ways[-2:]
            lc = (lc_before + lc_after) / 2  # the machine is shared: the copy measured on both sides
            wc = llm.collective_rpc(w_plain_copy_ms)  # every worker at once, after the commit (its bytes known)
            wc_ms = max(x["ms"] for x in wc)
            probe = llm.collective_rpc(w_copy_probe) if cfg.get("copy_probe") else None
            eq = compare(dump(llm, f"committed-{k}"), refs[ver_of(k)], tp)
            wv = inflight.versions(llm)
            for _ in range(3):
                st.step()
            rec = {"version": k, "pause_ms": c["pause_ms"], "commit_rpc_ms": c["commit_rpc_ms"], "calls_ms": c,
                   "worker_commit_ms": max(x["last_commit"].get("commit_ms", 0) for x in wv),
                   "worker_agree_ms": max(x["last_commit"].get("agree_ms", 0) for x in wv),
                   "worker_agree_parts_ms": [x["last_commit"].get("agree_parts_ms") for x in wv],
                   "worker_agreement": [x["last_commit"].get("agreement") for x in wv],
                   "copy_ms": max(x["last_commit"]["copy_ms"] for x in wv),
                   "bytes_copied": max(x["last_commit"]["bytes_copied"] for x in wv),
                   "handles_exchanged": max(x["last_commit"]["handles_exchanged"] for x in wv),
                   "derived": max(x["last_commit"].get("derived", 0) for x in wv),  # issue 35: MLA re-derived
                   "pull_ms": stg["pull_ms"], "prepare_ms": stg["prepare_ms"],
                   "stage_call_ms": (t_ret - t0) * 1e3, "rank_bytes": rank_bytes, "pulled_bytes": stg["bytes"],
                   "local_copy_ms": lc, "local_copy_before_after_ms": [lc_before, lc_after],
                   "local_copy_ways_ms": lc_ways, "copy_probe": probe, "cpu_during_commit": cpu_commit,
                   "staging_hugepages": hab[u % len(hab)] if hab else None,
                   "staging_huge_bytes": huge if hab else None, "commit_copy": wv[0]["last_commit"].get("copy_mode"),
                   "commit_ms_by_kind": [x["last_commit"].get("ms_by_kind") for x in wv],
                   "steps_in_stage": [(round((t - stg["pull_start"]) * 1e3, 1), n) for t, n in st.log
                                      if t0 - 1 < t <= stg["prepare_end"] + 0.001],
                   "pull_window_ms": (stg["pull_end"] - stg["pull_start"]) * 1e3,
                   "thread": stg.get("thread"),
                   "step_ms_after_publish": locals().get("after_pub"),
                   "pause_over_copy": c["pause_ms"] / lc,
                   "workers_plain_copy_ms": wc_ms, "workers_plain_copy": wc,
                   "pause_over_workers_copy": c["pause_ms"] / wc_ms,
                   "tokens_during_pull": during, "tokens_during_stage": during_stage,
                   "live_untouched_while_staged": state_staged["equal"],
                   "committed": [x["committed"] for x in wv], "verified": eq["equal"],
                   "mismatches": eq["mismatches"][:5]}
            res["updates"].append(rec)
            note("update", **{a: b for a, b in rec.items() if a != "mismatches"})
        while len(st.finished) < 2 * len(PROMPTS):
            st.step()
        res["requests"] = list(st.finished)  # those that finished before the faults (their commits are recorded)

        # 4b. tp > 1: one worker without the staged version.  Every worker staged k, then the last one drops it; the
        # commit must be refused on every worker (the agreement's fast all_reduce sees a worker not ready and all
        # gather the reasons), naming that worker, with no live byte written; then k staged again commits exactly.
        if cfg.get("one_worker_refusal") and tp > 1:
            prev = ver_of(k)
            k += 1
            publish(k)
            stage_and_wait(k)
            staged_before = [x["staged"] for x in inflight.versions(llm)]
            llm.collective_rpc(w_drop_staged_on, args=(tp - 1,))
            staged_after_drop = [x["staged"] for x in inflight.versions(llm)]
            try:
                inflight.commit(llm, k)
                err = None
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            # every worker's reply to the next call is that call's (inflight.commit realigned vLLM's executor)
            probe = llm.collective_rpc(w_rank, args=("after-refusal",))
            ow = {"staged_before": staged_before, "staged_after_drop": staged_after_drop, "error": err,
                  "probe_after_refusal": probe, "staged_after_refusal": [x["staged"] for x in inflight.versions(llm)],
                  "committed": [x["committed"] for x in inflight.versions(llm)],
                  "state_vs_previous": compare(dump(llm, "one-worker"), refs[prev], tp)["equal"]}
            n0 = len(st.log)
            for _ in range(3):
                st.step()
            ow["tokens_after_refusal"] = sum(n for _, n in st.log[n0:])  # the scheduler was resumed
            stage_and_wait(k)
            inflight.commit(llm, k)
            res["commit_points"][str(k)] = dict(st.seen)
            ow["retry_committed"] = [x["committed"] for x in inflight.versions(llm)]
            ow["retry_verified"] = compare(dump(llm, "one-worker-retry"), refs[ver_of(k)], tp)["equal"]
            res["one_worker_refusal"] = ow
            note("one-worker refusal", **ow)

            # 4c. every worker has k staged (so the workers do not agree under the pause), and the last one's commit
            # raises before its live writes while the others commit: the workers hold different versions.  The
            # commit must say so and keep the scheduler paused; staging k again everywhere and committing it mends it.
            prev = ver_of(k)
            k += 1
            publish(k)
            stage_and_wait(k)
            llm.collective_rpc(w_set_fault_on, args=(tp - 1, "commit-postload"))
            try:
                inflight.commit(llm, k)
                err = None
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            llm.collective_rpc(w_set_fault_on, args=(tp - 1, None))
            vv = inflight.versions(llm)
            n0 = len(st.log)
            for _ in range(3):
                st.step()
            sw = {"error": err, "committed": [x["committed"] for x in vv], "agreement": [
                x["last_commit"].get("agreement") for x in vv], "tokens_while_split": sum(n for _, n in st.log[n0:])}
            stage_and_wait(k)
            c = inflight.commit(llm, k, pause=False)  # the scheduler is still paused from the failed commit
            llm.wake_up(tags=["scheduling"])
            res["commit_points"][str(k)] = dict(st.seen)
            sw["retry_staged_everywhere"] = c["staged_everywhere"]
            sw["retry_committed"] = [x["committed"] for x in inflight.versions(llm)]
            sw["retry_verified"] = compare(dump(llm, "split-retry"), refs[ver_of(k)], tp)["equal"]
            n0 = len(st.log)
            for _ in range(3):
                st.step()
            sw["tokens_after_retry"] = sum(n for _, n in st.log[n0:])
            res["split_commit"] = sw
            note("split commit", **sw)

        # 5. faults
        if cfg.get("faults"):
            F = res["faults"]
            prev = ver_of(k)

            def intact(tag):
                return compare(dump(llm, tag), refs[prev], tp)

            # a. digest mismatch: the source's bytes change after it published
            publish(k + 1)
            name = next(iter(offs))
            arena[offs[name]:offs[name] + 64] ^= 0x5A
            n0 = len(st.log)
            v, _, _ = stage_and_wait(k + 1)
            for _ in range(3):
                st.step()
            F["digest"] = {"error": v[0]["error"], "staged": v[0]["staged"],
                           "state_vs_previous": intact("digest")["equal"],
                           "tokens_after_failure": sum(n for _, n in st.log[n0:])}
            note("fault digest", **F["digest"])
            try:
                inflight.commit(llm, k + 1)
                F["digest"]["commit"] = "accepted"
            except Exception as e:
                F["digest"]["commit"] = f"{type(e).__name__}: {e}"[:400]
            F["digest"]["after_commit_attempt"] = intact("digest-commit")["equal"]
            k += 1  # version k is burnt; the next ones are good again

            # b. a publisher process killed while the worker pulls from it
            kill_job = "killed"
            p = subprocess.Popen([cfg["refit"], "publish", "--from-safetensors", cfg[ver_of(k + 1)], "--layout", "hf",
                                  "--rank", "0", "--registry", reg, "--job", kill_job, "--versions", "1",
                                  "--timeout-ms", "600000", "--hold-ms", "600000"],
                                 stdout=open(os.path.join(work, "killed.log"), "w"), stderr=subprocess.STDOUT)
            procs.append(p)
            llm.collective_rpc("init_weight_transfer_engine",
                               args=(dict(init, job=kill_job, timeout_ms=8000, model=None),))
            time.sleep(2.0)  # let it publish; killed before the worker reads it (a kill during the read of a
            p.send_signal(signal.SIGKILL)  # 1 MB pull cannot be timed from here)
            p.wait()
            n0 = len(st.log)
            v, _, _ = stage_and_wait(1)
            for _ in range(3):
                st.step()
            F["killed"] = {"error": v[0]["error"], "staged": v[0]["staged"],
                           "state_vs_previous": intact("killed")["equal"],
                           "tokens_after_failure": sum(n for _, n in st.log[n0:]),
                           "committed": v[0]["committed"]}
            note("fault killed", **F["killed"])
            inflight.versions(llm)
            llm.collective_rpc("init_weight_transfer_engine", args=(init,))

            # c. a post-load step raising while staging
            k += 1
            publish(k)
            inflight.set_fault(llm, "stage-postload")
            v, _, _ = stage_and_wait(k)
            inflight.set_fault(llm, None)
            F["stage_postload"] = {"error": v[0]["error"], "staged": v[0]["staged"],
                                   "state_vs_previous": intact("stage-postload")["equal"]}
            note("fault stage-postload", **F["stage_postload"])

            # d. the commit's post-load step raising before any live write
            k += 1
            publish(k)
            stage_and_wait(k)
            inflight.set_fault(llm, "commit-postload")
            try:
                inflight.commit(llm, k)
                err = None
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            inflight.set_fault(llm, None)
            n0 = len(st.log)
            for _ in range(3):
                st.step()
            F["commit_postload"] = {"error": err, "state_vs_previous": intact("commit-postload")["equal"],
                                    "versions": inflight.versions(llm)[0]["committed"],
                                    "tokens_after": sum(n for _, n in st.log[n0:]),
                                    "still_staged": inflight.is_staged(llm, k)}
            c = inflight.commit(llm, k)  # the same staged version, now without the fault
            prev = ver_of(k)
            F["commit_postload"]["retry_verified"] = intact("commit-postload-retry")["equal"]
            note("fault commit-postload", **F["commit_postload"])

            # e. a live copy raising mid-commit: mixed, paused, then the same version again
            k += 1
            publish(k)
            stage_and_wait(k)
            inflight.set_fault(llm, "commit-copy")
            try:
                inflight.commit(llm, k)
                err = None
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            inflight.set_fault(llm, None)
            vv = inflight.versions(llm)[0]
            n0 = len(st.log)
            for _ in range(3):
                st.step()
            mixed_vs_prev = intact("commit-copy-mixed")["equal"]
            mixed_vs_new = compare(os.path.join(work, "commit-copy-mixed"), refs[ver_of(k)], tp)["equal"]
            F["commit_copy"] = {"error": err, "mixed": vv["mixed"],
                                "tokens_while_mixed": sum(n for _, n in st.log[n0:]),
                                "mixed_equals_previous": mixed_vs_prev, "mixed_equals_new": mixed_vs_new}
            try:
                inflight.stage(llm, k)
                F["commit_copy"]["stage_while_mixed"] = "accepted"
            except Exception as e:
                F["commit_copy"]["stage_while_mixed"] = f"{type(e).__name__}: {e}"[:300]
            c = inflight.commit(llm, k, pause=False)  # the scheduler is still paused from the failed commit
            llm.wake_up(tags=["scheduling"])
            F["commit_copy"]["retry_verified"] = compare(dump(llm, "commit-copy-retry"), refs[ver_of(k)], tp)["equal"]
            F["commit_copy"]["committed"] = inflight.versions(llm)[0]["committed"]
            n0 = len(st.log)
            for _ in range(3):
                st.step()
            F["commit_copy"]["tokens_after_retry"] = sum(n for _, n in st.log[n0:])
            note("fault commit-copy", **F["commit_copy"])

        # greedy generation at the end equals a vLLM started on the committed version
        while llm.llm_engine.has_unfinished_requests():
            llm.llm_engine.step()
        res["final_version"] = ver_of(k)
        res["final_generation_equal"] = generate(llm) == gens[ver_of(k)]
        note("final", equal=res["final_generation_equal"], version=k)
        llm.collective_rpc("shutdown_weight_transfer_engine")
        pub.close()
        stop_llm(llm)
        res["ok"] = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for name in sorted(_vllm_shm() - shm_before):  # vLLM 0.32 leaves some at tp > 1 (docs/vllm.md, finding 7)
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    gc.collect()
    os._exit(0)
