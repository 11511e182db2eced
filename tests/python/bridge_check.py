#!/usr/bin/env python3
"""Checks, byte for byte, that refit's `megatron` layout equals what
Megatron-Bridge's own HF->Megatron conversion puts on every Megatron rank.

Usage (in the venv made by scripts/bridge-venv.sh):
    python tests/python/bridge_check.py [REFIT] [--case MODEL:LAYOUT ...] [--keep DIR]
REFIT defaults to $REFIT_BIN, else build/refit.

For each case, refit fills the synthetic source weights of a built-in model
and dumps (`plan --execute --dump`) the canonical HF state dict (`--dst hf`)
and every rank of a megatron layout (`--dst megatron:...`).  The HF dump is
the input to Megatron-Bridge 0.3.1, run as its load path
(MegatronModelBridge.load_weights_hf_to_megatron) would run on each rank:

  * ranks: which tp / pp / expert-tp / ep rank each global rank is comes from
    Megatron-Core's RankGenerator (order tp-cp-ep-dp-pp, as
    initialize_model_parallel uses it), checked against docs/layouts.md;
  * names: Bridge's `_megatron_local_name_to_global` turns each of our local
    names into Bridge's global name (pipeline layer offset from the layer's
    `layer_number`; local expert j on ep rank r -> r*E/ep + j); the checker
    also checks that against docs/layouts.md's formula;
  * mappings: the model bridge's own `mapping_registry()` (Qwen3MoEBridge,
    Qwen3Bridge, LlamaBridge, DeepSeekV3Bridge) finds the mapping for the
    global name: QKVMapping, GatedMLPMapping, or AutoMapping, which picks
    ColumnParallelMapping / RowParallelMapping / ReplicatedMapping from the
    class name of the Megatron module holding the parameter;
  * input: the bridge's `maybe_modify_loaded_hf_weight` reads the HF tensors;
  * output: the mapping's `hf_to_megatron` gives the rank's tensor, which must
    equal ours in dtype, shape and every byte.

Every tensor of every rank of our dump is compared; a tensor Bridge has no
mapping for, an HF tensor no rank consumes, or a rank missing an HF tensor
that its pipeline stage / expert range should hold, is a failure.

What is simulated, and how (Bridge's splitting and merging code runs
unmodified):
  * No torch.distributed, no GPU.  megatron.bridge's package __init__ files
    import transformer_engine (through AutoBridge and PEFT), which cannot be
    installed without CUDA, so the packages are registered as empty modules
    and only the conversion modules are imported; peft_bridge (a base class of
    MegatronModelBridge, PEFT only) is replaced by empty classes.
  * Parallel groups: Bridge's mappings take their groups from
    megatron.core.mpu and their sizes/ranks from get_pg_size/get_pg_rank.
    Those are replaced by fake groups of the case's tp / etp / ep / pp sizes.
    The tp and etp groups report rank 0, the rank that in Bridge computes the
    split, and the patched `scatter_to_tp_ranks` hands out split[r] for the
    rank r being simulated (what torch.distributed.scatter would deliver);
    `broadcast_tensor_to_tp_ranks` returns the source tensor (what every rank
    of the group receives).  Bridge itself still picks the expert-TP group
    for expert parameters (is_expert).
  * Megatron modules: a module tree per rank with our dump's parameters (our
    local shapes and dtypes) under modules whose class names are the ones
    Megatron-Core 0.16.1's Transformer Engine layer spec instantiates
    (gpt_layer_specs.py, transformer_engine_spec_provider.py,
    moe_module_specs.py); AutoMapping dispatches on those names.
  * Tied embeddings: Bridge converts no output_layer when embeddings are tied;
    with pp > 1, `_broadcast_shared_embeddings` copies the first stage's
    word_embeddings shard into the last stage's output_layer.weight, so the
    expected output_layer there is Bridge's embedding shard of that tp rank.

Vocabulary padding: Bridge never pads (its providers default to
should_pad_vocab=False; ColumnParallelMapping refuses a vocabulary that does
not divide by tp).  Every built-in tiny model has an odd vocabulary (997,
1001), so the pad=0 layout only exists at tp=1: the tp=1 cases use pad=0 and
compare Bridge's unpadded conversion directly.  Cases with tp > 1 use refit's
default (Megatron-LM's pad to a multiple of 128*tp): the HF embedding (and
lm_head) is zero-padded to that size Vp before Bridge's ColumnParallelMapping
splits it, which is the padded Megatron-LM model's tensor; the comparison
then covers the real rows and proves that our padding rows are zero.

Prints one line per case (tensors and bytes compared); exits 1 on any failure,
naming the tensor, the rank and the first differing index.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import types
import warnings

# (model, layout).  Layouts per docs/layouts.md; dp defaults to the least
# value that makes ep*etp divide tp*dp.
CASES = [
    ("tiny-moe", "megatron:tp=1,ep=1,pad=0"),
    ("tiny-moe", "megatron:tp=2,ep=2"),
    ("tiny-moe", "megatron:tp=4"),  # tp 4 > 2 kv heads: shards cut a query group
    ("tiny-moe", "megatron:ep=4,etp=1"),
    ("tiny-moe", "megatron:tp=2,ep=2,etp=1"),
    ("tiny-moe", "megatron:tp=2,ep=4,etp=1"),  # dp 2, expert ranks regroup tp*dp
    ("tiny-dense", "megatron:tp=1,pad=0"),
    ("tiny-dense", "megatron:tp=2"),
    ("tiny-dense", "megatron:tp=4,pp=2"),
    ("tiny-tied", "megatron:tp=2"),  # tp 2 > 1 kv head
    ("tiny-tied", "megatron:tp=2,pp=2"),  # output_layer copy on the last stage
    ("tiny-mla", "megatron:tp=2,ep=2"),
]

# Which Megatron-Bridge model bridge converts each built-in tiny model (the
# Hugging Face architecture it is shaped after), and its attention geometry
# (checked against the HF dump's shapes).
MODELS = {
    "tiny-dense": dict(bridge="qwen3", heads=8, kv_heads=2, head_dim=16),
    "tiny-moe": dict(bridge="qwen3_moe", heads=8, kv_heads=2, head_dim=16),
    "tiny-tied": dict(bridge="llama", heads=4, kv_heads=1, head_dim=16),
    "tiny-mla": dict(bridge="deepseek_v3", heads=8, kv_heads=8, head_dim=None),
}

# Known, explained disagreements: (model, layout, tensor-name regex) -> reason.
# A matching mismatch is reported as XFAIL and does not fail the run.
EXPECTED_FAILURES = {}

# Class of the Megatron-Core module that holds each parameter in the Transformer
# Engine layer spec (megatron-core 0.16.1), keyed by the module path relative
# to the layer (or to the model for the first three).  TENorm instantiates
# te.pytorch.RMSNorm; MLA's down projections are TELinear(parallel_mode=
# "duplicated"); shared experts use the dense MLP spec (moe_module_specs.py).
MODULE_CLASS = {
    "embedding.word_embeddings": "VocabParallelEmbedding",
    "output_layer": "ColumnParallelLinear",
    "decoder.final_layernorm": "RMSNorm",
    "input_layernorm": "RMSNorm",
    "self_attention.linear_qkv": "TELayerNormColumnParallelLinear",
    "self_attention.q_layernorm": "RMSNorm",
    "self_attention.k_layernorm": "RMSNorm",
    "self_attention.linear_proj": "TERowParallelLinear",
    "self_attention.linear_q_proj": "TEColumnParallelLinear",
    "self_attention.linear_q_down_proj": "TELinear",
    "self_attention.linear_kv_down_proj": "TELinear",
    "self_attention.linear_q_up_proj": "TELayerNormColumnParallelLinear",
    "self_attention.linear_kv_up_proj": "TELayerNormColumnParallelLinear",
    "pre_mlp_layernorm": "RMSNorm",
    "mlp.linear_fc1": "TELayerNormColumnParallelLinear",
    "mlp.linear_fc2": "TERowParallelLinear",
    "mlp.router": "TopKRouter",
    "mlp.experts.linear_fc1": "TEColumnParallelGroupedLinear",
    "mlp.experts.linear_fc2": "TERowParallelGroupedLinear",
    "mlp.shared_experts.linear_fc1": "TEColumnParallelLinear",
    "mlp.shared_experts.linear_fc2": "TERowParallelLinear",
}
DUPLICATED = {"self_attention.linear_q_down_proj", "self_attention.linear_kv_down_proj"}

# --------------------------------------------------------------------------
# Megatron-Bridge, imported without transformer_engine and run without
# torch.distributed (see the module docstring).
# --------------------------------------------------------------------------

SIM = dict(tp=1, tp_rank=0, etp=1, etp_rank=0, ep=1, ep_rank=0, pp=1, pp_rank=0)


class FakeGroup:
    """A process group of the simulated geometry.  tp / etp report rank 0, the
    source of Bridge's scatter / broadcast; ep / pp report the simulated rank."""

    def __init__(self, kind):
        self.kind = kind

    def size(self):
        return SIM[self.kind]

    def rank(self):
        return 0 if self.kind in ("tp", "etp") else SIM[self.kind + "_rank"]


def _pg_size(group=None):
    return 1 if group is None else group.size()


def _pg_rank(group=None):
    return 0 if group is None else group.rank()


FAKE_MPU = types.SimpleNamespace(
    is_initialized=lambda: True,
    get_tensor_model_parallel_group=lambda: FakeGroup("tp"),
    get_expert_tensor_parallel_group=lambda: FakeGroup("etp"),
    get_pipeline_model_parallel_group=lambda: FakeGroup("pp"),
    get_expert_model_parallel_group=lambda: FakeGroup("ep"),
)


class Bridge:
    """Megatron-Bridge's modules, patched for the simulation."""

    def __init__(self):
        warnings.filterwarnings("ignore")
        import megatron  # the namespace package installed by megatron-core

        base = os.path.join(list(megatron.__path__)[0], "bridge")
        for name, sub in [
            ("megatron.bridge", ""),
            ("megatron.bridge.models", "models"),
            ("megatron.bridge.models.conversion", "models/conversion"),
            ("megatron.bridge.models.qwen", "models/qwen"),
            ("megatron.bridge.models.llama", "models/llama"),
            ("megatron.bridge.models.deepseek", "models/deepseek"),
        ]:
            if name not in sys.modules:
                m = types.ModuleType(name)
                m.__path__ = [os.path.join(base, sub)]
                sys.modules[name] = m
        peft = types.ModuleType("megatron.bridge.models.conversion.peft_bridge")
        peft.MegatronPeftBridge = type("MegatronPeftBridge", (), {})
        peft.AdapterWeightConversionTask = type("AdapterWeightConversionTask", (), {})
        sys.modules[peft.__name__] = peft

        import torch
        from megatron.core.transformer.module import MegatronModule
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.bridge.models.conversion import model_bridge as mb
        from megatron.bridge.models.conversion import param_mapping as pm
        from megatron.bridge.models.conversion import utils as cu
        from megatron.bridge.models.deepseek.deepseek_v3_bridge import DeepSeekV3Bridge
        from megatron.bridge.models.llama.llama_bridge import LlamaBridge
        from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge
        from megatron.bridge.models.qwen.qwen3_moe_bridge import Qwen3MoEBridge

        pm.mpu = FAKE_MPU
        pm.get_pg_size = _pg_size
        pm.get_pg_rank = _pg_rank
        mb.parallel_state = FAKE_MPU
        mb.get_pg_size = _pg_size

        def scatter_to_tp_ranks(self, splits, output_shape, dtype, device, src_rank=0):
            if self.tp_size == 1:
                return splits[0].to(device=device, dtype=dtype) if splits else None
            rank = SIM["etp_rank"] if self.is_expert else SIM["tp_rank"]
            if len(splits) != self.tp_size:
                raise ValueError(f"Bridge made {len(splits)} splits for a group of {self.tp_size}")
            out = splits[rank].to(device=device, dtype=dtype)
            if out.shape != torch.Size(output_shape):  # torch.distributed.scatter would fail
                raise ValueError(f"Bridge's split {rank} has shape {tuple(out.shape)}, "
                                 f"the rank's parameter {tuple(output_shape)}")
            return out

        pm.MegatronParamMapping.scatter_to_tp_ranks = scatter_to_tp_ranks
        pm.MegatronParamMapping.broadcast_tensor_to_tp_ranks = lambda self, tensor, src_rank=0: tensor
        # ReplicatedMapping moves the tensor to torch.cuda.current_device() unless
        # it is already there; a CPU tensor's device index is None.
        torch.cuda.current_device = lambda: None

        self.torch = torch
        self.MegatronModule = MegatronModule
        self.TransformerConfig = TransformerConfig
        self.mb, self.pm, self.cu = mb, pm, cu
        self.bridges = {"qwen3": Qwen3Bridge, "qwen3_moe": Qwen3MoEBridge, "llama": LlamaBridge,
                        "deepseek_v3": DeepSeekV3Bridge}
        self.versions = {}
        import importlib.metadata as md

        for p in ("megatron-bridge", "megatron-core", "torch", "transformers"):
            self.versions[p] = md.version(p)


# --------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------


class CaseResult:
    def __init__(self):
        self.tensors = 0  # compared and equal
        self.total = 0  # in our dump
        self.bytes = 0
        self.kinds = {}  # Bridge mapping class -> tensors
        self.failures = []  # strings
        self.xfails = []
        self.notes = []


def parse_layout(s):
    scheme, _, rest = s.partition(":")
    geo = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        geo[k] = int(v)
    return scheme, geo


def first_diff(a, b):
    """Index of the first element whose bytes differ (a, b same shape/dtype)."""
    torch = BR.torch
    n = a.element_size()
    ab = a.contiguous().view(torch.uint8).reshape(-1, n)
    bb = b.contiguous().view(torch.uint8).reshape(-1, n)
    flat = int((ab != bb).any(dim=1).nonzero()[0].item())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return idx, a.reshape(-1)[flat].item(), b.reshape(-1)[flat].item()


def rank_positions(tp, dp, pp, etp, ep):
    """{global rank: {tp, dp, pp, etp, ep: position}} from megatron.core.parallel_state."""
    from megatron.core.parallel_state import RankGenerator

    order = "tp-cp-ep-dp-pp"
    world = tp * dp * pp
    decoder = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order=order)
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    pos = {r: {} for r in range(world)}
    for key, gen, name in [("tp", decoder, "tp"), ("dp", decoder, "dp"), ("pp", decoder, "pp"),
                           ("etp", expert, "tp"), ("ep", expert, "ep")]:
        for group in gen.get_ranks(name):
            for i, r in enumerate(group):
                pos[r][key] = i
    return pos


def run_refit(refit, model, layout, out_dir):
    cmd = [refit, "plan", "--model", model, "--src", "hf", "--dst", layout, "--all-ranks", "--execute",
           "--dump", out_dir]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")


def load_dump(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def check_case(refit, model, layout, work, mutate=None):
    torch = BR.torch
    res = CaseResult()
    spec = MODELS[model]
    hf_dir, mg_dir = os.path.join(work, "hf"), os.path.join(work, "megatron")
    run_refit(refit, model, "hf", hf_dir)
    run_refit(refit, model, layout, mg_dir)
    hf, _ = load_dump(os.path.join(hf_dir, "rank-0", "model.safetensors"))
    ranks = sorted(int(d[5:]) for d in os.listdir(mg_dir) if d.startswith("rank-"))
    _, meta0 = load_dump(os.path.join(mg_dir, f"rank-{ranks[0]}", "model.safetensors"))
    scheme, geo = parse_layout(meta0["refit_layout"])
    assert scheme == "megatron", meta0
    if "first" in geo or "last" in geo:
        raise RuntimeError("uneven pipeline stages (first=/last=) are not simulated here")
    tp, pp, ep, etp, dp, pad = (geo[k] for k in ("tp", "pp", "ep", "etp", "dp", "pad"))
    world = tp * pp * dp
    if ranks != list(range(world)):
        res.failures.append(f"dump has ranks {ranks}, layout world is {world}")
        return res, geo

    # Model facts from the HF dump.
    layer_ids = {int(m.group(1)) for k in hf for m in [re.match(r"model\.layers\.(\d+)\.", k)] if m}
    n_layers = max(layer_ids) + 1
    expert_ids = {int(m.group(1)) for k in hf for m in [re.match(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.", k)]
                  if m}
    n_experts = len(expert_ids)
    embed = hf["model.embed_tokens.weight"]
    vocab, hidden = embed.shape
    tied = "lm_head.weight" not in hf
    if n_layers % pp:
        raise RuntimeError(f"{n_layers} layers do not split over pp {pp}")
    per_stage = n_layers // pp
    if n_experts and n_experts % ep:
        raise RuntimeError(f"{n_experts} experts do not split over ep {ep}")

    cfg_kw = dict(num_layers=n_layers, hidden_size=hidden, num_attention_heads=spec["heads"],
                  num_query_groups=spec["kv_heads"], tensor_model_parallel_size=tp,
                  pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16 if pp > 1 else None,
                  add_bias_linear=False, gated_linear_unit=True, normalization="RMSNorm")
    if spec["head_dim"]:
        hd = spec["head_dim"]
        cfg_kw["kv_channels"] = hd
        q, k = hf["model.layers.0.self_attn.q_proj.weight"], hf["model.layers.0.self_attn.k_proj.weight"]
        assert q.shape[0] == spec["heads"] * hd and k.shape[0] == spec["kv_heads"] * hd, (q.shape, k.shape)
    if n_experts:
        im = next(v.shape[0] for k, v in hf.items() if k.endswith(".mlp.experts.0.gate_proj.weight"))
        cfg_kw.update(num_moe_experts=n_experts, moe_ffn_hidden_size=im, expert_model_parallel_size=ep,
                      expert_tensor_parallel_size=etp, moe_grouped_gemm=True)
    # Megatron-Core's own validation of the geometry (heads vs tp, experts vs ep, ...).
    cfg = BR.TransformerConfig(**cfg_kw)

    # Vocabulary padding (see the module docstring).
    vp_expected = vocab if pad == 0 else math.ceil(vocab / (pad * tp)) * pad * tp
    rank0, _ = load_dump(os.path.join(mg_dir, "rank-0", "model.safetensors"))
    vp = rank0["embedding.word_embeddings.weight"].shape[0] * tp
    if vp != vp_expected:
        res.failures.append(f"padded vocabulary {vp}, Megatron-LM's rule gives {vp_expected}")
        return res, geo
    hf_in = dict(hf)
    if vp != vocab:
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            if k in hf_in:
                t = hf_in[k]
                hf_in[k] = torch.cat([t, torch.zeros(vp - vocab, t.shape[1], dtype=t.dtype)], 0)
        res.notes.append(f"vocab {vocab} zero-padded to {vp} for Bridge; padding rows checked zero")
    else:
        res.notes.append(f"vocab {vocab} unpadded (pad=0, Bridge's default)")

    # Which tp / pp / etp / ep rank each global rank is: Megatron-Core's own
    # RankGenerators, built as initialize_model_parallel builds them with
    # Megatron-LM's and Bridge's default order; checked against docs/layouts.md.
    positions = rank_positions(tp, dp, pp, etp, ep)
    for rank, pos in positions.items():
        local = rank % (tp * dp)
        doc = dict(tp=rank % tp, dp=(rank // tp) % dp, pp=rank // (tp * dp), etp=local % etp,
                   ep=(local // etp) % ep)
        if pos != doc:
            res.failures.append(f"rank {rank}: Megatron-Core's RankGenerator gives {pos}, docs/layouts.md {doc}")
    if res.failures:
        return res, geo

    bridge = BR.bridges[spec["bridge"]]()
    registry = bridge.mapping_registry()
    consumed_anywhere = set()
    pad_rows_checked = 0

    for rank in ranks:
        t, pp_rank, etp_rank, ep_rank = (positions[rank][k] for k in ("tp", "pp", "etp", "ep"))
        SIM.update(tp=tp, tp_rank=t, etp=etp, etp_rank=etp_rank, ep=ep, ep_rank=ep_rank, pp=pp, pp_rank=pp_rank)
        ours, meta = load_dump(os.path.join(mg_dir, f"rank-{rank}", "model.safetensors"))
        if mutate:
            mutate(rank, ours)
        res.total += len(ours)
        if meta.get("refit_rank") != str(rank):
            res.failures.append(f"rank {rank}: metadata refit_rank={meta.get('refit_rank')}")
        first, last = pp_rank == 0, pp_rank == pp - 1

        # The rank's module tree (Megatron-Core TE spec class names, our shapes).
        root = BR.torch.nn.Module()
        leaves = {}
        for name, tensor in ours.items():
            mod_path, _, pname = name.rpartition(".")
            m = re.match(r"decoder\.layers\.(\d+)\.(.+)$", mod_path)
            key = m.group(2) if m else mod_path
            cls_name = MODULE_CLASS.get(key)
            if cls_name is None:
                res.failures.append(f"rank {rank} {name}: no Megatron-Core module known for '{key}'")
                continue
            node = root
            parts = mod_path.split(".")
            for i, part in enumerate(parts):
                child = node._modules.get(part)
                if child is None:
                    if i == len(parts) - 1:
                        child = type(cls_name, (BR.torch.nn.Module,), {})()
                        child.config = cfg
                        if key in DUPLICATED:
                            child.parallel_mode = "duplicated"
                        leaves[mod_path] = child
                    elif i >= 2 and parts[i - 1] == "layers" and parts[i - 2] == "decoder":
                        child = BR.MegatronModule(cfg)
                        # TransformerLayer.layer_number: 1-based, global (offset of the stage).
                        child.layer_number = pp_rank * per_stage + int(part) + 1
                    else:
                        child = BR.torch.nn.Module()
                    node.add_module(part, child)
                node = child
            p = BR.torch.empty(tensor.shape, dtype=tensor.dtype)
            if pname == "expert_bias":
                node.register_buffer(pname, p)
            else:
                node.register_parameter(pname, BR.torch.nn.Parameter(p, requires_grad=False))

        consumed = set()
        for name in sorted(ours):
            ours_t = ours[name]
            mod_path = name.rpartition(".")[0]
            if mod_path not in leaves:
                continue  # already reported
            # Bridge's local -> global name.
            gname = BR.mb._megatron_local_name_to_global(root, cfg, name)
            doc = re.sub(r"^decoder\.layers\.(\d+)\.",
                         lambda m: f"decoder.layers.{pp_rank * per_stage + int(m.group(1))}.", name)
            if n_experts:
                doc = re.sub(r"(\.mlp\.experts\.linear_fc[12]\.weight)(\d+)$",
                             lambda m: f"{m.group(1)}{ep_rank * (n_experts // ep) + int(m.group(2))}", doc)
            if gname != doc:
                res.failures.append(f"rank {rank} {name}: Bridge's global name {gname}, docs/layouts.md's {doc}")
                continue
            lookup = gname
            if gname == "output_layer.weight" and tied:
                if pp == 1:
                    res.failures.append(f"rank {rank} {name}: tied embeddings with pp=1 have no output_layer")
                    continue
                lookup = "embedding.word_embeddings.weight"  # _broadcast_shared_embeddings' copy
            mapping = registry.megatron_to_hf_lookup(lookup)
            if mapping is None:
                res.failures.append(f"rank {rank} {name}: Bridge has no mapping for {gname} (unmatched)")
                continue
            hf_names = [mapping.hf_param] if isinstance(mapping.hf_param, str) else list(mapping.hf_param.values())
            missing = [n for n in hf_names if n not in hf_in]
            if missing:
                res.failures.append(f"rank {rank} {name}: Bridge maps {gname} to {missing}, not in the HF dump")
                continue
            consumed.update(hf_names)
            module, _ = BR.cu.get_module_and_param_from_name(root, name)
            try:
                hf_w = bridge.maybe_modify_loaded_hf_weight(mapping.hf_param, hf_in)
                want = mapping.hf_to_megatron(hf_w, module)
            except Exception as e:  # Bridge refuses: a disagreement, reported as such
                res.failures.append(f"rank {rank} {name}: Bridge's {type(mapping).__name__} raised "
                                    f"{type(e).__name__}: {e}")
                continue
            label = f"rank {rank} {name} ({type(mapping).__name__}"
            inner = getattr(mapping, "_mapping", None) or getattr(getattr(mapping, "_tp_mapping", None),
                                                                   "_mapping", None)
            label += f"/{type(inner).__name__})" if inner is not None else ")"
            if want.dtype != ours_t.dtype or want.shape != ours_t.shape:
                msg = (f"{label}: Bridge gives {want.dtype} {tuple(want.shape)}, "
                       f"ours is {ours_t.dtype} {tuple(ours_t.shape)}")
                record(res, model, layout, name, msg)
                continue
            if not BR.torch.equal(want.contiguous().view(BR.torch.uint8), ours_t.contiguous().view(BR.torch.uint8)):
                idx, a, b = first_diff(ours_t, want)
                record(res, model, layout, name, f"{label}: first differing index {idx}: ours {a!r}, Bridge {b!r}")
                continue
            res.tensors += 1
            kind = label.split(" (", 1)[1].rstrip(")")
            res.kinds[kind] = res.kinds.get(kind, 0) + 1
            res.bytes += ours_t.numel() * ours_t.element_size()
            if lookup.startswith("embedding.") or gname.startswith("output_layer."):
                rows = ours_t.shape[0]  # global rows t*rows .. (t+1)*rows; those >= vocab are padding
                n_pad = max(0, (t + 1) * rows - max(vocab, t * rows))
                if n_pad and BR.torch.count_nonzero(ours_t[rows - n_pad:].float()):
                    res.failures.append(f"rank {rank} {name}: padding rows are not zero")
                pad_rows_checked += n_pad

        # Does the rank hold every HF tensor its stage / expert range should?
        lo, hi = pp_rank * per_stage, (pp_rank + 1) * per_stage
        e_lo = ep_rank * (n_experts // ep) if n_experts else 0
        e_hi = e_lo + (n_experts // ep) if n_experts else 0
        expect = set()
        for k in hf:
            m = re.match(r"model\.layers\.(\d+)\.", k)
            if m:
                if not lo <= int(m.group(1)) < hi:
                    continue
                e = re.match(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.", k)
                if e and not e_lo <= int(e.group(1)) < e_hi:
                    continue
                expect.add(k)
            elif k == "model.embed_tokens.weight":
                if first or (tied and last):
                    expect.add(k)
            elif k in ("model.norm.weight", "lm_head.weight"):
                if last:
                    expect.add(k)
            else:
                res.failures.append(f"HF tensor {k}: unknown placement")
        for k in sorted(expect - consumed):
            res.failures.append(f"rank {rank}: holds nothing made from HF {k} (Bridge would load it here)")
        for k in sorted(consumed - expect):
            res.failures.append(f"rank {rank}: holds a tensor made from HF {k}, which belongs to another rank")
        consumed_anywhere |= consumed

    for k in sorted(set(hf) - consumed_anywhere):
        res.failures.append(f"HF tensor {k} is on no rank")
    if res.tensors != res.total and not res.failures and not res.xfails:
        res.failures.append(f"only {res.tensors} of {res.total} tensors compared")
    if vp != vocab:
        res.notes[-1] += f" ({pad_rows_checked} rows)"
    return res, geo


def self_test(refit, work):
    """The checker must catch wrong layouts: corrupt one case's dump in a few
    ways after loading it and require each to be reported."""
    torch = BR.torch
    qkv = "decoder.layers.1.self_attention.linear_qkv.weight"

    def flip_bit(rank, ours):
        if rank == 1:
            t = ours[qkv].view(torch.int16)
            t[37, 5] ^= 1

    def swap_experts(rank, ours):
        if rank == 2:
            a, b = (f"decoder.layers.0.mlp.experts.linear_fc2.weight{j}" for j in (0, 1))
            ours[a], ours[b] = ours[b], ours[a]

    def swap_gate_up(rank, ours):
        if rank == 0:
            w = ours["decoder.layers.2.mlp.experts.linear_fc1.weight3"]
            ours["decoder.layers.2.mlp.experts.linear_fc1.weight3"] = torch.cat(w.chunk(2, 0)[::-1])

    def swap_k_v(rank, ours):
        # rank 3 (tp rank 1) holds query group 1: 4 q heads, k, v, 16 rows each
        if rank == 3:
            w = ours[qkv]
            ours[qkv] = torch.cat([w[:64], w[80:96], w[64:80]])

    def drop(rank, ours):
        if rank == 3:
            del ours["decoder.layers.3.self_attention.q_layernorm.weight"]

    def extra(rank, ours):
        if rank == 0:
            ours["decoder.layers.0.mlp.shared_experts.gate_weight"] = torch.zeros(1, 64, dtype=torch.bfloat16)

    def pad_garbage(rank, ours):
        if rank == 1:
            ours["embedding.word_embeddings.weight"][-1, 0] = 1.0

    wanted = {
        flip_bit: f"rank 1 {qkv} (QKVMapping/ColumnParallelMapping): first differing index (37, 5)",
        swap_experts: "rank 2 decoder.layers.0.mlp.experts.linear_fc2.weight0",
        swap_gate_up: "rank 0 decoder.layers.2.mlp.experts.linear_fc1.weight3 (GatedMLPMapping)",
        swap_k_v: f"rank 3 {qkv} (QKVMapping/ColumnParallelMapping): first differing index (64, 0)",
        drop: "rank 3: holds nothing made from HF model.layers.3.self_attn.q_norm.weight",
        extra: "rank 0 decoder.layers.0.mlp.shared_experts.gate_weight: no Megatron-Core module",
        pad_garbage: "rank 1 embedding.word_embeddings.weight",
    }
    bad = []
    for i, (mutate, text) in enumerate(wanted.items()):
        d = os.path.join(work, f"selftest{i}")
        os.makedirs(d, exist_ok=True)
        res, _ = check_case(refit, "tiny-moe", "megatron:tp=2,ep=2", d, mutate)
        if not any(f.startswith(text) for f in res.failures):
            bad.append(f"{mutate.__name__}: wanted '{text}...', got {res.failures or 'PASS'}")
    print(f"{'PASS' if not bad else 'FAIL':5} self-test: {len(wanted) - len(bad)}/{len(wanted)} corrupted dumps "
          f"caught", flush=True)
    for b in bad:
        print(f"      SELF-TEST {b}")
    return not bad


def record(res, model, layout, name, msg):
    for (m, lay, rx), why in EXPECTED_FAILURES.items():
        if m == model and lay == layout and re.search(rx, name):
            res.xfails.append(f"{msg}  [expected: {why}]")
            return
    res.failures.append(msg)


BR = None


def main():
    global BR
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("refit", nargs="?", default=os.environ.get("REFIT_BIN", "build/refit"))
    ap.add_argument("--case", action="append", metavar="MODEL:LAYOUT",
                    help="run only this case (repeatable), e.g. tiny-moe:megatron:tp=2,ep=2")
    ap.add_argument("--keep", metavar="DIR", help="keep the dumps under DIR")
    ap.add_argument("--no-self-test", action="store_true", help="skip the corrupted-dump self-test")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the Bridge mappings used per case")
    args = ap.parse_args()
    refit = os.path.abspath(args.refit)
    if not os.access(refit, os.X_OK):
        sys.exit(f"bridge_check: refit binary {refit} not found (pass it, or set REFIT_BIN)")
    cases = CASES
    if args.case:
        cases = [tuple(c.split(":", 1)) for c in args.case]

    t0 = time.time()
    BR = Bridge()
    print(f"bridge_check: Megatron-Bridge {BR.versions['megatron-bridge']}, megatron-core "
          f"{BR.versions['megatron-core']}, torch {BR.versions['torch']}, transformers "
          f"{BR.versions['transformers']} (imported in {time.time() - t0:.1f} s)", flush=True)

    failed = 0
    total_t = total_b = 0
    keep_root = os.path.abspath(args.keep) if args.keep else None
    with tempfile.TemporaryDirectory(prefix="refit-bridge-") as tmp:
        for i, (model, layout) in enumerate(cases):
            work = os.path.join(keep_root or tmp, f"case{i}-{model}")
            os.makedirs(work, exist_ok=True)
            t = time.time()
            try:
                res, geo = check_case(refit, model, layout, work)
                shown = "megatron:" + ",".join(f"{k}={v}" for k, v in geo.items())
            except Exception as e:
                res, shown = CaseResult(), layout
                res.failures.append(f"{type(e).__name__}: {e}")
            status = "FAIL" if res.failures else ("XFAIL" if res.xfails else "PASS")
            print(f"{status:5} {model:10} {shown:44} {res.tensors:4}/{res.total:<4} tensors {res.bytes:8} bytes "
                  f"equal  [{'; '.join(res.notes)}] {time.time() - t:.1f} s", flush=True)
            if args.verbose:
                print("      " + ", ".join(f"{k} {v}" for k, v in sorted(res.kinds.items())))
            for f in res.failures[:40]:
                print(f"      MISMATCH {model} {layout}: {f}")
            if len(res.failures) > 40:
                print(f"      ... and {len(res.failures) - 40} more")
            for f in res.xfails:
                print(f"      XFAIL {model} {layout}: {f}")
            failed += bool(res.failures)
            total_t += res.tensors
            total_b += res.bytes
        if not args.no_self_test and not self_test(refit, os.path.join(keep_root or tmp, "selftest")):
            failed += 1
    print(f"bridge_check: {len(cases) - failed}/{len(cases)} cases pass; {total_t} tensors, {total_b} bytes "
          f"compared in {time.time() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
