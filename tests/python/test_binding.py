"""Tests of the Python binding (python/refit) with real packages: numpy, torch, safetensors, transformers.

Run by ctest (test `python_binding`) in the venv of scripts/bridge-venv.sh, with REFIT_LIBRARY pointing at the
build's librefit.so and REFIT_BIN at its refit command."""
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import refit  # noqa: E402

REFIT_BIN = os.environ.get("REFIT_BIN", os.path.join(HERE, "..", "..", "build", "refit"))


# ---------------------------------------------------------------- models, layouts, manifests, plans


def test_model_and_layout():
    m = refit.Model("tiny-moe")
    assert m.name == "tiny-moe" and "tiny-moe" in refit.Model.builtins()
    ts = m.tensors()
    assert ts[0].name == "model.embed_tokens.weight" and sum(t.nbytes for t in ts) == m.total_bytes
    lay = refit.Layout("megatron:tp=2,ep=2,etp=1")
    assert str(lay).startswith("megatron:tp=2,pp=1,ep=2,etp=1") and lay.world == 2
    man = lay.manifest(m, 1)
    assert man.identity == {"model": "tiny-moe", "layout": str(lay), "rank": 1, "world": 2}
    assert len(man.regions()) == 1 and man.signature != 0
    assert refit.Manifest.decode(man.encode()).signature == man.signature


def test_errors_carry_name_and_detail():
    with pytest.raises(refit.RefitError) as e:
        refit.Layout("vllm:tp=3").manifest(refit.Model("tiny-moe"), 0)
    assert e.value.name == "REFIT_ERR_GEOMETRY" and "tp=3" in e.value.detail
    with pytest.raises(refit.RefitError) as e:
        refit.Model("no-such-model")
    assert e.value.name in ("REFIT_ERR_NOT_FOUND", "REFIT_ERR_IO")
    with pytest.raises(refit.RefitError) as e:
        refit.Layout("frobnicate:tp=1")
    assert e.value.name == "REFIT_ERR_NOT_FOUND"


def test_error_classes_follow_the_status_families():
    import pickle
    # every status the library names maps to its family (include/refit/status.h groups them)
    for status in range(-1, -60, -1):
        name = refit._clib.refit_status_name(status).decode()
        if name == "REFIT_UNKNOWN":
            continue
        cls = refit.error_class(status)
        family = (refit.InputError if status >= -19 else refit.DataError if status >= -39 else refit.EnvError)
        assert issubclass(cls, family) and issubclass(cls, refit.RefitError), (status, name, cls)
    assert refit.error_class(-25) is refit.ReplayError and refit.error_class(-23) is refit.VerifyError
    assert refit.error_class(-42) is refit.RefitTimeout and refit.error_class(-48) is refit.AuthError
    # a failing C call raises its family's class; the input family is a ValueError
    with pytest.raises(ValueError) as e:
        refit.Layout("vllm:tp=3").manifest(refit.Model("tiny-moe"), 0)
    assert type(e.value) is refit.InputError and e.value.name == "REFIT_ERR_GEOMETRY"
    # a wrong argument caught by the binding itself: ValueError, or TypeError for a wrong type
    with pytest.raises(ValueError, match="C-contiguous"):
        refit.core._addr(np.zeros((4, 4), np.uint8)[:, 1])
    with pytest.raises(ValueError, match="unknown dtype"):
        refit.core.dtype_code("no-such-dtype")
    with pytest.raises(TypeError, match="cannot take memory from"):
        refit.core._addr(object())
    m = refit.Model("tiny-moe")
    dst = refit.Layout("vllm:tp=2").manifest(m, 0)
    out = [np.zeros(dst.regions()[0], np.uint8)]
    with pytest.raises(refit.VerifyError) as e:
        dst.truth_verify(out, 6)
    assert isinstance(e.value, refit.DataError) and not isinstance(e.value, ValueError)
    back = pickle.loads(pickle.dumps(e.value))  # crosses a Ray actor boundary intact
    assert type(back) is refit.VerifyError and back.status == -23 and back.detail == e.value.detail


def test_plan_stats_and_execute_numpy():
    m = refit.Model("tiny-moe")
    src_l = refit.Layout("megatron:tp=2,ep=2,etp=1")
    srcs = [src_l.manifest(m, r) for r in range(src_l.world)]
    dst = refit.Layout("vllm:tp=2").manifest(m, 0)
    plan = refit.Plan(srcs, dst)
    st = plan.stats()
    assert st.bytes_redundant == 0 and st.bytes_read == st.bytes_written > 0 and sum(st.source_bytes) == st.bytes_read
    mem = [[np.zeros(s.regions()[0], np.uint8)] for s in srcs]
    for s, mm in zip(srcs, mem):
        s.truth_fill(mm, 5)
    out = [np.zeros(dst.regions()[0], np.uint8)]
    plan.execute(mem, out)
    assert dst.truth_verify(out, 5)["bytes_checked"] > 0
    with pytest.raises(refit.RefitError) as e:
        dst.truth_verify(out, 6)
    assert e.value.name == "REFIT_ERR_VERIFY"
    with pytest.raises(refit.RefitError) as e:
        refit.Plan([srcs[0]], dst)  # rank 1 missing: experts uncovered
    assert e.value.name in ("REFIT_ERR_UNCOVERED", "REFIT_ERR_MISSING_SOURCE")


def test_custom_manifest_from_placements():
    m = refit.Model("tiny-dense")
    emb = m.tensors()[0]
    rows, h = emb.shape
    man = refit.Manifest.build("tiny-dense", "my-framework", 0, 1)
    man.add_region(rows * h * 2)
    man.add_canonical(emb.name, emb.dtype, emb.shape)
    man.add_local("emb_top", emb.dtype, (rows // 2, h), 0, 0)
    man.add_local("emb_bottom", emb.dtype, (rows // 2, h), 0, rows // 2 * h * 2)
    man.add_placement(emb.name, "emb_top", (0, 0), (rows // 2, h), (0, 0))
    man.add_placement(emb.name, "emb_bottom", (rows // 2, 0), (rows // 2, h), (0, 0))
    man.finalize()
    assert [p.local for p in man.placements()] == ["emb_top", "emb_bottom"]
    # the same bytes planned from a megatron source
    src_l = refit.Layout("megatron:tp=2")
    srcs = [src_l.manifest(m, r) for r in range(2)]
    mem = [[np.zeros(s.regions()[0], np.uint8)] for s in srcs]
    for s, mm in zip(srcs, mem):
        s.truth_fill(mm, 2)
    out = [np.zeros(man.regions()[0], np.uint8)]
    refit.Plan(srcs, man).execute(mem, out)
    man.truth_verify(out, 2)
    bad = refit.Manifest.build("tiny-dense", "x", 0, 1)
    bad.add_region(16)
    bad.add_canonical(emb.name, emb.dtype, emb.shape)
    bad.add_local("l", emb.dtype, (4, h), 0, 0)
    with pytest.raises(refit.RefitError) as e:
        bad.finalize()
    assert e.value.name == "REFIT_ERR_OUT_OF_BOUNDS"


# ---------------------------------------------------------------- safetensors


def test_safetensors_reader_matches_the_safetensors_package(tmp_path):
    from safetensors.torch import save_file
    ts = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.int64),
          "c": torch.randn(2, 2, 2, 2)}
    save_file(ts, str(tmp_path / "x.safetensors"))
    with refit.SafetensorsFile(tmp_path / "x.safetensors") as f:
        info = f.tensors()
        assert {n: (t.dtype, t.shape) for n, (t, _, _) in info.items()} == {
            "a": ("bf16", (3, 5)), "b": ("i64", (7,)), "c": ("f32", (2, 2, 2, 2))}
        assert np.array_equal(f.numpy("a"), ts["a"].view(torch.int16).numpy().view(np.uint16))
        assert np.array_equal(f.numpy("b"), ts["b"].numpy())


def _st(header, data=b"", hlen=None):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


@pytest.mark.parametrize("blob,name,needle", [
    (b"\x01\x02", "REFIT_ERR_CORRUPT", "shorter than"),
    (struct.pack("<Q", 1 << 40) + b"{}", "REFIT_ERR_CORRUPT", "limit"),
    (_st({}, hlen=999), "REFIT_ERR_CORRUPT", "exceeds the file"),
    (struct.pack("<Q", 4) + b"{,}x", "REFIT_ERR_PARSE", "line 1"),
    (_st({"a": {"dtype": "U8", "shape": [9], "data_offsets": [0, 9]}}, b"x" * 4), "REFIT_ERR_CORRUPT", "past the end"),
    (_st({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
          "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"x" * 6), "REFIT_ERR_OVERLAP", "share"),
    (_st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"x" * 8), "REFIT_ERR_MISMATCH", "need"),
    (_st({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"x" * 8), "REFIT_ERR_UNSUPPORTED", "C64"),
])
def test_safetensors_hostile(blob, name, needle):
    with pytest.raises(refit.RefitError) as e:
        refit.SafetensorsFile.parse(blob)
    assert e.value.name == name and needle in e.value.detail, e.value


def test_hf_source_sharded_and_cli(tmp_path):
    """refit plan --dump writes an hf checkpoint; resharded with the safetensors package into an index + shards,
    read back as an hf source, planned into vllm and verified against the synthetic truth."""
    from safetensors.torch import load_file, save_file
    subprocess.run([REFIT_BIN, "plan", "--model", "tiny-moe", "--src", "megatron:tp=2", "--dst", "hf", "--execute",
                    "--version", "4", "--dump", str(tmp_path / "d")], check=True, capture_output=True)
    sd = load_file(str(tmp_path / "d" / "rank-0" / "model.safetensors"))
    ck = tmp_path / "ck"
    ck.mkdir()
    names, wm = list(sd), {}
    for s in range(3):
        part = names[s::3]
        save_file({n: sd[n] for n in part}, str(ck / f"s{s}.safetensors"))
        wm.update({n: f"s{s}.safetensors" for n in part})
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    m = refit.Model("tiny-moe")
    with refit.HfSource(ck, m) as hf:
        assert len(hf.regions) == 3 and hf.manifest.identity["layout"] == "hf"
        dst = refit.Layout("vllm:tp=2").manifest(m, 1)
        out = [np.zeros(dst.regions()[0], np.uint8)]
        refit.Plan([hf.manifest], dst).execute([hf.regions], out)
        dst.truth_verify(out, 4)
    # a missing tensor and a mis-shaped one
    del wm[names[1]]
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(refit.RefitError) as e:
        refit.HfSource(ck, m)
    assert e.value.name == "REFIT_ERR_NOT_FOUND" and "missing" in e.value.detail
    with pytest.raises(refit.RefitError) as e:
        refit.HfSource(ck, refit.Model("tiny-dense"))
    assert e.value.name in ("REFIT_ERR_MISMATCH", "REFIT_ERR_NOT_FOUND")


# ---------------------------------------------------------------- publishers and receivers across processes

_PUB = textwrap.dedent("""
    import sys, numpy as np, torch
    sys.path.insert(0, sys.argv[1])
    import refit
    m = refit.Model("tiny-moe")
    lay = refit.Layout("megatron:tp=2,ep=2,etp=1")
    rank, kind, reg = int(sys.argv[2]), sys.argv[3], sys.argv[4]
    man = lay.manifest(m, rank)
    frac = 0.02 if kind == "delta" else 1.0
    with refit.Publisher(man, registry=reg, job="bind", transports="shm", delta=kind == "delta") as p:
        if kind in ("alloc", "delta"):
            mem = p.alloc(0)                       # library memory as a torch uint8 tensor
        elif kind == "torch":
            mem = torch.zeros(man.regions()[0], dtype=torch.uint8); p.attach(0, mem)
        else:
            mem = np.zeros(man.regions()[0], np.uint8); p.attach(0, mem)
        for v in (1, 2):
            man.truth_fill([mem], v, frac)
            p.publish(v)
            p.wait_acks(v, 1, 60000)
            p.wait_readers(v, 60000)
    print("ok")
""")


@pytest.mark.parametrize("kind", ["alloc", "torch", "numpy", "delta"])
def test_publish_pull_across_processes(tmp_path, kind):
    reg = f"file:{tmp_path}/reg"
    pubs = [subprocess.Popen([sys.executable, "-c", _PUB, os.path.join(HERE, "..", "..", "python"), str(r), kind,
                              reg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    m = refit.Model("tiny-moe")
    man = refit.Layout("vllm:tp=2").manifest(m, 0)
    try:
        frac = 0.02 if kind == "delta" else 0.0
        with refit.Receiver(man, registry=reg, job="bind", verify=True, truth_fraction=frac) as r:
            mem = torch.zeros(man.regions()[0], dtype=torch.uint8)
            r.attach(0, mem)
            if kind == "alloc":  # prepared: the first pull plans nothing and reads no manifest
                assert r.prepare(timeout_ms=60000) > 0
            rep = r.pull(1, timeout_ms=60000)
            assert rep.version == 1 and rep.sources == 2 and rep.transport == "shm"
            # Manifests fetched: both ranks' (none after prepare); rank 0's a second time when its record did not
            # exist yet at the first read (the publishers start with this pull), as only a manifest read after its
            # incarnation's record may be kept (a restart keeps the signature, not the transport descriptors).
            assert rep.planned == (kind != "alloc")
            assert rep.manifests_read == 0 if kind == "alloc" else rep.manifests_read in (2, 3), rep.manifests_read
            assert rep.delta_base == 0
            assert rep.path == "host_direct", rep.path  # host memory, the trainer ranks alone over shm: direct
            hs = r.holders()  # host memory: the host path, trainer ranks as holders
            assert hs and all(h.name.startswith("trainer:") and not h.failed for h in hs), hs
            assert sum(h.bytes for h in hs) >= rep.bytes
            views = r.tensors()
            assert views["model.embed_tokens.weight"].dtype == torch.bfloat16
            full = rep.bytes
            rep = r.pull(2, timeout_ms=60000)
            assert not rep.planned and r.committed == 2 and r.usable
            if kind == "delta":  # version 2 as a delta from 1: a few percent of the bytes
                assert rep.delta_base == 1 and rep.bytes * 10 < full and rep.path == "delta", rep.path
                man.truth_verify([mem], 2, frac)
                with pytest.raises(refit.RefitError):  # not the full truth of 2: only 2% changed
                    man.truth_verify([mem], 2)
            else:
                assert rep.delta_base == 0 and rep.path == "host_direct", rep.path
                man.truth_verify([mem], 2)
            with pytest.raises(refit.RefitError) as e:
                r.pull(3, timeout_ms=300)
            assert e.value.name == "REFIT_ERR_TIMEOUT"
    finally:
        for p in pubs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err


def test_prepare_times_out_without_sources(tmp_path):
    man = refit.Layout("vllm:tp=2").manifest(refit.Model("tiny-moe"), 0)
    with refit.Receiver(man, registry=f"file:{tmp_path}/reg", job="prep", transports="shm") as r:
        with pytest.raises(refit.RefitError) as e:
            r.prepare(timeout_ms=200)
        assert e.value.name == "REFIT_ERR_TIMEOUT" and "no source" in e.value.detail
        assert r.holders() == []


def test_attach_checks_size(tmp_path):
    m = refit.Model("tiny-moe")
    man = refit.Layout("vllm:tp=2").manifest(m, 0)
    with refit.Receiver(man, registry=f"file:{tmp_path}/reg", job="sz") as r:
        with pytest.raises(refit.RefitError) as e:
            r.attach(0, torch.zeros(16, dtype=torch.uint8))
        assert "needs" in e.value.detail


# ---------------------------------------------------------------- adapters


def _tree(named_shapes, dtype=torch.bfloat16):
    root = torch.nn.Module()
    for name, shape in named_shapes:
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.randn(shape).to(dtype)))
    return root


def test_megatron_adapter_matches_and_reports():
    m = refit.Model("tiny-moe")
    lay = "megatron:tp=2,ep=2,etp=1"
    locs = refit.Layout(lay).manifest(m, 0).locals()
    good = _tree([("module." + l.name, l.shape) for l in locs])
    before = {n: p.detach().clone() for n, p in good.named_parameters()}
    b = refit.adapters.megatron(good.named_parameters(), m, lay, 0)
    for n, p in good.named_parameters():  # values kept, storage now the arena
        assert torch.equal(p, before[n])
        assert b.arena.data_ptr() <= p.data_ptr() < b.arena.data_ptr() + b.arena.numel()
    # SequentialMLP expert names are accepted as TEGroupedMLP's
    import re
    seq = [(re.sub(r"mlp\.experts\.(linear_fc[12])\.weight(\d+)$", r"mlp.experts.local_experts.\2.\1.weight", l.name),
            l.shape) for l in locs]
    assert any("local_experts" in n for n, _ in seq)
    refit.adapters.megatron(_tree(seq).named_parameters(), m, lay, 0)
    shapes = [(l.name, l.shape) for l in locs]
    shapes[0] = (shapes[0][0], (3, 3))
    del shapes[1]
    shapes.append(("decoder.layers.9.bogus.weight", (2,)))
    with pytest.raises(refit.adapters.AdapterError) as e:
        refit.adapters.megatron(_tree(shapes).named_parameters(), m, lay, 0)
    err = e.value
    assert err.missing == [locs[1].name] and err.unexpected == ["decoder.layers.9.bogus.weight"]
    assert len(err.mismatched) == 1 and locs[0].name in err.mismatched[0]
    assert "missing (1)" in str(err) and "unexpected (1)" in str(err)


def test_vllm_adapter_and_publish_from_params(tmp_path):
    m = refit.Model("tiny-moe")
    locs = refit.Layout("vllm:tp=2").manifest(m, 1).locals()
    model = _tree([(l.name, l.shape) for l in locs])
    b = refit.adapters.vllm(model.named_parameters(), m, "vllm:tp=2", 1)
    b.manifest.truth_fill([b.arena], 3)  # writes through the parameters' storage
    assert dict(model.named_parameters())[locs[0].name].abs().sum() > 0
    with pytest.raises(refit.RefitError):
        refit.adapters.vllm(model.named_parameters(), m, "megatron:tp=2", 1)


def test_hf_adapter_fused_experts_placements():
    """transformers 5.x fuses experts: mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]."""
    m = refit.Model("tiny-moe")
    canon = m.tensors()
    shapes, fused = [], {}
    import re
    for t in canon:
        mm = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", t.name)
        if not mm:
            shapes.append((t.name, t.shape))
            continue
        pre = mm.group(1)
        fused.setdefault(pre, {"E": 0})
        fused[pre]["E"] = max(fused[pre]["E"], int(mm.group(2)) + 1)
        fused[pre][mm.group(3)] = t.shape
    for pre, f in fused.items():
        i, h = f["gate"]
        shapes.append((pre + ".gate_up_proj", (f["E"], 2 * i, h)))
        shapes.append((pre + ".down_proj", (f["E"], h, i)))
    model = _tree(shapes)
    b = refit.adapters.hf(model.named_parameters(), m)
    assert b.manifest.identity["layout"] == "hf-params"
    src = refit.Layout("megatron:tp=2,ep=2,etp=1")
    srcs = [src.manifest(m, r) for r in range(2)]
    mem = [[np.zeros(s.regions()[0], np.uint8)] for s in srcs]
    for s, mm in zip(srcs, mem):
        s.truth_fill(mm, 7)
    refit.Plan(srcs, b.manifest).execute(mem, [b.arena])
    b.manifest.truth_verify([b.arena], 7)
    # gate rows of expert 1 in the fused tensor equal its canonical gate_proj from an hf plan
    hf = refit.Layout("hf").manifest(m, 0)
    hmem = [np.zeros(hf.regions()[0], np.uint8)]
    refit.Plan(srcs, hf).execute(mem, hmem)
    hv = hf.views(hmem)
    pre = next(iter(fused))
    gu = dict(model.named_parameters())[pre + ".gate_up_proj"]
    i = fused[pre]["gate"][0]
    assert np.array_equal(gu[1, :i].view(torch.int16).numpy().view(np.uint16), hv[f"{pre}.1.gate_proj.weight"])
    assert np.array_equal(gu[1, i:].view(torch.int16).numpy().view(np.uint16), hv[f"{pre}.1.up_proj.weight"])


def test_e2e_qwen3_moe(tmp_path):
    """The real model, end to end (tests/python/e2e_qwen3_moe.py), on the CPU."""
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, os.path.join(HERE, "e2e_qwen3_moe.py"), "--workdir", str(tmp_path / "w"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["v1_equal"] and res["v2_equal"] and res["before_differs"] and res["v1_v2_differ"]


def test_config_transformers5_expert_count(tmp_path):
    """transformers 5 writes a Qwen3-MoE's expert count as num_local_experts."""
    sys.path.insert(0, HERE)
    from e2e_qwen3_moe import config
    config().save_pretrained(str(tmp_path / "a"))
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    n = cfg.pop("num_experts", None) or cfg.pop("num_local_experts")
    cfg.pop("num_local_experts", None)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps(dict(cfg, num_local_experts=n)))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps(dict(cfg, num_experts=n)))
    b, c = refit.Model(str(tmp_path / "b")), refit.Model(str(tmp_path / "c"))
    assert [t.shape for t in b.tensors()] == [t.shape for t in c.tensors()]
    assert sum(".experts.3.down_proj" in t.name for t in b.tensors()) == 2
