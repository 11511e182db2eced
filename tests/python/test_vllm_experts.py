"""Expert placements other than the vllm layout's linear one (refit.vllm.experts): round robin and EPLB's
replicated, rebalanced experts.  No engine: the live layer is a stand-in carrying the attributes vLLM 0.32's
MoE layer has (global_num_experts, local_num_experts, expert_map, and an EPLB view with logical_to_physical_map),
written from vLLM's source (docs/vllm.md says which parts ran in a real engine).

The bytes are checked against a receiver that needs no remapping: for every slot of the remapped receiver, its
bytes must equal the bytes of the same logical expert in a linear vllm receiver that holds that expert, both
planned and executed from the same Megatron publishers' truth.  The linear receivers' manifests come from the C
layout alone, so a wrong slot, expert or offset in the remap cannot pass."""
import numpy as np
import pytest
import torch

import refit
from refit.vllm import experts as X
from refit.vllm.errors import RefitVllmError

MODEL = "tiny-moe"  # 8 experts, 2 MoE layers


class View:
    def __init__(self, l2p):
        self.logical_to_physical_map = torch.tensor(l2p, dtype=torch.int64)


class Router:
    def __init__(self, view):
        self.eplb_state = view


class Layer:
    """What refit reads of vLLM's MoE layer (expert_map_manager.py, eplb_state.py EplbLayerState)."""

    def __init__(self, n_phys, n_local, emap, l2p=None):
        self.global_num_experts, self.local_num_experts = n_phys, n_local
        self.expert_map = None if emap is None else torch.tensor(emap, dtype=torch.int32)
        self.router = Router(View(l2p)) if l2p is not None else None


def emap_for(phys_on_rank, n_phys):
    m = [-1] * n_phys
    for s, p in enumerate(phys_on_rank):
        m[p] = s
    return m


def publishers(step):
    model = refit.Model(MODEL)
    lay = refit.Layout("megatron:tp=2,ep=2,etp=1")
    srcs = [lay.manifest(model, r) for r in range(lay.world)]
    mem = [[np.zeros(s.regions()[0], np.uint8)] for s in srcs]
    for s, mm in zip(srcs, mem):
        s.truth_fill(mm, step)
    return model, srcs, mem


def build(scheme, ident):
    """A manifest (one region) from a scheme's canonical / locals / placements, as VllmBinding._build_manifest."""
    m = refit.Manifest.build(MODEL, ident, 0, 1)
    off, offs = 0, {}
    for l in scheme.locals():
        offs[l.name] = off
        off += -(-l.nbytes // 64) * 64
    m.add_region(max(off, 64))
    for l in scheme.locals():
        m.add_local(l.name, l.dtype, l.shape, 0, offs[l.name])
    for c in scheme.canonical():
        m.add_canonical(c.name, c.dtype, c.shape)
    for p in scheme.placements():
        m.add_placement(p.canonical, p.local, p.canon_offset, p.extent, p.local_offset)
    return m.finalize()


def pull(srcs, mem, dst):
    plan = refit.Plan(srcs, dst)
    st = plan.stats()
    out = [np.zeros(dst.regions()[0], np.uint8)]
    plan.execute(mem, out)
    return out, st


def slot_bytes(man, out, name, slot):
    v = man.views(out)[name]
    return v[slot].tobytes()


@pytest.mark.parametrize("case", ["round_robin", "eplb"])
def test_remapped_slots_hold_their_logical_experts(case):
    model, srcs, mem = publishers(7)
    E, ep, tp = 8, 2, 2
    lay = refit.Layout(f"vllm:tp={tp},ep={ep}")
    linear = {r: lay.manifest(model, r) for r in range(ep)}
    lin_out = {r: pull(srcs, mem, linear[r])[0] for r in range(ep)}
    for rank in range(ep):
        if case == "round_robin":
            n_phys, phys = E, [p for p in range(E) if p % ep == rank]
            layers = {0: Layer(n_phys, len(phys), emap_for(phys, n_phys)),
                      1: Layer(n_phys, len(phys), emap_for(phys, n_phys))}
        else:  # 2 redundant experts: 10 physical, 5 a rank; layer 1 rebalanced differently from layer 0
            n_phys = E + 2
            p2l = {0: [0, 1, 2, 3, 4, 5, 6, 7, 0, 1], 1: [7, 6, 5, 4, 3, 2, 1, 0, 3, 3]}
            phys = list(range(rank * 5, rank * 5 + 5))
            layers = {}
            for li, m in p2l.items():
                l2p = [[p for p, e in enumerate(m) if e == lg] + [-1] * 3 for lg in range(E)]
                layers[li] = Layer(n_phys, 5, emap_for(phys, n_phys), [row[:3] for row in l2p])
        slots = {}
        for li, layer in layers.items():
            got = X.layer_slots(layer, E, f"layer {li}")
            slots[f"model.layers.{li}.mlp.experts"] = got
        if case == "round_robin":
            assert slots["model.layers.0.mlp.experts"] == [p for p in range(E) if p % ep == rank]
        else:
            assert slots["model.layers.1.mlp.experts"] == [p2l[1][p] for p in phys]
        assert not X.is_linear(slots, E, ep, rank)
        sch = X.remap(linear[rank], lambda r: linear[r], slots, E, ep, f"rank {rank}")
        dst = build(sch, f"vllm-remapped:{case}")
        out, st = pull(srcs, mem, dst)
        assert st.bytes_redundant == 0 and st.bytes_written == st.bytes_read
        n_slots = len(next(iter(slots.values())))
        # every byte of every expert tensor equals the linear holder's bytes of the slot's logical expert
        for li in layers:
            for w in ("w13_weight", "w2_weight"):
                name = f"model.layers.{li}.mlp.experts.{w}"
                for s, e in enumerate(slots[f"model.layers.{li}.mlp.experts"]):
                    r, s0 = X.holder(e, E, ep)
                    assert slot_bytes(dst, out, name, s) == slot_bytes(linear[r], lin_out[r], name, s0), (name, s, e)
                assert dst.views(out)[name].shape[0] == n_slots
        # the tensors that are not experts are the linear receiver's own
        for l in linear[rank].locals():
            if ".experts." not in l.name:
                assert dst.views(out)[l.name].tobytes() == linear[rank].views(lin_out[rank])[l.name].tobytes()
        # and a replica really is a copy: both physical replicas of logical expert 0 (layer 0 of the eplb case)
        if case == "eplb" and rank == 1:
            own = slots["model.layers.0.mlp.experts"]
            assert own == [5, 6, 7, 0, 1]
            name = "model.layers.0.mlp.experts.w13_weight"
            assert slot_bytes(dst, out, name, 3) == slot_bytes(linear[0], lin_out[0], name, 0)


def test_linear_is_recognised():
    E, ep = 8, 2
    for rank in range(ep):
        phys = X.linear_slots(E, ep, rank)
        layer = Layer(E, len(phys), emap_for(phys, E))
        assert X.is_linear({"m": X.layer_slots(layer, E, "l")}, E, ep, rank)
    assert [X.holder(e, 7, 3) for e in range(7)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert X.linear_slots(7, 3, 0) == [0, 1, 2] and X.linear_slots(7, 3, 2) == [5, 6]


def test_bad_maps_are_named():
    E = 8
    with pytest.raises(RefitVllmError, match="redundant"):
        X.layer_slots(Layer(10, 5, emap_for(range(5), 10)), E, "layer 0")  # replicas but no EPLB map
    with pytest.raises(RefitVllmError, match="physical expert 2 to logical experts 1 and 3"):
        X.physical_to_logical([[0], [1, 2], [3], [2]], 4, "layer 0")
    with pytest.raises(RefitVllmError, match="without a logical expert"):
        X.physical_to_logical([[0], [1], [-1]], 4, "layer 0")
    with pytest.raises(RefitVllmError, match="slots \\[1\\] empty"):
        X.layer_slots(Layer(4, 2, [0, -1, -1, -1]), 4, "layer 0")


class State:
    def __init__(self, **kw):
        self.model_states = {"m": type("MS", (), kw)()}


def test_rebalance_in_flight_is_seen():
    assert X.rebalance_in_flight([]) is None
    assert X.rebalance_in_flight([State(rebalanced=False, pending_result=None)]) is None
    assert "rebalancing" in X.rebalance_in_flight([State(rebalanced=True, pending_result=None)])
    assert "not committed" in X.rebalance_in_flight([State(rebalanced=False, pending_result=object())])
