"""The binding: a live vLLM model described as a refit receiver of its worker's vllm layout -- the manifest, the
memory of each region, and the step that runs after a pull (postload.apply).

The model is the target (the model runner's model) or a speculative draft model (draft_target below): a DeepSeek
MTP draft is the layout's draft=mtp part of the same model; a draft model of method "draft_model" is a model of its
own with the plain layout.  A draft's parameters that are the target's own objects (vLLM shares the target's
embedding and lm_head with an MTP draft) are the target's: left to the target's binding.

Region 0 is a staging arena holding the loader's layout of the staged tensors; every direct tensor is a region of
its own whose memory is the live parameter's storage (no parameter is moved or re-allocated: the storage vLLM
captured stays the storage)."""
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ..adapters import ALIGN, AdapterError
from ..core import Layout, Manifest, Receiver, torch_dtype
from . import derived, experts, postload
from .classify import STAGED, classify
from .errors import RefitVllmError
from .geometry import detect_names, platform_name, refit_model, vocab_pad, worker_geometry


@dataclass
class Item:
    """One local tensor of the layout: its live parameter, owning module and path."""
    name: str
    local: object  # core.Local of the scheme's manifest
    module: object
    attr: str
    param: object
    path: str


def _refuse_unsupported(model, vllm_config, mc):
    """What no path of refit's handles, refused before anything is built, naming it (mc: the model's config)."""
    if getattr(mc, "quantization", None):
        raise RefitVllmError(f"quantization={mc.quantization!r} is not supported (refit moves unquantized "
                             "weights; a quantized model repacks and rescales after loading)")
    if getattr(vllm_config, "lora_config", None) is not None:
        raise RefitVllmError("LoRA is enabled: its wrapped layers are not supported; run without enable_lora")
    if "process_weights_after_loading" in type(model).__dict__:
        raise RefitVllmError(f"{type(model).__name__} has a model-level process_weights_after_loading hook "
                             "that refit does not run")


class VllmBinding:
    """A live vLLM model described as a refit receiver of its worker's vllm layout: manifest, memory, apply step
    (see the module docstring for the regions)."""

    def __init__(self, model, vllm_config, identity: Optional[str] = None, stage_all: bool = False,
                 staging_budget: Optional[int] = None, staging_hugepages: bool = False, model_config=None,
                 draft: Optional[str] = None, target=None):
        """draft: None (the target model), "mtp" (vLLM's DeepSeek MTP draft: layout draft=mtp) or "model" (a draft
        model of its own: the plain layout of its model_config); target: the target model whose parameters a
        draft shares (those are left out)."""
        t0 = time.perf_counter()
        self.stage_all = stage_all  # two-phase (refit.vllm.inflight): every tensor goes to the arena
        self._want_huge = staging_hugepages
        self.model, self.vllm_config = model, vllm_config
        self.model_config = model_config or vllm_config.model_config
        self.draft = draft
        _refuse_unsupported(model, vllm_config, self.model_config)
        self.platform = platform_name()
        if self.platform not in ("cpu", "cuda"):
            raise RefitVllmError(f"platform {self.platform} is not supported (refit handles cpu and cuda)")
        self.geometry = g = worker_geometry(vllm_config)
        self.mla = derived.find_mla(model, self.platform)  # layers whose W_UK_T / W_UV vLLM derives (derived.py)
        params = dict(model.named_parameters())
        self.shared = []  # a draft's parameters that are the target's objects: refitted with the target
        if target is not None:
            theirs = {id(p) for p in target.parameters()}
            self.shared = sorted(n for n, p in params.items() if id(p) in theirs)
        self.derived = derived.derived_names(self.mla, params)  # not checkpoint tensors: recomputed after a pull
        for n in self.derived:
            del params[n]
        self.names = detect_names(params)
        self.rmodel = refit_model(self.model_config, identity)
        pad = vocab_pad(params, self.rmodel, g["tp"])
        for n in self.shared:
            del params[n]
        spec = (f"vllm:tp={g['tp']},ep={g['ep']},dp={g['dp']},pad={pad}"
                + (",names=routed" if self.names == "routed" else "") + (",draft=mtp" if draft == "mtp" else ""))
        self.layout = Layout(spec)
        scheme = self.layout.manifest(self.rmodel, g["rank"])
        self.layout_str = scheme.identity["layout"]
        self.buffers = self._check_buffers(scheme.locals())
        self.eplb = experts.find_eplb_states(g["eplb"])
        self.expert_slots = self.live_expert_slots(scheme.locals())
        self.experts_remapped = bool(self.expert_slots) and not experts.is_linear(
            self.expert_slots, self._num_experts, g["ep"], g["rank"])
        if self.experts_remapped:  # round robin or EPLB: each slot gets its logical expert's placements
            scheme = experts.remap(scheme, lambda r: self.layout.manifest(self.rmodel, r), self.expert_slots,
                                   self._num_experts, g["ep"], f"{self.layout_str} rank {g['rank']}")
        self.items = self._match(scheme.locals(), params)
        self.stage_need = None
        if stage_all:  # refused before the arena is allocated when the budget cannot hold it
            from .inflight import check_budget, need_bytes
            arena = sum(-(-it.local.nbytes // ALIGN) * ALIGN for it in self.items)
            self.stage_need = need_bytes(self.items, model, self.platform, arena)
            check_budget(self.stage_need, staging_budget, f"{self.layout_str} rank {g['rank']}")
        self.device = next(iter(params.values())).device
        self._build_manifest(scheme)
        self.classes = self._summarize()
        self.init_ms = (time.perf_counter() - t0) * 1e3

    def _match(self, locs, params) -> List[Item]:
        """The scheme's local tensors matched to vLLM's parameters by name, classified, their shapes checked; every
        difference raised at once (AdapterError)."""
        g, model = self.geometry, self.model
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
            item = Item(l.name, l, module, attr, params[l.name], classify(l.name, module, self.platform))
            mismatched += self._check_shape(item)
            items.append(item)
        if mismatched:
            raise AdapterError(f"{self.layout_str} rank {g['rank']} of {self.rmodel.name}", [], [], mismatched)
        return items

    def _build_manifest(self, scheme):
        """The receiver's manifest: the scheme's local tensors and placements, in other regions (the staging arena,
        then one region per direct tensor; with stage_all the arena holds every tensor and no live parameter is a
        region); sets manifest, staging, regions and staged_views."""
        g = self.geometry
        staged = [it for it in self.items if it.path in STAGED or self.stage_all]
        direct = [it for it in self.items if it not in staged]
        m = Manifest.build(self.rmodel.name, self.layout_str, g["rank"], self.layout.world)
        offsets, off = {}, 0
        for it in staged:
            offsets[it.name] = off
            off += -(-it.local.nbytes // ALIGN) * ALIGN
        m.add_region(max(off, ALIGN))
        self.staging_hugepages = False
        if self.stage_all and self.device.type == "cpu":  # host memory beside the live weights; on the CPU in
            from .inflight import host_buffer  # transparent huge pages with staging_hugepages=True (docs/vllm.md)
            self.staging_hugepages = self._want_huge
            self.staging = host_buffer(max(off, ALIGN), self._want_huge)
        elif self.stage_all:  # pinned for a device copy on CUDA
            self.staging = torch.zeros(max(off, ALIGN), dtype=torch.uint8, pin_memory=True)
        else:
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

    # -- checks

    def _check_shape(self, it: Item) -> List[str]:
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

    def _check_buffers(self, locs) -> dict:
        """Non-parameter tensors: refit moves parameters, so a checkpoint tensor that vLLM holds as a buffer would
        be skipped silently (the "all-zero routing table" failure).  Every live buffer is compared by name with
        the layout's local tensors and the model's canonical tensors (refit's model spec: the checkpoint's names,
        less what the spec leaves out, such as MTP layers), exactly, by the part from "layers." on, and without a
        leading "model."; a match is refused by name.  Returns the proof: how many buffers were checked and their
        names (all derived from the config or the weights, none a canonical tensor)."""
        def key(n):
            i = n.find("layers.")
            return n[i:] if i >= 0 else (n[len("model."):] if n.startswith("model.") else n)
        bufs = [n for n, _ in self.model.named_buffers()]
        ckpt = {t.name for t in self.rmodel.tensors()} | {l.name for l in locs}
        keys = {key(n) for n in ckpt}
        hit = sorted(n for n in bufs if n in ckpt or key(n) in keys)
        if hit:
            raise RefitVllmError(f"{', '.join(hit)}: vLLM holds these as buffers, but the checkpoint (or the "
                                 f"{self.layout_str} layout) carries them as tensors; refit moves parameters "
                                 "only and would leave them at the loaded version")
        return {"checked": len(bufs), "in_checkpoint": 0, "names": bufs}

    def live_expert_slots(self, locs) -> Dict[str, List[int]]:
        """The logical expert in each local slot of every live MoE layer (refit.vllm.experts.layer_slots: vLLM's
        expert map, and EPLB's logical -> physical map where there is one), by module name; {} without experts."""
        g = self.geometry
        out: Dict[str, List[int]] = {}
        self._num_experts = 0
        for l in locs:
            mod_name = l.name.rpartition(".")[0]
            if mod_name in out or len(l.shape) < 3:
                continue
            try:
                module = self.model.get_submodule(mod_name)
            except AttributeError:
                continue  # _match names what is missing
            if not hasattr(module, "global_num_experts"):
                continue
            layer = mod_name.split("layers.", 1)[1].split(".", 1)[0] if "layers." in mod_name else ""
            e = self._logical_experts(layer)
            if g["ep"] == 1 and getattr(module, "expert_map", None) is not None:
                raise RefitVllmError(f"{mod_name}: vLLM has an expert map without expert parallel")
            out[mod_name] = experts.layer_slots(module, e, f"{mod_name} (worker rank {g['rank']})")
            self._num_experts = e
        return out

    def _logical_experts(self, layer: str) -> int:
        """The number of logical experts of MoE layer `layer`, from the checkpoint's tensor names
        (model.layers.{layer}.mlp.experts.{e}....); counted once per binding (the model spec does not change, and
        walking its tensor list per layer took 2.8 ms of every commit's pause for a 4-layer model)."""
        cache = self.__dict__.setdefault("_logical_experts_of", {})
        if layer not in cache:
            pre = f"model.layers.{layer}.mlp.experts."
            ids = {t.name[len(pre):].split(".", 1)[0] for t in self.rmodel.tensors() if t.name.startswith(pre)}
            cache[layer] = len([i for i in ids if i.isdigit()])
        return cache[layer]

    def experts_busy(self) -> Optional[str]:
        """What says EPLB is rebalancing now (refit.vllm.experts.rebalance_in_flight), or None."""
        return experts.rebalance_in_flight(self.eplb)

    def experts_moved(self) -> Optional[str]:
        """Which MoE layers' live expert placement differs from the one this binding's plan was made for (EPLB
        moved experts since), or None: the plan still holds."""
        if not self.expert_slots or not self.eplb:  # only EPLB moves experts after loading
            return None
        now = self.live_expert_slots([it.local for it in self.items])
        moved = [m for m in now if now[m] != self.expert_slots.get(m)]
        if not moved:
            return None
        return f"the experts of {', '.join(moved[:3])}{' and others' if len(moved) > 3 else ''} moved"

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

    def apply(self) -> Dict[str, float]:
        """After a complete pull: rebuild what vLLM derives from the loader's tensors.  Returns ms per class."""
        ms = postload.apply(self.items, self.staged_views, self.model, self.platform)
        ms.update(derived.refresh(self.mla, self.model_config.dtype))  # after kv_b_proj is written
        return ms
