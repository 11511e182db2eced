"""Which expert each local expert slot of a vLLM worker holds, and the receiver's manifest for it.

The vllm layout places experts linearly: with expert parallel, rank r holds logical experts r*base + min(r, rem)
onwards in its slots 0, 1, ... (docs/layouts.md).  vLLM can place them otherwise:

- `expert_placement_strategy="round_robin"`: physical expert p on rank p mod ep (the layer's `expert_map`, global
  physical id -> local slot or -1, says where);
- EPLB (`enable_eplb=True`, CUDA/ROCm/XPU only): num_redundant_experts extra physical experts, each a replica of a
  logical one, and a physical -> logical map that the balancer rewrites at run time (vLLM's
  distributed/eplb/eplb_state.py: EplbModelState.physical_to_logical_map [layers, physical];
  each MoE layer's router keeps views of the logical -> physical map, EplbLayerState.logical_to_physical_map
  [logical, replicas] with -1 for none).

A slot's bytes are its logical expert's, whatever the placement.  `live_slots` reads, per MoE layer, the logical
expert of every local slot from the live layer; `remap` turns the linear scheme's manifests into the receiver's:
each slot gets the placements that the linear layout gives that logical expert on the rank that holds it, with
the slot index changed (placements fix a local tensor's leading dimension at local_offset[0]: the slot).  The
plans, coverage proof and digests then work as for any manifest.

Nothing here imports vLLM: the live objects are read by attribute, so the mapping is testable without an engine
(tests/python/test_vllm_experts.py).  What has run against a real engine: the linear and round-robin placements
through `expert_map` (vLLM's CPU engine has expert parallel); EPLB has not (vLLM 0.32 refuses enable_eplb on the
CPU: "Expert parallelism load balancing is only supported on CUDA devices or ROCm devices or XPU devices now").
"""
import gc
from typing import Callable, Dict, List, Optional, Sequence

from .errors import RefitVllmError


def linear_slots(num_experts: int, ep: int, rank: int) -> List[int]:
    """The vllm layout's experts of expert rank `rank`: r*base + min(r, rem) onwards."""
    base, rem = num_experts // ep, num_experts % ep
    e0 = rank * base + min(rank, rem)
    return list(range(e0, e0 + base + (1 if rank < rem else 0)))


def holder(expert: int, num_experts: int, ep: int):
    """(rank, slot) of a logical expert in the linear layout."""
    base, rem = num_experts // ep, num_experts % ep
    big = rem * (base + 1)  # the first rem ranks hold base + 1 experts
    if expert < big:
        return expert // (base + 1), expert % (base + 1)
    return rem + (expert - big) // base, (expert - big) % base


def _ints(t) -> List[int]:
    return [int(x) for x in (t.tolist() if hasattr(t, "tolist") else t)]


def _eplb_layer_state(module):
    """The layer's EPLB view (an EplbLayerState with logical_to_physical_map), or None: looked for on the module
    and on the MoE runner that owns it (vLLM 0.32 keeps it on the runner's router)."""
    for m in (module, getattr(module, "runner", None), getattr(module, "_runner", None)):
        if m is None:
            continue
        for path in (("router", "eplb_state"), ("eplb_state",)):
            o = m
            for a in path:
                o = getattr(o, a, None)
                if o is None:
                    break
            if o is not None and getattr(o, "logical_to_physical_map", None) is not None:
                return o
    return None


def physical_to_logical(logical_to_physical, num_physical: int, where: str) -> List[int]:
    """Inverts one layer's logical -> physical map ([logical][replica], -1 for none); every physical expert must be
    the replica of exactly one logical expert."""
    out = [-1] * num_physical
    for e, row in enumerate(logical_to_physical):
        for p in _ints(row):
            if p < 0:
                continue
            if p >= num_physical:
                raise RefitVllmError(f"{where}: EPLB's logical -> physical map gives logical expert {e} physical "
                                     f"expert {p}, of {num_physical}")
            if out[p] != -1:
                raise RefitVllmError(f"{where}: EPLB's logical -> physical map gives physical expert {p} to logical "
                                     f"experts {out[p]} and {e}")
            out[p] = e
    missing = [p for p, e in enumerate(out) if e < 0]
    if missing:
        raise RefitVllmError(f"{where}: EPLB's logical -> physical map leaves physical experts {missing[:8]} "
                             "without a logical expert")
    return out


def layer_slots(module, num_logical: int, where: str, eplb=None) -> List[int]:
    """The logical expert of each local slot of one live MoE layer.  `module` has global_num_experts,
    local_num_experts and expert_map (global physical id -> local slot, -1 elsewhere; None without expert
    parallel); `eplb` (or the layer's own EPLB view) gives the logical -> physical map when experts are
    replicated or rebalanced, else physical ids are logical ids."""
    n_phys = int(module.global_num_experts)
    n_local = int(module.local_num_experts)
    emap = getattr(module, "expert_map", None)
    if emap is None:
        phys = list(range(n_local))
        if n_local != n_phys:
            raise RefitVllmError(f"{where}: {n_local} local experts of {n_phys} without an expert map")
    else:
        em = _ints(emap)[:n_phys]
        phys = [-1] * n_local
        for p, s in enumerate(em):
            if s < 0:
                continue
            if s >= n_local:
                raise RefitVllmError(f"{where}: vLLM's expert map puts physical expert {p} in local slot {s} of "
                                     f"{n_local}")
            if phys[s] != -1:
                raise RefitVllmError(f"{where}: vLLM's expert map puts physical experts {phys[s]} and {p} in local "
                                     f"slot {s}")
            phys[s] = p
        if -1 in phys:
            empty = [s for s, p in enumerate(phys) if p < 0]
            raise RefitVllmError(f"{where}: vLLM's expert map leaves local slots {empty} empty")
    st = eplb if eplb is not None else _eplb_layer_state(module)
    if st is not None:
        p2l = physical_to_logical(st.logical_to_physical_map, n_phys, where)
    elif n_phys != num_logical:
        raise RefitVllmError(f"{where}: {n_phys} physical experts for {num_logical} logical ones (redundant "
                             "experts) but no EPLB map to say which logical expert each replicates")
    else:
        p2l = list(range(n_phys))
    slots = [p2l[p] for p in phys]
    bad = [e for e in slots if not 0 <= e < num_logical]
    if bad:
        raise RefitVllmError(f"{where}: local slots hold logical experts {bad} outside 0..{num_logical - 1}")
    return slots


class RemappedScheme:
    """The linear scheme's manifest of one rank with its expert tensors' slots reassigned: canonical(), locals()
    and placements() as core.Manifest gives them (VllmBinding._build_manifest reads these three)."""

    def __init__(self, canonical, locals_, placements):
        self._c, self._l, self._p = canonical, locals_, placements

    def canonical(self):
        return list(self._c)

    def locals(self):
        return list(self._l)

    def placements(self):
        return list(self._p)


def remap(base, scheme_of_rank: Callable[[int], object], slots: Dict[str, List[int]], num_experts: int, ep: int,
          where: str) -> RemappedScheme:
    """The receiver's scheme when its local expert slots hold `slots[module]` (logical expert per slot) instead of
    the linear layout's.  `base` is this rank's linear manifest, `scheme_of_rank(r)` the linear manifest of expert
    rank r (with ep == 1 every rank holds every expert: rank 0's slots are the experts).  Every expert tensor of a
    remapped module (local tensors under the module, with a leading slot dimension) gets, for slot s holding
    logical e, the placements of e's slot on its linear holder, local_offset[0] = s."""
    from ..core import Local, Placement
    by_rank: Dict[int, dict] = {}

    def index(r):
        if r not in by_rank:
            m = scheme_of_rank(r)
            idx: Dict[tuple, list] = {}
            for p in m.placements():
                idx.setdefault((p.local, p.local_offset[0] if p.local_offset else None), []).append(p)
            by_rank[r] = {"idx": idx, "canon": {c.name: c for c in m.canonical()}}
        return by_rank[r]

    def module_of(name):
        return name.rpartition(".")[0]

    expert_locals = [l for l in base.locals() if module_of(l.name) in slots and len(l.shape) >= 2]
    names = {l.name for l in expert_locals}
    canon = {c.name: c for c in base.canonical()}
    placements = [p for p in base.placements() if p.local not in names]
    locals_ = []
    for l in base.locals():
        if l.name not in names:
            locals_.append(l)
            continue
        sl = slots[module_of(l.name)]
        shape = (len(sl),) + tuple(l.shape[1:])
        nbytes = l.nbytes // l.shape[0] * len(sl) if l.shape[0] else 0
        locals_.append(Local(l.name, l.dtype, shape, l.region, l.offset, nbytes))
        for s, e in enumerate(sl):
            r, s0 = holder(e, num_experts, ep) if ep > 1 else (0, e)
            got = index(r)
            ps = got["idx"].get((l.name, s0), [])
            if not ps:
                raise RefitVllmError(f"{where}: {l.name} slot {s} holds logical expert {e}, which the linear layout "
                                     f"does not place at rank {r} slot {s0}")
            for p in ps:
                placements.append(Placement(p.canonical, p.local, p.canon_offset, p.extent,
                                            (s,) + tuple(p.local_offset[1:])))
                canon.setdefault(p.canonical, got["canon"][p.canonical])
    used = {p.canonical for p in placements}
    return RemappedScheme([c for n, c in canon.items() if n in used], locals_, placements)


def is_linear(slots: Dict[str, List[int]], num_experts: int, ep: int, rank: int) -> bool:
    want = linear_slots(num_experts, ep, rank) if ep > 1 else list(range(num_experts))
    return all(s == want for s in slots.values())


# ---------------------------------------------------------------- EPLB's own state


def find_eplb_states(expected: bool) -> list:
    """vLLM's EplbState objects in this process (the model runner's; the weight-transfer engine is given the model
    only, so they are found once among the live objects).  Empty when EPLB is off."""
    if not expected:
        return []
    try:
        from vllm.distributed.eplb.eplb_state import EplbState
    except Exception:  # noqa: BLE001 - an engine without EPLB
        return []
    return [o for o in gc.get_objects() if isinstance(o, EplbState)]


def rebalance_in_flight(states: Sequence) -> Optional[str]:
    """What says a rebalance is under way (vLLM 0.32's async EPLB: EplbModelState.rebalanced is set when new maps
    are computed and cleared once every weight is moved and the map committed; pending_result holds moved layers
    not yet committed), or None."""
    for st in states:
        for name, ms in getattr(st, "model_states", {}).items():
            if getattr(ms, "rebalanced", False):
                return f"EPLB is rebalancing the experts of {name} (new maps computed, weights still moving)"
            if getattr(ms, "pending_result", None) is not None:
                return f"EPLB has moved experts of {name} that it has not committed yet"
    return None
