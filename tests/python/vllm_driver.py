"""Drives the real vLLM (0.32, CPU) through refit's `refit` weight-transfer backend; tests/python/test_vllm.py runs
it once per (model, tp) and asserts on the JSON it writes.

    python vllm_driver.py CONFIG.json OUT.json

CONFIG: {"v1": dir, "v2": dir, "bad": dir (a checkpoint with one wrong shape; with "negative": false, step 4 is
         skipped and "bad" unused), "tp": n, "ep": bool,
         "src_layout": "megatron:tp=2,ep=2", "refit": path of the refit binary, "work": scratch dir,
         "trainer": "fsdp" (optional: the "good" publishers are real FSDP2 ranks, tests/python/fsdp_publisher.py,
         src_layout dtensor:dp_shard=F[,tp=T][,ep=E]: with tp or ep, transformers' own TP / EP / FSDP2),
         "versions": K, "generate": bool (default true; false skips every generation: vLLM 0.32 on the CPU cannot
         run an MoE forward pass with expert parallel, see the end of main),
         issue 35 (optional): "llm_extra": more LLM(...) arguments (a speculative_config), "dump_draft": also dump
         the draft model (reference, v1, refit), "draft_update": every update is followed by one of the draft
         model (start_draft_weight_update, same version), "draft_negative": a layout whose publishers hold no MTP
         layer (job "no-mtp"): a draft update from them must fail and leave the draft at v1 (step 4b),
         "draft_model": {"v1": dir, "v2": dir, "n": tokens, "src_layout": layout}: speculative decoding with a draft
         model of its own (method "draft_model", each engine with the draft of its version), served by publishers
         of group "draft" (init_info draft_group),
         "mla_facts": record whether MLA's W_UK_T / W_UV share kv_b_proj's storage, "mla_unalias": then give them
         storage of their own (w_mla_unalias), "mla_unalias_draft": the same in the draft model}

What it does, in order (each vLLM is LLM(..., skip_tokenizer_init=True, enforce_eager=True)):
  1. reference: vLLM started on v2; every worker dumps its live state (below) and greedy generation is recorded;
     the engine is shut down;
  2. trainer stand-ins: `refit publish --from-safetensors v2 --layout src_layout --rank R` for every rank R
     (job "good", K versions of the same bytes, each acknowledged by every worker), the same for the bad
     checkpoint (job "bad-shape"), and a publisher in this process whose manifest names one tensor wrongly
     (job "bad-name");
  3. vLLM started on v1 with weight_transfer_config={"backend": "refit"}; its state and generation recorded;
  4. negative: init_weight_transfer_engine on "bad-shape", then on "bad-name"; start + update_weights must fail
     with a clear error, and the state and generation must still be v1's, byte for byte (with tp > 1 the next
     collective_rpc is recorded first: vLLM 0.32 answers it with a stale reply, see realign_worker_replies);
  5. init on "good"; start / update_weights({"version": 1}) / finish; the state of every worker is compared with
     the reference byte for byte and generation must be identical (tokens and logprobs); versions 2.. K-1 repeat
     the update (the plan cached);
  6. vLLM's own path for the same bytes, inside each worker: the v2 checkpoint read into memory (not timed), then
     initialize_layerwise_reload + model.load_weights + finalize_layerwise_reload (what vLLM's nccl and ipc
     backends run), timed; its state is compared with the reference too;
  7. refit once more (version K): the state must equal the reference again.

A worker's live state is every named parameter and buffer, plus, for every layer vLLM serves through a packed CPU
matmul handle (on the CPU linear weights are moved into oneDNN / sgl-kernel handles and their parameters emptied),
the handle's output on an identity matrix: the weight it really multiplies by, transposed (exact: x*1 + 0s).
"""
import gc
import json
import os
import subprocess
import sys
import time

PROMPTS = [[1, 5, 9, 33, 70], [200, 3, 17], [42, 42, 7, 7, 100, 11], [249]]


def _set_env(tp: int):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if tp == 2:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")


# ---------------------------------------------------------------- worker side (sent by value through collective_rpc)


def _tensors_of(m):
    """Clones of a module's parameters and buffers, keyed "param:NAME" and "buffer:NAME" (call under no_grad)."""
    state = {}
    for n, p in m.named_parameters():
        state["param:" + n] = p.detach().clone()
    for n, b in m.named_buffers():
        state["buffer:" + n] = b.detach().clone()
    return state


def _save_rank(self, directory, state):
    import torch
    os.makedirs(directory, exist_ok=True)
    torch.save(state, os.path.join(directory, f"rank-{self.rank}.pt"))
    return {"rank": self.rank, "tensors": len(state)}


def _live_state(m):
    """Every parameter and buffer of module m, and the effective weight of every packed CPU matmul in it."""
    import torch
    with torch.no_grad():
        state = _tensors_of(m)
        for n, mod in m.named_modules():
            f = getattr(mod, "cpu_linear", None)
            if f is None:
                continue
            k = getattr(mod, "input_size_per_partition", None) or getattr(mod, "input_size", None) or \
                getattr(mod, "embedding_dim")
            state["matmul:" + n] = f(torch.eye(k, dtype=torch.bfloat16), getattr(mod, "weight", None), None).clone()
    return state


def w_dump(self, directory):
    """Every parameter and buffer of the live model, and the effective weight of every packed CPU matmul."""
    return _save_rank(self, directory, _live_state(self.model_runner.get_model()))


def w_dump_draft(self, directory):
    """The speculative draft model's live state, as w_dump's (issue 35: its own target, start_draft_weight_update)."""
    return _save_rank(self, directory, _live_state(self.model_runner.get_draft_model()))


def w_draft_engine(self):
    """The draft target's init report and the refit module the worker imported (issue 35)."""
    import refit
    e = self.weight_transfer_engine
    return {"rank": self.rank, "init": e.draft_init_report, "versions": e.versions(), "refit": refit.__file__}


def w_mla_facts(self):
    """Issue 35: for every MLA attention layer, whether vLLM's derived W_UK_T / W_UV share kv_b_proj's storage
    (on the CPU with the activation dtype equal to the weight's, vLLM's split returns views)."""
    m = self.model_runner.get_model()
    out = {}
    for n, mod in m.named_modules():
        if type(mod).__name__ != "MLAAttention":
            continue
        kv = mod.kv_b_proj.weight.untyped_storage().data_ptr()
        out[n] = {a: getattr(mod, a).untyped_storage().data_ptr() == kv for a in ("W_UK_T", "W_UV")}
    return out


def w_mla_unalias(self, draft=False):
    """Issue 35: gives every MLA layer's W_UK_T / W_UV storage of their own (same values, same Parameter objects),
    as vLLM's split makes when the activation dtype differs from the weight's: from then on only a re-run of
    vLLM's derivation can bring them to a new kv_b_proj.  draft: in the speculative draft model."""
    m = self.model_runner.get_draft_model() if draft else self.model_runner.get_model()
    n = 0
    for _, mod in m.named_modules():
        if type(mod).__name__ == "MLAAttention":
            for a in ("W_UK_T", "W_UV"):
                p = getattr(mod, a)
                p.data = p.data.clone()
                n += 1
    return n


def w_rank(self, tag):
    return [self.rank, tag]


def w_engine(self):
    e = self.weight_transfer_engine
    return {"rank": self.rank, "init": getattr(e, "init_report", None), "last": e.report, "sessions": e.reports}


def w_load_weights(self, ckpt):
    """vLLM's own update path for the same bytes: layerwise reload around model.load_weights (what its nccl / ipc
    weight-transfer backends run), from tensors already in memory."""
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    weights = load_file(os.path.join(ckpt, "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    m = self.model_runner.get_model()
    with set_current_vllm_config(self.vllm_config), torch.no_grad():
        t0 = time.perf_counter()
        initialize_layerwise_reload(m)
        t1 = time.perf_counter()
        m.load_weights(iter(weights.items()))
        t2 = time.perf_counter()
        finalize_layerwise_reload(m, self.vllm_config.model_config)
        t3 = time.perf_counter()
    return {"rank": self.rank, "checkpoint_bytes": nbytes, "initialize_ms": (t1 - t0) * 1e3,
            "load_weights_ms": (t2 - t1) * 1e3, "finalize_ms": (t3 - t2) * 1e3, "total_ms": (t3 - t0) * 1e3}


# ---------------------------------------------------------------- driver side


def compare(a_dir: str, b_dir: str, ranks: int) -> dict:
    """Tensor by tensor, byte for byte (bit patterns, so -0.0 and NaN payloads count)."""
    import torch
    out = {"equal": True, "tensors": 0, "bytes": 0, "mismatches": []}
    for r in range(ranks):
        a = torch.load(os.path.join(a_dir, f"rank-{r}.pt"))
        b = torch.load(os.path.join(b_dir, f"rank-{r}.pt"))
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out["mismatches"].append(f"rank {r} {k}: only in {'the first' if k in a else 'the second'}")
                continue
            x, y = a[k], b[k]
            out["tensors"] += 1
            out["bytes"] += x.numel() * x.element_size()
            if x.dtype != y.dtype or x.shape != y.shape:
                out["mismatches"].append(f"rank {r} {k}: {x.dtype} {list(x.shape)} vs {y.dtype} {list(y.shape)}")
                continue
            xb, yb = x.reshape(-1).contiguous().view(torch.uint8), y.reshape(-1).contiguous().view(torch.uint8)
            if not torch.equal(xb, yb):
                diff = (xb != yb).nonzero()
                out["mismatches"].append(f"rank {r} {k}: {int((xb != yb).sum())} of {xb.numel()} bytes differ, "
                                         f"first at byte {diff[0].tolist()}")
    out["equal"] = not out["mismatches"]
    out["mismatches"] = out["mismatches"][:40]
    return out


def generate(llm, enabled=True):
    if not enabled:
        return None
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], sp, use_tqdm=False)
    res = []
    for o in outs:
        c = o.outputs[0]
        res.append({"tokens": list(c.token_ids), "logprobs": [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)]})
    return res


def start_llm(path: str, cfg: dict, refit: bool, ver: str = "v2"):
    from vllm import LLM
    kw = dict(model=path, tensor_parallel_size=cfg["tp"], skip_tokenizer_init=True, enforce_eager=True,
              dtype="bfloat16", max_model_len=128, max_num_seqs=4, seed=0)
    if cfg.get("ep"):
        kw["enable_expert_parallel"] = True
    kw.update(cfg.get("llm_extra") or {})  # e.g. a speculative_config (issue 35's MTP run)
    dm = cfg.get("draft_model")
    if dm:  # issue 35: speculative decoding with a draft model of its own, of the engine's version
        kw["speculative_config"] = {"method": "draft_model", "model": dm[ver], "num_speculative_tokens": dm["n"]}
    if refit:
        kw["weight_transfer_config"] = {"backend": "refit"}
    t = time.perf_counter()
    llm = LLM(**kw)
    return llm, time.perf_counter() - t


def stop_llm(llm):
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


def publishers(cfg, ckpt, job, versions, acks, reg, log, group=None):
    import refit
    world = refit.Layout(cfg["src_layout"]).world
    procs = []
    if cfg.get("trainer") == "fsdp" and job == "good":  # real fully_shard ranks (tests/python/fsdp_publisher.py)
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for r in range(world):
            a = {"rank": r, "world": world, "port": port, "model": ckpt, "registry": reg, "job": job,
                 "versions": versions, "acks": acks, "hold_ms": 600000, "layout": cfg["src_layout"]}
            procs.append(subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "fsdp_publisher.py"), json.dumps(a)],
                                          stdout=log, stderr=log))
        return procs
    for r in range(world):
        cmd = [cfg["refit"], "publish", "--from-safetensors", ckpt, "--layout", cfg["src_layout"], "--rank", str(r),
               "--registry", reg, "--job", job, "--versions", str(versions), "--timeout-ms", "600000",
               *(["--group", group] if group else []),
               "--hold-ms", "600000"]
        if acks:
            cmd += ["--acks", str(acks)]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
    return procs


def wrong_name_publisher(ckpt, reg, job):
    """One rank (hf-like, in this process) holding the whole checkpoint, with one canonical tensor misnamed."""
    import numpy as np
    import refit
    model = refit.Model(ckpt)
    tensors = model.tensors()
    wrong = next(t.name for t in tensors if t.name.endswith("layers.1.post_attention_layernorm.weight"))
    renamed = wrong.replace("post_attention_layernorm", "post_attention_norm")
    m = refit.Manifest.build(model.name, "hf-misnamed", 0, 1)
    offs, off = {}, 0
    for t in tensors:
        offs[t.name] = off
        off += -(-t.nbytes // 256) * 256
    m.add_region(off)
    arena = np.zeros(off, dtype=np.uint8)
    with refit.SafetensorsFile(os.path.join(ckpt, "model.safetensors")) as f:
        for t in tensors:
            a = f.numpy(t.name)
            arena[offs[t.name]:offs[t.name] + t.nbytes] = a.reshape(-1).view(np.uint8)
    for t in tensors:
        n = renamed if t.name == wrong else t.name
        m.add_canonical(n, t.dtype, t.shape)
        m.add_local(n, t.dtype, t.shape, 0, offs[t.name])
        m.add_placement(n, n, (0,) * len(t.shape), t.shape, (0,) * len(t.shape))
    m.finalize()
    pub = refit.Publisher(m, registry=reg, job=job)
    pub.attach(0, arena)
    pub.publish(1)
    return pub, arena, wrong


def _vllm_shm():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("vllm_dist_") and "cpushm" in n}
    except OSError:
        return set()


def _shm_in_use():
    """The /dev/shm names some live process maps or holds open: a segment of another test's engine (ctest -j runs
    vllm_engine beside vllm_mla, both through this driver) is in use while that engine runs, and must stay."""
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        used.add(line[i + len("/dev/shm/"):].strip().split(" ")[0])
            for fd in os.listdir(f"/proc/{pid}/fd"):
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
                if t.startswith("/dev/shm/"):
                    used.add(t[len("/dev/shm/"):].split(" ")[0])
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return used


def update(llm, version, draft=False):
    """One update of the target; with draft, then one of the speculative draft model, same version."""
    t = time.perf_counter()
    llm.start_weight_update()
    llm.update_weights({"update_info": {"version": version}})
    llm.finish_weight_update()
    if draft:
        llm.start_draft_weight_update()
        llm.update_weights({"update_info": {"version": version}})
        llm.finish_weight_update()
    return (time.perf_counter() - t) * 1e3


def main(cfg_path, out_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    tp = cfg["tp"]
    _set_env(tp)
    work = cfg["work"]
    os.makedirs(work, exist_ok=True)
    reg = "file:" + os.path.join(work, "registry")
    os.makedirs(reg[5:], exist_ok=True)
    K = int(cfg.get("versions", 4))
    gen = bool(cfg.get("generate", True))
    import platform

    import torch
    import vllm
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    res = {"config": cfg, "steps": [], "env": {"vllm": vllm.__version__, "torch": torch.__version__,
                                               "python": platform.python_version(), "cpu": cpu,
                                               "cpus": os.cpu_count()}}
    log = open(os.path.join(work, "publishers.log"), "w")
    procs = []
    shm_before = _vllm_shm()

    def step(name, **kw):
        res["steps"].append(dict(step=name, **kw))
        print(f"vllm_driver: {name} {json.dumps(kw)[:400]}", flush=True)

    try:
        # 1. reference
        ref, secs = start_llm(cfg["v2"], cfg, refit=False, ver="v2")
        ref.collective_rpc(w_dump, args=(os.path.join(work, "ref"),))
        if cfg.get("dump_draft"):
            ref.collective_rpc(w_dump_draft, args=(os.path.join(work, "ref-draft"),))
        res["reference_generation"] = generate(ref, gen)
        step("reference", start_s=secs)
        stop_llm(ref)
        del ref

        # 2. publishers
        # Every receiver acknowledges each version; a draft target is a receiver of its own on every worker, of
        # the same group for an MTP draft, of the draft's publishers' group "draft" for a draft model.
        dm = cfg.get("draft_model")
        mtp_draft = cfg.get("draft_update") and not dm
        procs += publishers(cfg, cfg["v2"], "good", K, tp * (2 if mtp_draft else 1), reg, log)
        if dm:
            procs += publishers(dict(cfg, src_layout=dm["src_layout"]), dm["v2"], "good", K, tp, reg, log,
                                group="draft")
        neg_on = cfg.get("negative", True)
        if neg_on:
            procs += publishers(cfg, cfg["bad"], "bad-shape", 1, 0, reg, log)
            wn_pub, _wn_arena, wn_tensor = wrong_name_publisher(cfg["v2"], reg, "bad-name")

        # 3. vLLM on v1 with the refit backend
        llm, secs = start_llm(cfg["v1"], cfg, refit=True, ver="v1")
        llm.collective_rpc(w_dump, args=(os.path.join(work, "v1"),))
        if cfg.get("dump_draft"):
            llm.collective_rpc(w_dump_draft, args=(os.path.join(work, "v1-draft"),))
        res["v1_generation"] = generate(llm, gen)
        res["v1_vs_reference"] = compare(os.path.join(work, "v1"), os.path.join(work, "ref"), tp)
        if cfg.get("mla_facts"):
            res["mla_facts"] = llm.collective_rpc(w_mla_facts)
            if cfg.get("mla_unalias"):
                res["mla_unaliased"] = llm.collective_rpc(w_mla_unalias)
                res["mla_facts_unaliased"] = llm.collective_rpc(w_mla_facts)
        if cfg.get("mla_unalias_draft"):
            res["mla_unaliased_draft"] = llm.collective_rpc(w_mla_unalias, args=(True,))
        step("v1", start_s=secs)

        # 4. negative
        res["negative"] = []
        for job in ("bad-shape", "bad-name") if neg_on else ():
            llm.collective_rpc("init_weight_transfer_engine",
                               args=({"registry": reg, "job": job, "timeout_ms": 20000},))
            err = None
            try:
                llm.start_weight_update()
                llm.update_weights({"update_info": {"version": 1}})
                llm.finish_weight_update()
            except Exception as e:  # the worker's error, re-raised by collective_rpc
                err = f"{type(e).__name__}: {e}"
            if tp > 1:
                # vLLM 0.32's multiprocess executor stops reading replies at the first worker's error: the other
                # workers' replies to update_weights stay queued and answer the next collective_rpc.
                if job == "bad-shape":
                    try:
                        res["rpc_after_failure"] = {"replies": llm.collective_rpc(w_rank, args=("probe",))}
                    except Exception as e:
                        res["rpc_after_failure"] = {"raised": f"{type(e).__name__}: {e}"[:600]}
                from refit.vllm import realign_worker_replies
                res.setdefault("realigned", []).append(realign_worker_replies(llm))
                res.setdefault("rpc_after_realign", []).append(llm.collective_rpc(w_rank, args=(job,)))
            llm.collective_rpc(w_dump, args=(os.path.join(work, "after-" + job),))
            neg = {"job": job, "error": err, "state_vs_v1": compare(os.path.join(work, "after-" + job),
                                                                    os.path.join(work, "v1"), tp),
                   "generation_same_as_v1": generate(llm, gen) == res["v1_generation"]}
            res["negative"].append(neg)
            step("negative", job=job, error=(err or "")[:300], intact=neg["state_vs_v1"]["equal"])
        if neg_on:
            res["wrong_name_tensor"] = wn_tensor
            wn_pub.close()

        # 4b. (issue 35) a draft update from publishers without the MTP layer: refused, the draft keeps v1
        if cfg.get("draft_negative"):
            nm = publishers(dict(cfg, src_layout=cfg["draft_negative"]), cfg["v2"], "no-mtp", 1, 0, reg, log)
            procs += nm
            llm.collective_rpc("init_weight_transfer_engine",
                               args=({"registry": reg, "job": "no-mtp", "timeout_ms": 20000},))
            err = None
            try:
                llm.start_draft_weight_update()
                llm.update_weights({"update_info": {"version": 1}})
                llm.finish_weight_update()
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
            llm.collective_rpc(w_dump_draft, args=(os.path.join(work, "after-no-mtp-draft"),))
            res["draft_negative"] = {"error": err, "draft_vs_v1": compare(os.path.join(work, "after-no-mtp-draft"),
                                                                         os.path.join(work, "v1-draft"), tp)}
            step("draft_negative", error=(err or "")[:300], intact=res["draft_negative"]["draft_vs_v1"]["equal"])

        # 5. the refit
        init = {"registry": reg, "job": "good"}
        if dm:
            init["draft_group"] = "draft"
        llm.collective_rpc("init_weight_transfer_engine", args=(init,))
        res["updates"] = []
        draft = bool(cfg.get("draft_update"))
        for v in range(1, K):
            ms = update(llm, v, draft)
            rep = llm.collective_rpc(w_engine)
            if draft:
                res.setdefault("draft_engine", []).append(llm.collective_rpc(w_draft_engine))
            res["updates"].append({"version": v, "driver_ms": ms, "workers": rep})
            if v == 1:
                llm.collective_rpc(w_dump, args=(os.path.join(work, "refit"),))
                if cfg.get("dump_draft"):
                    llm.collective_rpc(w_dump_draft, args=(os.path.join(work, "refit-draft"),))
                    res["v1_draft_vs_reference"] = compare(os.path.join(work, "v1-draft"),
                                                           os.path.join(work, "ref-draft"), tp)
                    res["refit_draft_vs_reference"] = compare(os.path.join(work, "refit-draft"),
                                                              os.path.join(work, "ref-draft"), tp)
                res["refit_vs_reference"] = compare(os.path.join(work, "refit"), os.path.join(work, "ref"), tp)
                res["refit_generation"] = generate(llm, gen)
                step("refit", version=v, driver_ms=ms, equal=res["refit_vs_reference"]["equal"])

        # 6. vLLM's own path, same bytes
        lw = llm.collective_rpc(w_load_weights, args=(cfg["v2"],))
        llm.collective_rpc(w_dump, args=(os.path.join(work, "load_weights"),))
        res["load_weights"] = {"workers": lw,
                               "vs_reference": compare(os.path.join(work, "load_weights"), os.path.join(work, "ref"),
                                                       tp)}
        res["load_weights"]["generation_same_as_reference"] = generate(llm, gen) == res["reference_generation"]
        step("load_weights", equal=res["load_weights"]["vs_reference"]["equal"],
             ms=[w["total_ms"] for w in lw])

        # 7. refit again after vLLM's own path
        ms = update(llm, K, draft)
        llm.collective_rpc(w_dump, args=(os.path.join(work, "refit-again"),))
        res["refit_again"] = {"driver_ms": ms, "workers": llm.collective_rpc(w_engine),
                              "vs_reference": compare(os.path.join(work, "refit-again"), os.path.join(work, "ref"), tp),
                              "generation_same_as_reference": generate(llm, gen) == res["reference_generation"]}
        step("refit_again", equal=res["refit_again"]["vs_reference"]["equal"])
        llm.collective_rpc("shutdown_weight_transfer_engine")
        if not gen:
            # With expert parallel, vLLM 0.32's CPU MoE kernel (cpu_fused_moe) dies on a segmentation fault at
            # the first forward pass, with or without refit: record what happens.
            try:
                generate(llm)
                res["generation_without_refit_check"] = "ran"
            except BaseException as e:  # the engine reports its dead workers
                res["generation_without_refit_check"] = f"failed: {type(e).__name__}: {e}"[:400]
            res["ok"] = True
            return
        stop_llm(llm)
        res["ok"] = True
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        log.close()
        # vLLM 0.32's CPU shared-memory communicator (tp > 1) does not always unlink its segments at shutdown:
        # remove the ones left since this run started that no live process uses (an engine of a test running
        # beside this one creates its own while this one ends: unlinking those failed its start, "open shm in
        # SHMManager failed. errno: 2").
        res["shm_segments_left_by_vllm"] = sorted(_vllm_shm() - shm_before - _shm_in_use())
        for name in res["shm_segments_left_by_vllm"]:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # an engine whose workers died (the expert-parallel case) may not shut down cleanly
