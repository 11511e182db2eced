"""Drives the real SGLang (0.5.23, CPU) through refit's SGLang receiver (python/refit/sglang);
tests/python/test_sglang.py runs it once per (model, tp) and asserts on the JSON it writes.

    python sglang_driver.py CONFIG.json OUT.json

CONFIG: {"v1": dir, "v2": dir, "bad": dir (one wrong shape; unused with "negative": false, which skips step 4),
         "tp": n, "src_layout": "megatron:tp=2,ep=2", "refit": path of the refit binary, "work": scratch dir,
         "versions": K}

SGLang runs with SGLANG_USE_CPU_ENGINE=1 and refit's stand-in sgl_kernel (tests/python/sglang_stub, first on
PYTHONPATH: PyPI has no CPU build of SGLang's kernel package); every kernel name SGLang asked the stand-in for, and
every one it called, is logged to work/sgl_kernel.log and reported ("kernels").  Each engine: sglang.Engine(
device="cpu", attention_backend="torch_native", sampling_backend="pytorch", skip_tokenizer_init=True,
disable_overlap_schedule=True, disable_cuda_graph=True, dtype="bfloat16", custom_weight_loader=[refit's loader,
sglang_ops.dump]).

  1. reference: SGLang started on v2; every worker dumps its live state (every parameter and buffer) and greedy
     generation (tokens, logprobs) is recorded; the engine is shut down;
  2. trainer stand-ins: `refit publish --from-safetensors v2 --layout src_layout --rank R` for every rank R (job
     "good", K versions of the same bytes), the bad checkpoint (job "bad-shape"), and a publisher in this process
     whose manifest names one tensor wrongly (job "bad-name": a receiver tensor no source covers);
  3. SGLang started on v1; its state and generation recorded;
  4. negative: RefitSglang.update on "bad-shape", then on "bad-name": each must raise RefitSglangError, and the
     state and generation must still be v1's, byte for byte;
  5. RefitSglang.update on "good" versions 1..K-1; the state after the first is compared with the reference byte
     for byte and greedy generation must be identical;
  6. SGLang's own update_weights_from_tensor for the same bytes (the v2 checkpoint, read into memory untimed),
     timed between begin_weight_update and end_weight_update; its state is compared with the reference; then its
     update_weights_from_distributed for the same bytes (gloo group of this process and the TP workers), timed;
  7. refit once more (version K): the state must equal the reference again;
  8. direct mode: SGLang's own update_weights_from_tensor back to v1 (checked against the v1 state), then a new
     RefitSglang(mode="direct") pulls version K straight into the live parameters: equal to the reference again.
"""
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PROMPTS = [[1, 5, 9, 33, 70], [200, 3, 17], [42, 42, 7, 7, 100, 11], [249]]
PROBE = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79]  # step 9's prefix-cache probe
NO_NCCL = "/nonexistent/refit-no-nccl/libnccl.so.2"  # SGLANG_NCCL_SO_PATH for tp > 1 on the CPU


def _set_env(work, tp):
    stub = os.path.join(HERE, "sglang_stub")
    os.environ["PYTHONPATH"] = os.pathsep.join([stub, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    sys.path[:0] = [stub]
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    os.environ["REFIT_SGL_KERNEL_LOG"] = os.path.join(work, "sgl_kernel.log")
    if tp > 1:  # SGLang's CPU engine wants one NUMA node per rank unless each rank's cores are named
        os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(r % (os.cpu_count() or 1))
                                                                      for r in range(tp)))
        # SGLang 0.5.23 turns pynccl on for its TP group on the CPU platform too, and PyNcclCommunicator(cpu)
        # raises; it turns itself off when its NCCL library does not load (docs/sglang.md, "tp > 1 on the CPU")
        if os.environ.get("REFIT_SGLANG_KEEP_NCCL") != "1":
            os.environ.setdefault("SGLANG_NCCL_SO_PATH", NO_NCCL)


def start(path, cfg):
    import sglang
    import sglang_ops
    from refit.sglang import LOADER
    t = time.perf_counter()
    eng = sglang.Engine(model_path=path, tp_size=cfg["tp"], device="cpu", attention_backend="torch_native",
                        sampling_backend="pytorch", skip_tokenizer_init=True, disable_overlap_schedule=True,
                        disable_cuda_graph=True, dtype="bfloat16", random_seed=0,
                        context_length=cfg.get("context_length", 128),
                        max_total_tokens=cfg.get("max_total_tokens", 1024), max_running_requests=4,
                        mem_fraction_static=0.5, custom_weight_loader=[LOADER, sglang_ops.DUMP], log_level="warning")
    return eng, time.perf_counter() - t


def dump(eng, d):
    import sglang_ops
    eng.begin_weight_update()
    try:
        eng.update_weights_from_tensor(named_tensors=sglang_ops.request(d), load_format=sglang_ops.DUMP,
                                       flush_cache=False)
    finally:
        eng.end_weight_update()
    errs = [f for f in os.listdir(d) if f.endswith(".err")] if os.path.isdir(d) else ["(no directory)"]
    if errs:
        raise RuntimeError(f"dump to {d} failed: " + " ".join(open(os.path.join(d, f)).read() for f in errs
                                                               if os.path.isfile(os.path.join(d, f))))


def generate(eng):
    outs = eng.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": 8},
                        return_logprob=True)
    res = []
    for o in outs:
        lp = o["meta_info"].get("output_token_logprobs") or []
        res.append({"tokens": list(o["output_ids"]), "logprobs": [x[0] for x in lp]})
    return res


def probe(eng):
    """PROBE, greedy, 8 tokens: tokens, logprobs, and how many prompt tokens SGLang took from its prefix cache."""
    o = eng.generate(input_ids=[PROBE], sampling_params={"temperature": 0.0, "max_new_tokens": 8},
                     return_logprob=True)[0]
    return {"tokens": list(o["output_ids"]), "logprobs": [x[0] for x in o["meta_info"]["output_token_logprobs"]],
            "cached_tokens": o["meta_info"].get("cached_tokens")}


def stop(eng):
    try:
        eng.shutdown()
    except Exception:
        pass
    del eng
    gc.collect()


def kernels(work):
    path = os.path.join(work, "sgl_kernel.log")
    got, called = set(), set()
    if os.path.isfile(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 3:
                (got if parts[1] == "get" else called).add(parts[2])
    return {"imported": sorted(got), "called": sorted(called)}


def sglang_own_update(eng, ckpt):
    """SGLang's update_weights_from_tensor for the v2 bytes (read into memory first, not timed)."""
    from safetensors.torch import load_file
    weights = load_file(os.path.join(ckpt, "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    t0 = time.perf_counter()
    eng.begin_weight_update()
    t1 = time.perf_counter()
    ret = eng.update_weights_from_tensor(named_tensors=list(weights.items()), flush_cache=True)
    t2 = time.perf_counter()
    eng.end_weight_update()
    t3 = time.perf_counter()
    return {"checkpoint_bytes": nbytes, "answer": list(ret) if isinstance(ret, tuple) else str(ret),
            "begin_ms": (t1 - t0) * 1e3, "update_ms": (t2 - t1) * 1e3, "end_ms": (t3 - t2) * 1e3,
            "total_ms": (t3 - t0) * 1e3}


def sglang_own_distributed(eng, ckpt, tp):
    """SGLang's update_weights_from_distributed for the v2 bytes: this process is rank 0 of a gloo group with the
    engine's TP workers (init_weights_update_group), broadcasting every tensor of the checkpoint (read into memory
    first, not timed) while the engine's call runs in a thread; between begin/end_weight_update, timed."""
    import socket
    import threading

    import torch.distributed as dist
    from safetensors.torch import load_file
    from sglang.srt.utils.common import init_custom_process_group
    weights = load_file(os.path.join(ckpt, "model.safetensors"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = {}

    def call(key, fn, **kw):
        try:
            out[key] = fn(**kw)
        except Exception as e:  # reported, and the main thread's join times out or sees it
            out[key] = f"raised {type(e).__name__}: {e}"

    th = threading.Thread(target=call, args=("init", eng.init_weights_update_group),
                          kwargs=dict(master_address="127.0.0.1", master_port=port, rank_offset=1,
                                      world_size=1 + tp, group_name="refit-compare", backend="gloo"))
    th.start()
    pg = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1 + tp,
                                   rank=0, group_name="refit-compare")
    th.join(120)
    names = list(weights)
    t0 = time.perf_counter()
    eng.begin_weight_update()
    t1 = time.perf_counter()
    th = threading.Thread(target=call, args=("update", eng.update_weights_from_distributed),
                          kwargs=dict(names=names, dtypes=[str(weights[n].dtype).replace("torch.", "") for n in names],
                                      shapes=[list(weights[n].shape) for n in names], group_name="refit-compare"))
    th.start()
    for n in names:
        dist.broadcast(weights[n], src=0, group=pg)
    th.join(300)
    t2 = time.perf_counter()
    eng.end_weight_update()
    t3 = time.perf_counter()
    try:
        eng.destroy_weights_update_group(group_name="refit-compare")
        dist.destroy_process_group(pg)
    except Exception:
        pass
    return {"init": str(out.get("init")), "answer": str(out.get("update")),
            "checkpoint_bytes": sum(t.numel() * t.element_size() for t in weights.values()),
            "begin_ms": (t1 - t0) * 1e3, "update_ms": (t2 - t1) * 1e3, "end_ms": (t3 - t2) * 1e3,
            "total_ms": (t3 - t0) * 1e3}


def half_covered_publisher(ckpt, reg, job, suffix):
    """One rank (hf-like, in this process) holding the whole checkpoint, except that the tensor ending in `suffix`
    is placed for its first half of rows only: a receiver whose slice lies in that half is covered, one whose slice
    lies in the second half is not (at tp=2 of a column-parallel tensor: TP rank 0 pulls, rank 1 fails)."""
    import numpy as np
    import refit
    model = refit.Model(ckpt)
    tensors = model.tensors()
    half = next(t.name for t in tensors if t.name.endswith(suffix))
    m = refit.Manifest.build(model.name, "hf-half", 0, 1)
    offs, off = {}, 0
    for t in tensors:
        offs[t.name] = off
        off += -(-t.nbytes // 256) * 256
    m.add_region(off)
    arena = np.zeros(off, dtype=np.uint8)
    with refit.SafetensorsFile(os.path.join(ckpt, "model.safetensors")) as f:
        for t in tensors:
            arena[offs[t.name]:offs[t.name] + t.nbytes] = f.numpy(t.name).reshape(-1).view(np.uint8)
    for t in tensors:
        m.add_canonical(t.name, t.dtype, t.shape)
        m.add_local(t.name, t.dtype, t.shape, 0, offs[t.name])
        ext = list(t.shape)
        if t.name == half:
            ext[0] //= 2
        m.add_placement(t.name, t.name, (0,) * len(t.shape), ext, (0,) * len(t.shape))
    m.finalize()
    pub = refit.Publisher(m, registry=reg, job=job)
    pub.attach(0, arena)
    pub.publish(1)
    return pub, arena, half


def _ok_of(ret):
    return ret[0] if isinstance(ret, tuple) else getattr(ret, "success", ret)


def flush_when_idle(eng, limit_s=30):
    """eng.flush_cache() until SGLang accepts it.  Right after the last request's output came back, SGLang's
    scheduler may still count a running request for a loop iteration or so ("Cache not flushed because there are
    pending requests"), and refuses."""
    n, t = 0, time.perf_counter()
    while True:
        n += 1
        if _ok_of(eng.flush_cache()):
            return True, n
        if time.perf_counter() - t > limit_s:
            return False, n
        time.sleep(0.05)


async def _stream(eng, prompt, n, rec):
    """One greedy request, streamed: rec["tokens"] follows its completion tokens; rec["meta"] is its last
    meta_info (weight_versions: the spans of its tokens per SGLang weight version)."""
    gen = await eng.async_generate(input_ids=list(prompt), sampling_params={"temperature": 0.0, "max_new_tokens": n,
                                                                            "ignore_eos": True}, stream=True)
    async for ch in gen:
        rec["tokens"] = ch["meta_info"]["completion_tokens"]
        rec["meta"] = ch["meta_info"]
        rec["ids"] = list(ch.get("output_ids") or [])
    rec["done"] = True


async def _until(cond, limit_s=300, what="condition"):
    import asyncio
    t = time.perf_counter()
    while not cond():
        if time.perf_counter() - t > limit_s:
            raise TimeoutError(f"{what} not reached in {limit_s} s")
        await asyncio.sleep(0.005)


def inflight(eng, cfg, reg, work, res, tp, one_rank_pub):
    """Step 9.  A publisher in this process (the hf layout, one rank; vllm_inflight_driver.hf_publisher) whose
    version k holds v1's bytes for odd k and v2's for even k.  The engine holds v2 (step 8).
      a. single phase in place: 4 requests decoding (N tokens each); update(1, pause="in_place"); the requests
         complete; every parameter and buffer equal to the native v1 start; each request's weight-version spans
         change at the token it had reached;
      b. two phase: 4 requests decoding; stage(2) BEFORE version 2 is published (every worker's staging thread
         waits for it), tokens keep coming, then publish, wait_staged(2) while decoding, commit(2) under the
         in_place pause; the requests complete; state equal to the native v2 start.  SGLang's prefix cache:
         PROBE generated after (a) caches v1's KV for it; after the commit (no flush) it is served that stale KV
         and differs from the native v2 start's; flushed once idle (eng.flush_cache()), it is the same;
      c. refusals, each leaving the state equal to the reference: commit with nothing staged; a stage that times
         out (version 99 never published: is_staged raises, commit refused); at tp > 1 a stage from the one-rank
         publisher (step 4: rank 0 stages, rank 1 fails): commit refused on both;
      d. single phase under a retract pause (version 3: v1's bytes): the requests go back to the waiting queue,
         the update flushes the cache, they complete; state equal to the native v1 start, PROBE equal to its."""
    import asyncio
    from vllm_driver import compare
    from vllm_inflight_driver import hf_publisher

    from refit.sglang import RefitSglang, RefitSglangError
    N = int(cfg.get("inflight_tokens", 100))
    out = {"tokens_per_request": N}
    pub, arena, images, _ = hf_publisher(cfg, reg, "inflight")

    def publish(k):
        arena[:] = images["v1" if k % 2 else "v2"]
        pub.publish(k)

    def state(name, against):
        dump(eng, os.path.join(work, name))
        return compare(os.path.join(work, name), os.path.join(work, against), tp)

    rs = RefitSglang(eng, registry=reg, job="inflight", timeout_ms=120000)
    loop = eng.loop

    async def requests(recs):
        tasks = [loop.create_task(_stream(eng, p, N, r)) for p, r in zip(PROMPTS, recs)]
        await _until(lambda: all(r.get("tokens", 0) >= 2 for r in recs), what="2 tokens on every request")
        return tasks

    # a. single phase, in place
    publish(1)

    async def single():
        recs = [{} for _ in PROMPTS]
        tasks = await requests(recs)
        at = [r["tokens"] for r in recs]
        doc = await rs.aupdate(1, pause="in_place")
        after = [r["tokens"] for r in recs]
        await asyncio.gather(*tasks)
        return recs, at, after, doc
    recs, at, after, doc = loop.run_until_complete(single())
    out["single"] = {"tokens_before": at, "tokens_after": after, "driver": doc["driver"],
                     "reports": [w["report"] for w in doc["workers"]],
                     "done": [r.get("done", False) for r in recs], "final_tokens": [r["tokens"] for r in recs],
                     "weight_versions": [r["meta"].get("weight_versions") for r in recs]}
    out["single_vs_v1"] = state("inflight-single", "v1")
    out["single_vs_v1_equal"] = out["single_vs_v1"]["equal"]
    out["probe_at_v1"] = probe(eng)  # PROBE's KV enters SGLang's prefix cache, computed by v1

    # b. two phase
    async def two():
        recs = [{} for _ in PROMPTS]
        tasks = await requests(recs)
        t0 = [r["tokens"] for r in recs]
        sdoc = await rs.astage(2)
        t_stage = [r["tokens"] for r in recs]
        # version 2 is not published yet: every staging thread waits for it while SGLang keeps decoding
        await _until(lambda: sum(r["tokens"] for r in recs) >= sum(t_stage) + 4, what="tokens while staging")
        waiting = rs.staged()
        publish(2)
        st = await rs.await_staged(2)
        t_staged = [r["tokens"] for r in recs]
        cdoc = await rs.acommit(2)
        t_commit = [r["tokens"] for r in recs]
        await asyncio.gather(*tasks)
        return recs, {"before_stage": t0, "at_stage_return": t_stage, "at_staged": t_staged,
                      "at_commit_return": t_commit}, sdoc, waiting, st, cdoc
    recs, toks, sdoc, waiting, st, cdoc = loop.run_until_complete(two())
    out["two"] = {"tokens": toks, "stage_driver": sdoc["driver"], "waiting": waiting, "staged": st,
                  "commit_driver": cdoc["driver"], "commit_workers": cdoc["workers"],
                  "done": [r.get("done", False) for r in recs], "final_tokens": [r["tokens"] for r in recs],
                  "weight_versions": [r["meta"].get("weight_versions") for r in recs]}
    out["two_vs_reference"] = state("inflight-two", "ref")
    out["two_vs_reference_equal"] = out["two_vs_reference"]["equal"]
    # SGLang 0.5.23 finding: no flush (in_place), so PROBE reuses the KV v1 computed for it; flushed once idle,
    # it matches the native v2 start again
    out["probe_stale"] = probe(eng)
    out["flush_when_idle"], out["flush_attempts"] = flush_when_idle(eng)
    out["probe_flushed"] = probe(eng)
    out["two_generation_same_as_reference"] = generate(eng) == res["reference_generation"]
    out["pauses_ms"] = {"single_update": doc["driver"]["pause_ms"], "stage": sdoc["driver"]["pause_ms"],
                        "commit": cdoc["driver"]["pause_ms"]}

    # c. refusals
    ref = []

    def refused(name, fn):
        try:
            fn()
            ref.append({"case": name, "error": None})
        except RefitSglangError as e:
            ref.append({"case": name, "error": str(e), "type": type(e).__name__, "status": e.status})
    refused("commit-nothing-staged", lambda: rs.commit(2))
    rq = RefitSglang(eng, registry=reg, job="inflight", timeout_ms=3000)
    rq.stage(99)
    refused("stage-timeout-is-staged", lambda: rq.wait_staged(99, timeout_s=120))
    refused("stage-timeout-commit", lambda: rq.commit(99))
    rq.close()
    if one_rank_pub is not None:
        r1 = RefitSglang(eng, registry=reg, job="one-rank", timeout_ms=20000)
        r1.stage(1)
        refused("one-rank-is-staged", lambda: r1.wait_staged(1, timeout_s=120))
        refused("one-rank-commit", lambda: r1.commit(1))
        r1.close()
    out["refusals"] = ref
    out["after_refusals_vs_reference"] = state("inflight-refused", "ref")
    out["after_refusals_equal"] = out["after_refusals_vs_reference"]["equal"]

    # d. single phase under a retract pause: the requests go back to the queue, the update flushes the cache, they
    # recompute their KV with v1's weights (version 3 holds v1's bytes) and complete
    publish(3)
    rs.close()
    rs = RefitSglang(eng, registry=reg, job="inflight", timeout_ms=120000)

    async def retract():
        recs = [{} for _ in PROMPTS]
        tasks = await requests(recs)
        at = [r["tokens"] for r in recs]
        doc = await rs.aupdate(3, pause="retract")
        await asyncio.gather(*tasks)
        return recs, at, doc
    recs, at, rdoc = loop.run_until_complete(retract())
    out["retract"] = {"tokens_before": at, "driver": rdoc["driver"], "done": [r.get("done", False) for r in recs],
                      "final_tokens": [r["tokens"] for r in recs],
                      "weight_versions": [r["meta"].get("weight_versions") for r in recs]}
    out["retract_vs_v1"] = state("inflight-retract", "v1")
    out["retract_vs_v1_equal"] = out["retract_vs_v1"]["equal"]
    out["probe_after_retract"] = probe(eng)
    out["pauses_ms"]["retract_update"] = rdoc["driver"]["pause_ms"]
    rs.close()
    pub.close()
    return out


def main(cfg_path, out_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    tp, work = cfg["tp"], cfg["work"]
    os.makedirs(work, exist_ok=True)
    _set_env(work, tp)
    reg = "file:" + os.path.join(work, "registry")
    os.makedirs(reg[5:], exist_ok=True)
    K = int(cfg.get("versions", 3))
    import platform

    import sglang
    import torch
    from vllm_driver import compare, publishers, wrong_name_publisher

    from refit.sglang import RefitSglang, RefitSglangError
    res = {"config": cfg, "steps": [], "env": {"sglang": sglang.__version__, "torch": torch.__version__,
                                               "python": platform.python_version(), "cpus": os.cpu_count()}}
    log = open(os.path.join(work, "publishers.log"), "w")
    procs = []

    def step(name, **kw):
        res["steps"].append(dict(step=name, **kw))
        print(f"sglang_driver: {name} {json.dumps(kw)[:400]}", flush=True)

    eng = None
    try:
        # 1. reference
        ref, secs = start(cfg["v2"], cfg)
        dump(ref, os.path.join(work, "ref"))
        res["reference_generation"] = generate(ref)
        res["reference_probe"] = probe(ref)
        step("reference", start_s=secs)
        stop(ref)

        # 2. publishers
        procs += publishers(cfg, cfg["v2"], "good", K, tp, reg, log)
        neg_on = cfg.get("negative", True)
        if neg_on:
            procs += publishers(cfg, cfg["bad"], "bad-shape", 1, 0, reg, log)
            wn_pub, _wn_arena, wn_tensor = wrong_name_publisher(cfg["v2"], reg, "bad-name")
            res["wrong_name_tensor"] = wn_tensor
            if tp > 1:  # a failure on one TP worker only: the other pulls v2, and none may apply it
                hc_pub, _hc_arena, hc_tensor = half_covered_publisher(cfg["v2"], reg, "one-rank",
                                                                      cfg["one_rank_tensor"])
                res["one_rank_tensor"] = hc_tensor

        # 3. SGLang on v1
        eng, secs = start(cfg["v1"], cfg)
        dump(eng, os.path.join(work, "v1"))
        res["v1_generation"] = generate(eng)
        res["v1_probe"] = probe(eng)
        res["v1_vs_reference"] = compare(os.path.join(work, "v1"), os.path.join(work, "ref"), tp)
        step("v1", start_s=secs)

        # 4. negative
        res["negative"] = []
        for job in (("bad-shape", "bad-name") + (("one-rank",) if tp > 1 else ())) if neg_on else ():
            rs = RefitSglang(eng, registry=reg, job=job, timeout_ms=20000)
            err = None
            try:
                rs.update(1)
            except RefitSglangError as e:
                err = {"type": type(e).__name__, "status": e.status, "families": [c.__name__ for c in type(e).__mro__
                                                                                   if c.__module__ == "refit.core"],
                       "message": str(e)}
            d = os.path.join(work, "after-" + job)
            dump(eng, d)
            neg = {"job": job, "error": err, "state_vs_v1": compare(d, os.path.join(work, "v1"), tp),
                   "generation_same_as_v1": generate(eng) == res["v1_generation"], "outcome": rs.last}
            res["negative"].append(neg)
            rs.close()
            step("negative", job=job, error=(err or {}).get("message", "")[:300], intact=neg["state_vs_v1"]["equal"])
        if neg_on:
            wn_pub.close()

        # 5. the refit
        rs = RefitSglang(eng, registry=reg, job="good", timeout_ms=120000)
        res["updates"] = []
        for v in range(1, K):
            t = time.perf_counter()
            doc = rs.update(v)
            ms = (time.perf_counter() - t) * 1e3
            res["updates"].append({"version": v, "driver_ms": ms, "outcome": doc})
            if v == 1:
                dump(eng, os.path.join(work, "refit"))
                res["refit_vs_reference"] = compare(os.path.join(work, "refit"), os.path.join(work, "ref"), tp)
                res["refit_generation"] = generate(eng)
                step("refit", version=v, driver_ms=ms, equal=res["refit_vs_reference"]["equal"])

        # 6. SGLang's own path for the same bytes
        own = sglang_own_update(eng, cfg["v2"])
        dump(eng, os.path.join(work, "own"))
        res["sglang_update_from_tensor"] = dict(own, vs_reference=compare(os.path.join(work, "own"),
                                                                          os.path.join(work, "ref"), tp),
                                                generation_same_as_reference=generate(eng) ==
                                                res["reference_generation"])
        step("sglang_update_from_tensor", ms=own["total_ms"],
             equal=res["sglang_update_from_tensor"]["vs_reference"]["equal"])

        # 6b. SGLang's update_weights_from_distributed for the same bytes (gloo, this process the sender)
        # (timing only: the engine already holds v2 here, so its state says nothing about this path)
        dist_r = sglang_own_distributed(eng, cfg["v2"], tp)
        res["sglang_update_from_distributed"] = dist_r
        step("sglang_update_from_distributed", ms=dist_r["total_ms"], answer=dist_r["answer"][:200])

        # 7. refit again
        t = time.perf_counter()
        doc = rs.update(K)
        ms = (time.perf_counter() - t) * 1e3
        dump(eng, os.path.join(work, "refit-again"))
        res["refit_again"] = {"driver_ms": ms, "outcome": doc,
                              "vs_reference": compare(os.path.join(work, "refit-again"), os.path.join(work, "ref"), tp),
                              "generation_same_as_reference": generate(eng) == res["reference_generation"]}
        step("refit_again", equal=res["refit_again"]["vs_reference"]["equal"])
        rs.close()

        # 8. direct mode: SGLang's own path back to v1, then a direct-mode receiver (a new one) pulls version K
        back = sglang_own_update(eng, cfg["v1"])
        dump(eng, os.path.join(work, "back-to-v1"))
        back["vs_v1"] = compare(os.path.join(work, "back-to-v1"), os.path.join(work, "v1"), tp)
        rd = RefitSglang(eng, registry=reg, job="good", timeout_ms=120000, mode="direct")
        t = time.perf_counter()
        doc = rd.update(K)
        ms = (time.perf_counter() - t) * 1e3
        dump(eng, os.path.join(work, "direct"))
        res["direct"] = {"back_to_v1": back, "driver_ms": ms, "outcome": doc,
                         "vs_reference": compare(os.path.join(work, "direct"), os.path.join(work, "ref"), tp),
                         "generation_same_as_reference": generate(eng) == res["reference_generation"]}
        rd.close()
        step("direct", driver_ms=ms, equal=res["direct"]["vs_reference"]["equal"])

        # 9. in flight: updates under SGLang's in_place pause while requests decode
        if cfg.get("inflight", True):
            res["inflight"] = inflight(eng, cfg, reg, work, res, tp, hc_pub if neg_on and tp > 1 else None)
            step("inflight", **{k: v for k, v in res["inflight"].items() if k.endswith("equal") or k == "pauses_ms"})
        res["ok"] = True
    finally:
        if neg_on and tp > 1:
            hc_pub.close()
        if eng is not None:
            stop(eng)
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        log.close()
        res["kernels"] = kernels(work)
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)
