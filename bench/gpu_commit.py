"""The two-phase commit's copies on a GPU (issue 32: "the GPU path ... measure it where a GPU is lent").

What the `refit` vLLM backend's commit does on CUDA (python/refit/vllm/inflight.py, _copy and Stager.commit): for
every live parameter, one `live.copy_(staged_view)` from the staging arena into the parameter's own storage (same
address), under vLLM's pause.  vLLM itself is not installed on the GPU machine, so this runs the copies alone, on
the live tensors of a real rank: the local tensors of refit's `vllm:tp=4` layout, rank 0, of qwen3-30b-a3b
(bench/data/qwen3-30b-a3b-vllm-tp4-rank0.json: 435 tensors, 15.3 GB; tp=2's 30.5 GB three times over, live, device
arena and flat destination, would not fit an 80 GB H100), each its own CUDA allocation as vLLM's parameters are, and an
arena laid out as the backend lays out its staging (one allocation, every tensor at a 256-byte aligned offset).

Arms, interleaved (each round runs every arm once, the order rotating), every one ending in a synchronize:
  host_commit        the backend's commit from a pinned host arena: one blocking copy_ per tensor (what _copy does)
  host_commit_async  the same copies issued non_blocking on one stream, one synchronize at the end
  host_flat          one copy of the whole pinned arena into one device buffer of its size (the raw H2D copy)
  dev_commit         the commit from a device arena (staging in GPU memory): one copy_ per tensor
  dev_flat           one device-to-device copy of the whole arena
The ratios (commit / flat of the same memory) are taken per round; medians and ranges over rounds.  Bytes are
checked after the last round: every live tensor equals its slice of the arena.

  python bench/gpu_commit.py TENSORS.json [--rounds N] [--out FILE.json]
TENSORS.json: [{"name", "dtype", "shape"}, ...], made with refit's Python binding:
  refit.Layout("vllm:tp=4").manifest(refit.Model("qwen3-30b-a3b"), 0).locals()"""
import argparse
import json
import math
import statistics
import time

import torch

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "u8": torch.uint8, "i32": torch.int32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tensors")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    a = ap.parse_args()
    spec = json.load(open(a.tensors))
    dev = torch.device("cuda", 0)
    offs, off = [], 0
    for t in spec:
        n = math.prod(t["shape"]) * torch.empty((), dtype=DT[t["dtype"]]).element_size()
        offs.append((off, n))
        off = (off + n + 255) // 256 * 256
    total = off
    live = [torch.empty(t["shape"], dtype=DT[t["dtype"]], device=dev) for t in spec]
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    g = torch.Generator().manual_seed(1)
    step = 1 << 28
    for o in range(0, total, step):  # random bytes, filled in pieces (a 30 GB randint would double the memory)
        host[o:o + step] = torch.randint(0, 256, (min(step, total - o),), dtype=torch.uint8, generator=g)
    dev_arena = host.to(dev)
    flat_dst = torch.empty(total, dtype=torch.uint8, device=dev)

    def views(arena):
        return [arena[o:o + n].view(DT[t["dtype"]]).view(t["shape"]) for t, (o, n) in zip(spec, offs)]
    hv, dv = views(host), views(dev_arena)
    nbytes = sum(n for _, n in offs)

    def host_commit():
        for d, s in zip(live, hv):
            d.copy_(s)

    def host_commit_async():
        for d, s in zip(live, hv):
            d.copy_(s, non_blocking=True)

    def host_flat():
        flat_dst.copy_(host, non_blocking=True)

    def dev_commit():
        for d, s in zip(live, dv):
            d.copy_(s)

    def dev_flat():
        flat_dst.copy_(dev_arena)
    arms = {"host_commit": host_commit, "host_commit_async": host_commit_async, "host_flat": host_flat,
            "dev_commit": dev_commit, "dev_flat": dev_flat}
    names = list(arms)
    times = {k: [] for k in names}
    for f in arms.values():  # warm: the first copies map pages, the allocator settles
        f()
    torch.cuda.synchronize()
    for r in range(a.rounds):
        for i in range(len(names)):
            k = names[(i + r) % len(names)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            arms[k]()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) * 1e3)
    host_commit()
    torch.cuda.synchronize()
    ok = all(torch.equal(d.view(-1).view(torch.uint8), s.view(-1).view(torch.uint8)) for d, s in zip(live, dv))

    def st(v):
        return {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
    ratios = {
        "host_commit/host_flat": [x / y for x, y in zip(times["host_commit"], times["host_flat"])],
        "host_commit_async/host_flat": [x / y for x, y in zip(times["host_commit_async"], times["host_flat"])],
        "dev_commit/dev_flat": [x / y for x, y in zip(times["dev_commit"], times["dev_flat"])],
        "dev_commit/host_flat": [x / y for x, y in zip(times["dev_commit"], times["host_flat"])]}
    res = {"what": "the two-phase commit's copies alone on one GPU (bench/gpu_commit.py)", "device":
           torch.cuda.get_device_name(0), "torch": torch.__version__, "tensors": len(spec), "bytes": nbytes,
           "rounds": a.rounds, "verified": ok, "ms": {k: st(v) for k, v in times.items()},
           "gbps": {k: round(nbytes / statistics.median(v) / 1e6, 2) for k, v in times.items()},
           "ratios": {k: st(v) for k, v in ratios.items()}, "runs_ms": times}
    print(json.dumps({k: v for k, v in res.items() if k != "runs_ms"}, indent=1))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
