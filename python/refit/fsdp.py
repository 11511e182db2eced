"""Publish a model sharded by torch's FSDP2 (fully_shard) from each rank's own shards, without a gather or a copy.

    binding = refit.fsdp.dtensor(model, refit.Model(checkpoint_dir))   # on every FSDP rank
    with refit.Publisher(binding.manifest, registry=..., job=...) as pub:
        binding.attach(pub)
        binding.publish(pub, 1)   # ... optimizer steps ...  binding.publish(pub, 2)  (= sync() + pub.publish)

What it reads: the live DTensor parameters (named_parameters() after fully_shard, and parallelize_module for
TP): their device mesh, placements, global and local shapes and dtype.  From them it names the `dtensor` layout
(docs/layouts.md: "dtensor:dp_shard=F,dp_replicate=R,tp=T,experts=fused|split") and this rank's place in it
(the mesh coordinate (r, f, t) -> rank t + T*(f + F*r)), has the library generate that rank's manifest, and
checks every parameter against it: the placements (Shard(0) / _StridedShard(0, split_factor=T) over dp_shard,
Replicate over dp_replicate, transformers' tp plan over tp), torch's own local shape and global offset
(torch.distributed.tensor._utils.compute_local_shape_and_global_offset) against the manifest's box, the dtype,
and the byte size of the parameter's storage against the manifest's padded local tensor.  Every difference is
collected and raised at once (AdapterError).

Memory: FSDP2 keeps each sharded parameter in its own padded 1-d buffer (FSDPParam._sharded_param_data, every
rank ceil(N/F) rows; the DTensor's local tensor is its first rows).  The binding makes each such buffer one
region of the manifest (one region per parameter, local tensor at offset 0), so the publisher reads the
parameters' own storage: no copy, no arena.  The optimizer updates that storage in place, and its address stays
the same across steps (checked in tests/python/test_fsdp.py); FSDP2 replaces it only in reset_sharded_param
(lazy init, model.to(), load_state_dict with new tensors): bind again after those.

More parameters than regions: a publisher holds at most REFIT_MAX_REGIONS (511) regions (include/refit/engine.h:
per buffer its regions, delta arenas, a digest table and a stamp make 2 * 511 + 2 = 1024, the most one shm
connection maps).  A rank with more parameters (Qwen3-30B-A3B: 531) keeps the largest 510 zero-copy and packs
the smallest rest (norms first) into one arena region of copies: binding.sync() refreshes those copies and must
run after each optimizer step, before publish; binding.publish(pub, version) does both.  `copied` names them.

Mixed precision: FSDP2's MixedPrecisionPolicy casts for the all-gather only; the sharded parameters stay in
their storage dtype, which is what is published.  A model whose sharded parameters are fp32 (fp32 master
weights) does not match a bf16 checkpoint and is refused with the names; publish a bf16 copy instead.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from .adapters import AdapterError, _named
from .core import Layout, Manifest, Model, _dtype_name_of

MAX_REGIONS = 511


@dataclass
class FsdpBinding:
    """The rank's manifest (one region per parameter) and the parameters' storage as uint8 tensors, region by
    region.  layout: the dtensor layout string; rank: this process's rank in it."""
    manifest: Manifest
    regions: List[object]
    layout: str
    rank: int
    params: Dict[str, object] = field(default_factory=dict)
    copied: List[str] = field(default_factory=list)
    region_of: Dict[str, int] = field(default_factory=dict)
    _pack: List[Tuple[object, object]] = field(default_factory=list)

    def sync(self) -> int:
        """Copies the packed parameters' shards into their arena (none when every parameter has its own region);
        returns the bytes copied.  Run after the optimizer step, before publish."""
        n = 0
        for src, dst in self._pack:
            dst.copy_(src)
            n += dst.numel()
        return n

    def publish(self, endpoint, version: int):
        self.sync()
        endpoint.publish(version)

    def attach(self, endpoint):
        for i, mem in enumerate(self.regions):
            endpoint.attach(i, mem)
        return endpoint

    def addresses(self) -> Dict[str, int]:
        """Each parameter's storage address (to check that it did not move)."""
        return {n: p._local_tensor.untyped_storage().data_ptr() for n, p in self.params.items()}


def _kind(pl):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    if isinstance(pl, _StridedShard):
        return ("strided", pl.dim, pl.split_factor)
    if isinstance(pl, Shard):
        return ("shard", pl.dim, 1)
    if isinstance(pl, Replicate):
        return ("replicate", None, 1)
    return ("other", str(pl), 1)


def mesh_geometry(params: Dict[str, object]) -> Tuple[int, int, int, Tuple[int, ...]]:
    """(dp_replicate, dp_shard, tp, coordinate (r, f, t)) of the parameters' common mesh, from their placements:
    1-d (Shard(0)): FSDP; 2-d (Replicate, Shard(0)): HSDP; 2-d (Shard(0)|_StridedShard(0), tp): FSDP over TP;
    3-d (Replicate, Shard(0)|_StridedShard(0), tp): HSDP over TP.  Anything else raises AdapterError naming it."""
    from torch.distributed.tensor import DTensor
    bad, meshes = [], {}
    hsdp = None
    for n, p in params.items():
        if not isinstance(p, DTensor):
            bad.append(f"{n}: a {type(p).__name__}, not a DTensor (is the model wrapped with fully_shard?)")
            continue
        kinds = [_kind(x) for x in p.placements]
        nd = len(kinds)
        meshes.setdefault(nd, {})[tuple(p.device_mesh.mesh.flatten().tolist())] = p
        if nd == 1:
            ok = kinds[0][:2] == ("shard", 0)
        elif nd == 2:
            ok = kinds[0][0] == "replicate" and kinds[1][:2] == ("shard", 0) or \
                kinds[0][0] in ("shard", "strided") and kinds[0][1] == 0
        elif nd == 3:
            ok = kinds[0][0] == "replicate" and kinds[1][0] in ("shard", "strided") and kinds[1][1] == 0
        else:
            ok = False
        if nd == 2 and ok:  # (Replicate, Shard(0)) is HSDP, (Shard|_StridedShard, tp) FSDP over TP: never both
            h = kinds[0][0] == "replicate"
            if hsdp is not None and h != hsdp:
                bad.append(f"{n}: placements {tuple(p.placements)} mix HSDP and FSDP-over-TP 2-d meshes")
            hsdp = h
        if not ok:
            bad.append(f"{n}: placements {tuple(p.placements)} over a {nd}-d mesh are not FSDP2's (Shard(0)), "
                       "HSDP's (Replicate, Shard(0)) or FSDP2 over TP (Shard(0)|_StridedShard(0), tp) "
                       "- refit's dtensor layout cannot say them")
    if bad:
        raise AdapterError("dtensor parameters", [], [], bad)
    # FSDP2 over TP: parameters that TP does not shard stay plain until fully_shard, which puts them on the
    # data-parallel mesh alone (_fsdp_param.py _init_sharding_spec_plain) - one dimension fewer, replicated
    # over tp.  Those must be this rank's data-parallel slice of the full mesh.
    top = max(meshes)
    if len(meshes[top]) != 1:
        bad.append(f"the parameters of {top}-d placements live on {len(meshes[top])} different device meshes")
    p0 = next(iter(meshes[top].values()))
    mesh, coord = p0.device_mesh, tuple(p0.device_mesh.get_coordinate())
    shape = tuple(mesh.mesh.shape)
    tp_dim = len(shape) == 3 or (len(shape) == 2 and hsdp is False)
    for nd, ms in meshes.items():
        if nd == top:
            continue
        want = mesh.mesh[..., coord[-1]].flatten().tolist() if tp_dim and nd == top - 1 else None
        for ranks, p in ms.items():
            if list(ranks) != want:
                bad.append(f"a parameter ({next(n for n, q in params.items() if q is p)}) lives on mesh {list(ranks)},"
                           f" not on the data-parallel slice {want} of the {top}-d mesh {mesh.mesh.tolist()}")
    if bad:
        raise AdapterError("dtensor parameters", [], [], bad)
    if len(shape) == 1:
        return 1, shape[0], 1, (0, coord[0], 0)
    if len(shape) == 2 and not tp_dim:
        return shape[0], shape[1], 1, (coord[0], coord[1], 0)
    if len(shape) == 2:
        return 1, shape[0], shape[1], (0, coord[0], coord[1])
    return shape[0], shape[1], shape[2], coord


def _box_check(n, p, pls, out):
    """Compares torch's local shape / global offset of a non-fused parameter with the manifest's placement."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, off = compute_local_shape_and_global_offset(tuple(p.shape), p.device_mesh, p.placements)
    shape, off = tuple(int(x) for x in shape), tuple(int(x) for x in off)
    if shape != tuple(p.to_local().shape):
        out.append(f"{n}: torch's local shape {shape} is not the local tensor's {tuple(p.to_local().shape)}")
    if shape[0] == 0:
        if pls:
            out.append(f"{n}: torch gives this rank no rows, the layout places {len(pls)} boxes")
        return
    if len(pls) != 1:
        out.append(f"{n}: the layout places {len(pls)} boxes on this rank, torch holds rows {off[0]}..")
        return
    pl = pls[0]
    if pl.canonical != n or tuple(pl.canon_offset) != off or tuple(pl.extent) != shape:
        out.append(f"{n}: torch holds offset {off} extent {shape}, the layout {pl.canonical} "
                   f"{tuple(pl.canon_offset)} extent {tuple(pl.extent)}")


def dtensor(model, rmodel: Model, *, experts: str = "fused", strip=("module.", "_orig_mod."),
            max_regions: int = MAX_REGIONS) -> FsdpBinding:
    """Binds an FSDP2-wrapped transformers model's local shards on this rank (see the module docstring).
    max_regions (at most MAX_REGIONS): above it, the smallest parameters are packed into one copied region."""
    import torch
    params = _named(model.named_parameters(), strip)
    rep, shard, tp, (r, f, t) = mesh_geometry(params)
    layout = f"dtensor:dp_shard={shard},dp_replicate={rep},tp={tp},experts={experts}"
    rank = t + tp * (f + shard * r)
    lay = Layout(layout)
    ref = lay.manifest(rmodel, rank)
    locs = {l.name: l for l in ref.locals()}
    by_local: Dict[str, list] = {}
    for pl in ref.placements():
        by_local.setdefault(pl.local, []).append(pl)
    missing = [n for n in locs if n not in params]
    unexpected = [n for n in params if n not in locs]
    mismatched: List[str] = []
    for n, l in locs.items():
        p = params.get(n)
        if p is None:
            continue
        lt = p._local_tensor
        dt = _dtype_name_of(lt.dtype)  # what is published: the sharded storage
        st = lt.untyped_storage()
        if dt != l.dtype:
            mismatched.append(f"{n}: {dt}, {layout} rank {rank} has {l.dtype} (the sharded storage dtype is "
                              "what FSDP2 keeps; mixed precision casts only for the all-gather)")
            continue
        if st.nbytes() != l.nbytes or lt.storage_offset() != 0:
            mismatched.append(f"{n}: storage of {st.nbytes()} bytes at element {lt.storage_offset()}, the layout's "
                              f"padded local tensor {list(l.shape)} has {l.nbytes} at 0")
        if not lt.is_contiguous():
            mismatched.append(f"{n}: the local tensor is not contiguous")
        if n.endswith(".mlp.experts.gate_up_proj") or n.endswith(".mlp.experts.down_proj"):
            rows = tuple(lt.shape)
            held = len(by_local.get(n, [])) // (2 if n.endswith("gate_up_proj") else 1)
            if rows[0] != held or rows[1:] != tuple(l.shape[1:]):
                mismatched.append(f"{n}: local {list(rows)}, the layout places {held} experts of {list(l.shape)}")
        else:
            _box_check(n, p, by_local.get(n, []), mismatched)
    if missing or unexpected or mismatched:
        raise AdapterError(f"{layout} rank {rank} of {rmodel.name}", missing, unexpected, mismatched)
    if not 1 <= max_regions <= MAX_REGIONS:
        raise AdapterError(f"{layout} rank {rank} of {rmodel.name}", [], [],
                           [f"max_regions {max_regions}: between 1 and {MAX_REGIONS} (REFIT_MAX_REGIONS)"])
    m = Manifest.build(rmodel.name, layout, rank, ref.identity["world"])
    order = [l.name for l in ref.locals()]
    packed = set()
    if len(order) > max_regions:  # the smallest (stable order among equals) share one region of copies
        by_size = sorted(range(len(order)), key=lambda i: (locs[order[i]].nbytes, i))
        packed = {order[i] for i in by_size[:len(order) - max_regions + 1]}
    regions, region_of, pack, offs = [], {}, [], {}
    for n in order:
        l = locs[n]
        storage = torch.empty(0, dtype=torch.uint8).set_(params[n]._local_tensor.untyped_storage())
        if n in packed:
            pack.append((n, storage))
            continue
        region_of[n] = m.add_region(l.nbytes)
        m.add_local(n, l.dtype, l.shape, region_of[n], 0)
        regions.append(storage)
    if pack:
        size = 0
        for n, _ in pack:
            offs[n] = size
            size += -(-locs[n].nbytes // 64) * 64  # 64-byte aligned slots
        rid = m.add_region(size)
        arena = torch.zeros(size, dtype=torch.uint8)
        for n, src in pack:
            m.add_local(n, locs[n].dtype, locs[n].shape, rid, offs[n])
            region_of[n] = rid
        regions.append(arena)
        pack = [(src, arena[offs[n]:offs[n] + src.numel()]) for n, src in pack]
    for c in ref.canonical():
        m.add_canonical(c.name, c.dtype, c.shape)
    for pl in ref.placements():
        m.add_placement(pl.canonical, pl.local, pl.canon_offset, pl.extent, pl.local_offset)
    m.finalize()
    b = FsdpBinding(m, regions, layout, rank, {n: params[n] for n in order}, sorted(packed), region_of, pack)
    b.sync()
    return b
