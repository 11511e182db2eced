"""refit as a vLLM weight-transfer backend: LLM(..., weight_transfer_config={"backend": "refit"}).

vLLM (0.32) creates one engine per worker process through WeightTransferEngineFactory (the `refit` name is
registered by refit.vllm_plugin, a `vllm.general_plugins` entry point) and drives it with
init_weight_transfer_engine(init_info), then start_weight_update / update_weights / finish_weight_update per
refit, and shutdown.  Each worker is one refit Receiver of the `vllm` layout for its own rank, derived from
the worker's vllm_config (tp, dp, expert parallel) and its live model (expert parameter names, shapes).

What a pull writes, per parameter class (docs/vllm.md has the table and the measured costs):
  - direct: the live parameter is the loader's tensor (norms; embeddings and lm_head; on CUDA every linear and
    the Triton MoE experts): the receiver's memory region *is* the parameter's storage, the pull writes it in
    place.  On the CPU the embeddings' matmul handler (used by lm_head) is rebuilt from it afterwards.
  - staged: the runtime tensor is something vLLM derives from the loader's tensor after loading (the CPU
    backend packs every linear weight into a oneDNN / sgl-kernel handle and replaces the parameter with an
    empty one; the CPU MoE backend prepacks w13/w2): the pull writes the loader's layout into a staging arena,
    then the layer's own post-load step (vLLM's code) runs on it and its result lands in the live storage.
Anything else -- a quantization method, an MoE backend, a platform or a layer this module has not been checked
against -- is refused at init_weight_transfer_engine with an error that names it.
"""
import json
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

import torch
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)
from vllm.logger import init_logger

from .adapters import ALIGN, AdapterError, vllm_expert_names
from .core import Layout, Manifest, Model, Receiver, RefitError, torch_dtype

logger = init_logger("vllm.refit")  # vLLM's format and level, prefixed with the worker in its log

BACKEND_NAME = "refit"


class RefitVllmError(RefitError):
    """A vLLM setup refit does not handle (REFIT_ERR_UNSUPPORTED, naming it), or a failed update (the pull's
    status, e.g. REFIT_ERR_MISMATCH, with the worker and its layout)."""

    def __init__(self, detail: str, call: str = "refit vllm backend", status: int = -4):
        super().__init__(status, detail, call)


# ---------------------------------------------------------------- init and update info


@dataclass
class RefitInitInfo(WeightTransferInitInfo):
    """init_info of init_weight_transfer_engine.  registry: "file:DIR" or "redis://HOST:PORT"; job: the job name
    the publishers use; group: the publishers' group; transports: e.g. "shm,ucx" (None: the library's default);
    timeout_ms: how long a pull waits for a version; model: the model name the publishers publish under, when it
    differs from the one refit derives from vLLM's model path (the config directory's base name)."""
    registry: str
    job: str
    group: str = "trainer"
    transports: Optional[str] = None
    timeout_ms: int = 60000
    model: Optional[str] = None
    transport_options: Optional[str] = None

    def __post_init__(self):
        for k in ("registry", "job", "group"):
            v = getattr(self, k)
            if not isinstance(v, str) or not v:
                raise ValueError(f"refit init_info: {k} must be a non-empty string, not {v!r}")
        for k in ("transports", "model", "transport_options"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"refit init_info: {k} must be a non-empty string when given, not {v!r}")
        if isinstance(self.timeout_ms, bool) or not isinstance(self.timeout_ms, int) or self.timeout_ms <= 0:
            raise ValueError(f"refit init_info: timeout_ms must be a positive integer, not {self.timeout_ms!r}")


@dataclass
class RefitUpdateInfo(WeightTransferUpdateInfo):
    """update_info of update_weights: {"version": N} pulls version N, {"version": "newest"} (the default) the
    newest complete version newer than the one held."""
    version: Union[int, str] = "newest"

    def __post_init__(self):
        v = self.version
        if v != "newest" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"refit update_info: version must be a positive integer or \"newest\", not {v!r}")


# ---------------------------------------------------------------- the worker's geometry


def _worker_geometry(vllm_config) -> dict:
    """tp, dp, expert parallel and this worker's ranks; refuses what the vllm layout cannot describe."""
    from vllm.distributed import get_tensor_model_parallel_rank
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size != 1:
        raise RefitVllmError(f"pipeline_parallel_size={pc.pipeline_parallel_size}: the vllm layout has no pipeline "
                             "stages; run vLLM with pipeline_parallel_size=1")
    if getattr(pc, "enable_eplb", False):
        raise RefitVllmError("enable_eplb=True: EPLB moves experts between ranks at run time, which a refit plan "
                             "(computed once from the layout) cannot follow; run without EPLB")
    if getattr(pc, "decode_context_parallel_size", 1) not in (None, 1) or \
            getattr(pc, "prefill_context_parallel_size", 1) not in (None, 1):
        raise RefitVllmError("context parallel is not supported by the vllm layout")
    tp, dp = pc.tensor_parallel_size, pc.data_parallel_size
    ep = bool(pc.enable_expert_parallel)
    t = get_tensor_model_parallel_rank()
    d = pc.data_parallel_rank if dp > 1 else 0
    return {"tp": tp, "dp": dp, "ep": tp * dp if ep else 1, "tp_rank": t, "dp_rank": d, "rank": t + tp * d,
            "placement": getattr(pc, "expert_placement_strategy", "linear")}


def detect_names(param_names) -> Optional[str]:
    """The vllm layout's names= for these parameter names (refit.adapters.vllm_expert_names): "routed", "fused", or
    None for a model without experts."""
    try:
        return vllm_expert_names(param_names)
    except AdapterError as e:
        raise RefitVllmError(e.detail) from None


def _refit_model(model_config, identity: Optional[str]) -> Model:
    """The refit model spec of vLLM's model: its config.json, named as refit names a config directory (the
    directory's base name unless the config has _name_or_path), or `identity` when given."""
    path = model_config.model
    cfg_file = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if cfg_file and os.path.isfile(cfg_file) and identity is None:
        return Model(path)
    if cfg_file and os.path.isfile(cfg_file):
        with open(cfg_file) as f:
            cfg = json.load(f)
    else:  # a hub id: the config vLLM loaded
        cfg = model_config.hf_config.to_dict()
    cfg["_name_or_path"] = identity or os.path.basename(path.rstrip("/")) or "model"
    with tempfile.TemporaryDirectory(prefix="refit-vllm-") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        return Model(d)


def _vocab_pad(params, rmodel: Model, tp: int) -> int:
    """The vllm layout's pad= that gives the live embedding's padded vocabulary: vLLM's 64 unless the model pads
    otherwise (the smallest pad p with round_up(V, p) equal to the live rows x tp)."""
    emb = params.get("model.embed_tokens.weight")
    vocab = next((t.shape[0] for t in rmodel.tensors() if t.name == "model.embed_tokens.weight"), None)
    if emb is None or vocab is None or emb.dim() != 2:
        return 64
    vp = emb.shape[0] * tp
    if vp == -(-vocab // 64) * 64 or vp < vocab:
        return 64  # the default, or a mismatch the shape check reports
    for p in range(vp - vocab + 1, min(vp, 65536) + 1):
        if vp % p == 0:
            return p
    return 64


# ---------------------------------------------------------------- parameter classes


def _exact(obj, module_path: str, cls_name: str) -> bool:
    """obj's class is exactly vllm's module_path.cls_name (a subclass may process weights differently)."""
    import importlib
    try:
        cls = getattr(importlib.import_module(module_path), cls_name)
    except (ImportError, AttributeError):
        return False
    return type(obj) is cls


def _platform() -> str:
    from vllm.platforms import current_platform
    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_rocm():
        return "rocm"
    if current_platform.is_cuda():
        return "cuda"
    return type(current_platform).__name__


_NORMS = ("RMSNorm",)
_UNQ_LINEAR = ("vllm.model_executor.layers.linear", "UnquantizedLinearMethod")
_UNQ_EMBED = ("vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod")
_UNQ_MOE = ("vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method", "UnquantizedFusedMoEMethod")


def _moe_backend(module) -> str:
    qm = module.quant_method
    return getattr(getattr(qm, "unquantized_backend", None), "name", "unknown")


def _classify(name: str, module, platform: str) -> str:
    """The path of one local tensor: direct, embedding (direct + handler rebuilt on the CPU), linear-cpu,
    moe-cpu; raises RefitVllmError naming what is not supported."""
    qm = getattr(module, "quant_method", None)
    mcls = type(module).__name__
    if qm is None:
        from vllm.model_executor.layers.layernorm import RMSNorm
        if type(module) is RMSNorm:
            return "direct"
        raise RefitVllmError(f"{name}: layer class {mcls} is not one refit has checked (its post-load processing "
                             "is unknown)")
    qcls = type(qm).__name__
    if _exact(qm, *_UNQ_LINEAR):
        if platform == "cpu":
            return "linear-cpu"
        if platform == "cuda":
            return "direct"
    elif _exact(qm, *_UNQ_EMBED):
        if platform in ("cpu", "cuda"):
            return "embedding"
    elif _exact(qm, *_UNQ_MOE):
        backend = _moe_backend(module)
        if backend == "CPU":
            kernel = type(getattr(getattr(qm, "moe_kernel", None), "fused_experts", None)).__name__
            if kernel not in _CPU_MOE_KERNELS:
                raise RefitVllmError(f"{name}: CPU MoE kernel {kernel} is not one refit has checked")
            return "moe-cpu"
        if backend in ("TRITON", "BATCHED_TRITON") and platform == "cuda":
            return "direct"
        raise RefitVllmError(
            f"{name}: MoE backend {backend} is not supported: refit writes the loader's layout directly for "
            "TRITON / BATCHED_TRITON and runs the CPU backend's prepacking; other backends rewrite w13/w2 after "
            "loading in ways refit has not been checked against (start vLLM with moe_backend=\"triton\")")
    else:
        raise RefitVllmError(f"{name}: quantization method {qcls} of {mcls} is not supported (refit moves "
                             "unquantized weights; quantized layers repack or rescale after loading)")
    raise RefitVllmError(f"{name}: {qcls} on platform {platform} is not supported (refit handles cpu and cuda)")


# vLLM 0.32's CPU MoE kernels (fused_moe/experts/cpu_moe.py): after loading they zero-pad the intermediate
# dimension to the kernel's alignment (when needed) and prepack w13 / w2 with prepack_moe_weight for their ISA.
_CPU_MOE_KERNELS = ("CPUUnquantizedExperts", "X86CPUUnquantizedExperts", "ArmCPUUnquantizedExperts",
                    "PowerCPUUnquantizedExperts")


@dataclass
class _Item:
    """One local tensor of the layout: its live parameter, owning module and path."""
    name: str
    local: object  # core.Local of the scheme's manifest
    module: object
    attr: str
    param: object
    path: str


# ---------------------------------------------------------------- the binding


class VllmBinding:
    """A live vLLM model described as a refit receiver of its worker's vllm layout: manifest, memory, apply step.

    Region 0 is a staging arena holding the loader's layout of the staged tensors; every direct tensor is a region
    of its own whose memory is the live parameter's storage (no parameter is moved or re-allocated: the storage
    vLLM captured stays the storage)."""

    def __init__(self, model, vllm_config, identity: Optional[str] = None):
        t0 = time.perf_counter()
        self.model, self.vllm_config = model, vllm_config
        mc = vllm_config.model_config
        if getattr(mc, "quantization", None):
            raise RefitVllmError(f"quantization={mc.quantization!r} is not supported (refit moves unquantized "
                                 "weights; a quantized model repacks and rescales after loading)")
        if getattr(vllm_config, "lora_config", None) is not None:
            raise RefitVllmError("LoRA is enabled: its wrapped layers are not supported; run without enable_lora")
        if "process_weights_after_loading" in type(model).__dict__:
            raise RefitVllmError(f"{type(model).__name__} has a model-level process_weights_after_loading hook "
                                 "that refit does not run")
        mla = sorted({type(mod).__name__ for mod in model.modules()
                      if "MLA" in type(mod).__name__ or "LatentAttention" in type(mod).__name__})
        if mla:
            raise RefitVllmError(f"multi-head latent attention ({', '.join(mla)}) is not supported: vLLM derives "
                                 "W_UK_T / W_UV from kv_b_proj after loading, a step refit does not run")
        self.platform = _platform()
        if self.platform not in ("cpu", "cuda"):
            raise RefitVllmError(f"platform {self.platform} is not supported (refit handles cpu and cuda)")
        self.geometry = g = _worker_geometry(vllm_config)
        params = dict(model.named_parameters())
        self.names = detect_names(params)
        self.rmodel = _refit_model(mc, identity)
        spec = (f"vllm:tp={g['tp']},ep={g['ep']},dp={g['dp']},pad={_vocab_pad(params, self.rmodel, g['tp'])}"
                + (",names=routed" if self.names == "routed" else ""))
        self.layout = Layout(spec)
        scheme = self.layout.manifest(self.rmodel, g["rank"])
        self.layout_str = scheme.identity["layout"]
        locs = scheme.locals()

        # Match names, then classify and check shapes.
        expected = {l.name for l in locs}
        missing = [l.name for l in locs if l.name not in params]
        unexpected = [n for n in params if n not in expected]
        if missing or unexpected:
            raise AdapterError(f"{self.layout_str} rank {g['rank']} of {self.rmodel.name} against vLLM's "
                               f"{type(model).__name__}", missing, unexpected, [])
        items, mismatched = [], []
        for l in locs:
            mod_name, _, attr = l.name.rpartition(".")
            module = model.get_submodule(mod_name)
            item = _Item(l.name, l, module, attr, params[l.name], _classify(l.name, module, self.platform))
            mismatched += self._check_shape(item)
            items.append(item)
        if mismatched:
            raise AdapterError(f"{self.layout_str} rank {g['rank']} of {self.rmodel.name}", [], [], mismatched)
        self._check_expert_placement(items)
        self.items = items
        self.device = next(iter(params.values())).device

        # The receiver's manifest: the scheme's local tensors and placements, in other regions.
        staged = [it for it in items if it.path in ("linear-cpu", "moe-cpu")]
        direct = [it for it in items if it not in staged]
        m = Manifest.build(self.rmodel.name, self.layout_str, g["rank"], self.layout.world)
        offsets, off = {}, 0
        for it in staged:
            offsets[it.name] = off
            off += -(-it.local.nbytes // ALIGN) * ALIGN
        m.add_region(max(off, ALIGN))
        self.staging = torch.zeros(max(off, ALIGN), dtype=torch.uint8, device=self.device)
        self.regions = [self.staging]
        for it in staged:
            m.add_local(it.name, it.local.dtype, it.local.shape, 0, offsets[it.name])
        for it in direct:
            r = m.add_region(it.local.nbytes)
            m.add_local(it.name, it.local.dtype, it.local.shape, r, 0)
            self.regions.append(it.param.data)
        for c in scheme.canonical():
            m.add_canonical(c.name, c.dtype, c.shape)
        for p in scheme.placements():
            m.add_placement(p.canonical, p.local, p.canon_offset, p.extent, p.local_offset)
        m.finalize()
        self.manifest = m
        self.staged_views = {it.name: self.staging[offsets[it.name]:offsets[it.name] + it.local.nbytes]
                             .view(torch_dtype(it.local.dtype)).view(it.local.shape) for it in staged}
        self.classes = self._summarize()
        self.init_ms = (time.perf_counter() - t0) * 1e3

    # -- checks

    def _check_shape(self, it: _Item) -> List[str]:
        l, p = it.local, it.param
        want = f"{l.dtype} {list(l.shape)}"
        got = f"{str(p.dtype).replace('torch.', '')} {list(p.shape)}"
        if it.path in ("direct", "embedding"):
            if torch_dtype(l.dtype) != p.dtype or tuple(p.shape) != tuple(l.shape) or not p.is_contiguous():
                return [f"{it.name}: vLLM holds {got}{'' if p.is_contiguous() else ' (not contiguous)'}, "
                        f"{self.layout_str} has {want}"]
        elif it.path == "linear-cpu":
            mod = it.module  # ReplicatedLinear keeps input_size only
            shape = (sum(mod.output_partition_sizes), getattr(mod, "input_size_per_partition", None) or mod.input_size)
            if shape != tuple(l.shape):
                return [f"{it.name}: vLLM's layer loads [{shape[0]}, {shape[1]}], {self.layout_str} has {want}"]
        elif it.path == "moe-cpu":
            mc = it.module.moe_config
            inter = mc.intermediate_size_per_partition_unpadded or mc.intermediate_size_per_partition
            hidden = mc.hidden_dim_unpadded or mc.hidden_dim
            e = it.module.local_num_experts
            shape = (e, 2 * inter, hidden) if it.attr == "w13_weight" else (e, hidden, inter)
            if shape != tuple(l.shape) or torch_dtype(l.dtype) != p.dtype:
                return [f"{it.name}: vLLM's layer loads {str(p.dtype).replace('torch.', '')} {list(shape)}, "
                        f"{self.layout_str} has {want}"]
        return []

    def _check_expert_placement(self, items):
        """With expert parallel, vLLM's expert map must be the linear placement the vllm layout describes."""
        g = self.geometry
        for it in items:
            if not hasattr(it.module, "global_num_experts"):
                continue
            emap = getattr(it.module, "expert_map", None)
            if g["ep"] == 1:
                if emap is not None:
                    raise RefitVllmError(f"{it.name}: vLLM has an expert map without expert parallel")
                continue
            E = it.module.global_num_experts
            base, rem = E // g["ep"], E % g["ep"]
            r = g["rank"]
            e0, ne = r * base + min(r, rem), base + (1 if r < rem else 0)
            want = torch.full((E,), -1, dtype=torch.int32)
            want[e0:e0 + ne] = torch.arange(ne, dtype=torch.int32)
            if emap is None or emap.numel() < E or not torch.equal(emap[:E].cpu().to(torch.int32), want):
                raise RefitVllmError(
                    f"{it.name}: vLLM places experts {emap[:E].tolist() if emap is not None else None} on expert "
                    f"rank {r} (expert_placement_strategy={g['placement']}); refit's vllm layout places them "
                    f"linearly (experts {e0}..{e0 + ne - 1}); use expert_placement_strategy=\"linear\"")
            return  # every MoE layer shares the map

    def _summarize(self) -> Dict[str, dict]:
        out: Dict[str, dict] = {}
        for it in self.items:
            c = out.setdefault(it.path, {"tensors": 0, "bytes": 0})
            c["tensors"] += 1
            c["bytes"] += it.local.nbytes
        return out

    # -- memory and the post-pull step

    def attach(self, rx: Receiver):
        for r, mem in enumerate(self.regions):
            rx.attach(r, mem)

    @torch.no_grad()
    def apply(self) -> Dict[str, float]:
        """After a complete pull: rebuild what vLLM derives from the loader's tensors.  Returns ms per class."""
        ms: Dict[str, float] = {}
        seen = set()
        for it in self.items:
            t = time.perf_counter()
            if it.path == "linear-cpu":
                self._linear_cpu(it)
            elif it.path == "moe-cpu":
                if id(it.module) in seen:
                    continue
                seen.add(id(it.module))
                self._moe_cpu(it.module, it.name.rpartition(".")[0])
            elif it.path == "embedding" and self.platform == "cpu":
                # embed_tokens and lm_head (tied or not): every module holding this parameter rebuilds its matmul
                # handler from it (vLLM's UnquantizedEmbeddingMethod.process_weights_after_loading on the CPU).
                for mod in self._holders(it.param):
                    mod.quant_method.process_weights_after_loading(mod)
            else:
                continue
            ms[it.path] = ms.get(it.path, 0.0) + (time.perf_counter() - t) * 1e3
        return ms

    def _holders(self, param):
        return [mod for mod in self.model.modules()
                if any(p is param for p in mod._parameters.values()) and getattr(mod, "quant_method", None)]

    def _linear_cpu(self, it: _Item):
        """vLLM's CPU linear: the loader's weight goes into a oneDNN / sgl-kernel handle and the parameter becomes
        empty.  Run exactly that on the staged weight, then put the original (empty) Parameter object back so that
        the module keeps its weight_loader for vLLM's own reloads."""
        mod, orig = it.module, it.module.weight
        w = self.staged_views[it.name]
        if w.dtype != orig.dtype:
            w = w.to(orig.dtype)
        mod.register_parameter("weight", torch.nn.Parameter(w, requires_grad=False))
        try:
            mod.quant_method.process_weights_after_loading(mod)
        finally:
            mod.register_parameter("weight", orig)

    def _moe_cpu(self, layer, prefix: str):
        """vLLM's CPU MoE: after loading, the experts kernel pads and prepacks w13/w2.  Run the kernel's own step
        on a stand-in layer holding the staged tensors and copy its result into the live storage."""
        kernel = layer.quant_method.moe_kernel.fused_experts
        mc = getattr(kernel, "moe_config", None)
        if (type(kernel).__name__ in _CPU_MOE_KERNELS and getattr(kernel, "_use_zentorch", True) is False
                and mc is not None and kernel._padded_intermediate_size(mc) == mc.intermediate_size_per_partition
                and hasattr(torch.ops._C, "prepack_moe_weight")):
            # What that step amounts to without padding: vLLM's prepack op, straight into the live storage.
            for a in ("w13_weight", "w2_weight"):
                torch.ops._C.prepack_moe_weight(self.staged_views[f"{prefix}.{a}"], getattr(layer, a).data, kernel.isa)
            return
        proxy = torch.nn.Module()
        for a in ("moe_config", "activation"):
            if hasattr(layer, a):
                object.__setattr__(proxy, a, getattr(layer, a))
        proxy.register_parameter("w13_weight", torch.nn.Parameter(self.staged_views[prefix + ".w13_weight"],
                                                                 requires_grad=False))
        proxy.register_parameter("w2_weight", torch.nn.Parameter(self.staged_views[prefix + ".w2_weight"],
                                                                requires_grad=False))
        kernel.process_weights_after_loading(proxy)
        for a in ("w13_weight", "w2_weight"):
            new, live = getattr(proxy, a), getattr(layer, a)
            if new.shape != live.shape or new.dtype != live.dtype:
                raise RefitVllmError(f"{prefix}.{a}: the CPU MoE prepacking gave {new.dtype} {list(new.shape)}, the "
                                     f"live parameter is {live.dtype} {list(live.shape)}")
            if new.data_ptr() != live.data_ptr():
                live.data.copy_(new)


# ---------------------------------------------------------------- the engine


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


def realign_worker_replies(llm, timeout_s: float = 60.0) -> int:
    """Workaround for vLLM 0.32's multiprocess executor: when a collective_rpc fails on one worker, the executor
    raises at the first error reply and leaves the later workers' replies unread, so every later collective_rpc
    returns those workers' replies one call late (docs/vllm.md; tests/python/test_vllm.py shows it).  This sends a
    marker to every worker and discards each reply queue's entries up to the marker's reply.  Needs the engine core
    in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); returns the number of stale replies dropped."""
    import pickle
    import uuid

    import cloudpickle
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
    mqs = getattr(executor, "response_mqs", None)
    if mqs is None or getattr(executor, "rpc_broadcast_mq", None) is None:
        raise RefitVllmError("realign_worker_replies needs vLLM's multiprocess executor in this process "
                             "(VLLM_ENABLE_V1_MULTIPROCESSING=0 and tensor_parallel_size > 1)")
    token = uuid.uuid4().hex
    executor.rpc_broadcast_mq.enqueue((cloudpickle.dumps(_marker, protocol=pickle.HIGHEST_PROTOCOL), (token,), {},
                                       None))
    dropped = 0
    for mq in mqs:
        while True:
            _status, result = mq.dequeue(timeout=timeout_s)
            if result == token:
                break
            dropped += 1
    return dropped


def _marker(worker, token):
    return token



class RefitWeightTransferEngine(WeightTransferEngine[RefitInitInfo, RefitUpdateInfo]):
    """The `refit` weight-transfer backend of vLLM: one refit Receiver per worker (see the module docstring)."""

    init_info_cls = RefitInitInfo
    update_info_cls = RefitUpdateInfo
    supports_draft_weight_update = False  # the layout is the main model's

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.binding: Optional[VllmBinding] = None
        self.rx: Optional[Receiver] = None
        self.info: Optional[RefitInitInfo] = None
        self.report: dict = {}
        self.reports: List[dict] = []
        self._session: Optional[dict] = None

    def init_transfer_engine(self, init_info: RefitInitInfo) -> None:
        if self.rx is not None:
            self.shutdown()
        b = VllmBinding(self.model, self.vllm_config, init_info.model)
        dev = self.device.index if getattr(self.device, "type", "cpu") == "cuda" else -1
        if dev is None:
            dev = 0
        rx = Receiver(b.manifest, registry=init_info.registry, job=init_info.job, group=init_info.group,
                      transports=init_info.transports, transport_options=init_info.transport_options,
                      device=dev)
        b.attach(rx)
        self.binding, self.rx, self.info = b, rx, init_info
        self.init_report = {"layout": b.layout_str, "rank": b.geometry["rank"], "model": b.rmodel.name,
                            "names": b.names, "platform": b.platform, "classes": b.classes,
                            "moe_backend": sorted({_moe_backend(it.module) for it in b.items
                                                   if hasattr(it.module, "global_num_experts")}),
                            "regions": len(b.regions), "staging_bytes": b.staging.numel(), "init_ms": b.init_ms}
        logger.info("refit: worker rank %d is %s rank %d of %s; expert names: %s; paths: %s",
                    b.geometry["rank"], b.layout_str, b.geometry["rank"], b.rmodel.name, b.names or "none (dense)",
                    {k: v["tensors"] for k, v in b.classes.items()})

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
        self._session = {"start": time.perf_counter(), "updates": []}

    def receive_weights(self, update_info: RefitUpdateInfo) -> None:
        self._need()
        want = None if update_info.version == "newest" else update_info.version
        g = self.binding.geometry
        t0 = time.perf_counter()
        rep, err = None, None
        try:
            rep = self.rx.pull(want, self.info.timeout_ms)
        except RefitError as e:
            after = ("nothing was written" if self.rx.usable else
                     "the transfer had begun: parameters written in place (the direct ones) may hold a mix of "
                     "versions until an update succeeds")
            err = (e.status, f"worker rank {g['rank']}: {e.detail}; {after}")
        # Every worker of the model learns every worker's outcome before any applies: no worker runs a version
        # that another failed to pull, and every worker raises the same error.
        outcomes = _agree(err)
        failed = [o for o in outcomes if o is not None]
        if failed:
            mine = "" if err is not None else (
                f" (worker rank {g['rank']} pulled version {rep.version}; its staged layers were not rebuilt and its "
                "direct parameters hold that version until an update succeeds)")
            raise RefitVllmError(f"update to version {update_info.version} failed ({self.binding.layout_str}, job "
                                 f"{self.info.job}, group {self.info.group}): " + " | ".join(m for _, m in failed)
                                 + mine + "; staged layers keep the previous version",
                                 "update_weights", failed[0][0])
        t1 = time.perf_counter()
        apply_ms = self.binding.apply()
        t2 = time.perf_counter()
        rec = {"version": rep.version, "bytes": rep.bytes, "sources": rep.sources, "transport": rep.transport,
               "planned": rep.planned, "wait_ms": rep.wait_ms, "discover_ms": rep.discover_ms, "plan_ms": rep.plan_ms,
               "transfer_ms": rep.transfer_ms, "verify_ms": rep.verify_ms, "pull_ms": (t1 - t0) * 1e3,
               "apply_ms": apply_ms,
               "apply_total_ms": (t2 - t1) * 1e3}
        if self._session is not None:
            self._session["updates"].append(rec)
        self.report = rec

    def finish_weight_update(self) -> None:
        self._need()
        if self._session is None:
            return
        s, self._session = self._session, None
        s["total_ms"] = (time.perf_counter() - s.pop("start")) * 1e3
        self.report = dict(self.report, session_ms=s["total_ms"])
        self.reports.append(s)
        logger.info("refit: update done on rank %d: %s", self.binding.geometry["rank"], json.dumps(self.report))

    def shutdown(self) -> None:
        if self.rx is not None:
            self.rx.close()
        self.rx = None
