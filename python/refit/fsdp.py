"""Publish a model sharded by torch's FSDP2 (fully_shard) from each rank's own shards, without a gather or a copy.

    binding = refit.fsdp.dtensor(model, refit.Model(checkpoint_dir))   # on every FSDP rank
    with refit.Publisher(binding.manifest, registry=..., job=...) as pub:
        binding.attach(pub)
        binding.publish(pub, 1)   # ... optimizer steps ...  binding.publish(pub, 2)  (= sync() + pub.publish)

What it reads: the live DTensor parameters (named_parameters() after fully_shard, and TP / EP from transformers'
own plans - transformers.distributed - or torch's parallelize_module): their device mesh, placements, global and
local shapes and dtype.  From them it names the `dtensor` layout (docs/layouts.md:
"dtensor:dp_shard=F,dp_replicate=R,tp=T[,ep=E],experts=fused|split") and this rank's place in it (the mesh
coordinate (r, f, t) -> rank t + T*(f + F*r); fused experts on an expert mesh (g, e) over the same ranks),
has the library generate that rank's manifest, and checks every parameter against it: the placements
(Shard(0) / _StridedShard(0, split_factor=T) over dp_shard, Replicate over dp_replicate, transformers' tp plan
over tp, Shard(0) of the experts over ep), which global indices of every dimension this rank's to_local()
holds - computed with torch's own placement splitting (Shard / _StridedShard._split_tensor, left to right as
DTensor applies them), so packed_colwise experts (gate chunk t, then up chunk t) are checked as they are - against
every box the manifest places, the dtype, and the parameter's storage against the manifest's padded local tensor.
Every difference is collected and raised at once (AdapterError).

Memory: FSDP2 keeps each sharded parameter in its own padded 1-d buffer (FSDPParam._sharded_param_data, every
rank ceil(N/F) rows; the DTensor's local tensor is its first rows).  The binding makes each such buffer one
region of the manifest (one region per parameter, local tensor at offset 0), so the publisher reads the
parameters' own storage: no copy, no arena.  The region is the padded window starting at the local tensor, which
may sit inside a larger storage (transformers' loader leaves some shards as views of the full tensor until
FSDP2's lazy init; the window must fit in the storage, or the parameter is refused by name).  The optimizer
updates that storage in place, and its address stays the same across steps (checked in
tests/python/test_fsdp.py); FSDP2 replaces it in reset_sharded_param (its lazy init at the first forward when a
parameter was replaced after fully_shard - transformers' from_pretrained(distributed_config=...) loads and ties
weights after fully_shard -, model.to(), load_state_dict with new tensors): bind after the first forward, and
again after those.  publish() refuses a storage that moved since binding, naming the parameters.

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
    _bound: Dict[str, int] = field(default_factory=dict)

    def sync(self) -> int:
        """Copies the packed parameters' shards into their arena (none when every parameter has its own region);
        returns the bytes copied.  Run after the optimizer step, before publish."""
        n = 0
        for src, dst in self._pack:
            dst.copy_(src)
            n += dst.numel()
        return n

    def publish(self, endpoint, version: int):
        """sync() and endpoint.publish(version); refuses (AdapterError, nothing published) if a parameter's storage
        moved since binding (FSDP2's reset_sharded_param: lazy init, model.to(), load_state_dict)."""
        moved = [n for n, a in self.addresses().items() if a != self._bound.get(n)]
        if moved:
            raise AdapterError(f"{self.layout} rank {self.rank}: version {version} not published", [], [],
                               [f"{n}: the sharded storage moved since binding (FSDP2 replaced it: lazy init at the "
                                "first forward, model.to(), load_state_dict); bind again" for n in moved])
        self.sync()
        endpoint.publish(version)

    def attach(self, endpoint):
        for i, mem in enumerate(self.regions):
            endpoint.attach(i, mem)
        return endpoint

    def addresses(self) -> Dict[str, int]:
        """Each parameter's local tensor address (to check that it did not move)."""
        return {n: p._local_tensor.data_ptr() for n, p in self.params.items()}


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


FUSED_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def _on_expert_mesh(n, p) -> bool:
    """A fused expert parameter whose expert dim (0) is sharded by its last mesh dim and by the one before it: an
    expert-parallel mesh (transformers' grouped_gemm: Shard(0) over ep, FSDP2's over efsdp; tensor parallel never
    shards the experts' dim 0, HSDP's (Replicate, Shard(0)) replicates over its first dim)."""
    from torch.distributed.tensor import DTensor
    if not (n.endswith(FUSED_EXPERTS) and isinstance(p, DTensor) and len(p.placements) >= 2):
        return False
    k = [_kind(x) for x in p.placements[-2:]]
    return k[1][:2] == ("shard", 0) and k[0][:2] in (("shard", 0), ("strided", 0))


def mesh_geometry(params: Dict[str, object]) -> Tuple[int, int, int, int, Tuple[int, ...]]:
    """(dp_replicate, dp_shard, tp, ep, coordinate (r, f, t)) of the parameters' common mesh, from their placements:
    1-d (Shard(0)): FSDP; 2-d (Replicate, Shard(0)): HSDP; 2-d (Shard(0)|_StridedShard(0), tp): FSDP over TP;
    3-d (Replicate, Shard(0)|_StridedShard(0), tp): HSDP over TP; fused experts on a 2-d expert mesh
    (Shard(0)|_StridedShard(0, ep), Shard(0)) over (efsdp, ep), the same ranks in the same order: expert
    parallel.  Anything else raises AdapterError naming it."""
    from torch.distributed.tensor import DTensor
    bad, meshes = [], {}
    hsdp = None
    experts = {n: p for n, p in params.items() if _on_expert_mesh(n, p)}
    for n, p in params.items():
        if n in experts:
            continue
        if not isinstance(p, DTensor):
            bad.append(f"{n}: a {type(p).__name__}, not a DTensor (is the model wrapped with fully_shard? is it "
                       "unsharded - after a forward with reshard_after_forward=False, until the backward or "
                       "reshard()?)")
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
    if bad or not meshes:
        raise AdapterError("dtensor parameters", [], [], bad or ["no parameter outside the experts' mesh"])
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
        geo = 1, shape[0], 1, (0, coord[0], 0)
    elif len(shape) == 2 and not tp_dim:
        geo = shape[0], shape[1], 1, (coord[0], coord[1], 0)
    elif len(shape) == 2:
        geo = 1, shape[0], shape[1], (0, coord[0], coord[1])
    else:
        geo = shape[0], shape[1], shape[2], coord
    rep, shard, tp, (r, f, t) = geo
    ep = 1
    if experts:
        # transformers' expert mesh (distributed/utils.py initialize_distributed_mesh): (efsdp, ep) =
        # (dp_shard*tp/ep, ep), row-major over the ranks of the (dp_shard, tp) mesh; FSDP2 on efsdp over the
        # EP-local experts: (_StridedShard(0, split_factor=ep), Shard(0))
        emeshes = {tuple(p.device_mesh.mesh.flatten().tolist()) for p in experts.values()}
        e0 = next(iter(experts.values()))
        em = e0.device_mesh
        ep = em.size(em.ndim - 1)
        for n, p in experts.items():
            k = [_kind(x) for x in p.placements]
            if len(k) != 2 or k[0][:2] not in (("shard", 0), ("strided", 0)) or \
                    (k[0][0] == "strided" and k[0][2] != ep):
                bad.append(f"{n}: placements {tuple(p.placements)} on the expert mesh are not FSDP2 over expert "
                           f"parallel ((Shard(0)|_StridedShard(0, {ep}), Shard(0)))")
        if len(emeshes) != 1:
            bad.append(f"the fused experts live on {len(emeshes)} different expert meshes")
        if list(next(iter(emeshes))) != mesh.mesh.flatten().tolist():
            bad.append(f"the expert mesh {em.mesh.tolist()} does not list the ranks of the mesh "
                       f"{mesh.mesh.tolist()} in the same order")
        if rep > 1:
            bad.append(f"expert parallel (ep={ep}) with dp_replicate={rep}: not described (transformers' expert "
                       "mesh has no replicate dimension)")
        ec = em.get_coordinate()
        if not bad and ec[1] + ep * ec[0] != t + tp * f:
            bad.append(f"expert mesh coordinate {tuple(ec)} is not rank {t + tp * f} of the (dp_shard, tp) mesh")
        if bad:
            raise AdapterError("dtensor parameters", [], [], bad)
    return rep, shard, tp, ep, (r, f, t)


def _held(p):
    """Per dimension of the DTensor p, the global indices (a 1-d LongTensor each) that this rank's to_local()
    holds, in local order: the placements applied left to right, as DTensor does, with torch's own splitting
    (Shard._split_tensor / _StridedShard._split_tensor: torch.chunk, and the strided shard's chunks of chunks)."""
    import torch
    coord = p.device_mesh.get_coordinate()
    idx = [torch.arange(n) for n in p.shape]
    for md, pl in enumerate(p.placements):
        if pl.is_replicate():
            continue
        d = pl.dim % p.ndim
        t = idx[d].reshape([1] * d + [-1])
        pieces, _ = pl._split_tensor(t, p.device_mesh.size(md), with_padding=False, contiguous=True)
        idx[d] = pieces[coord[md]].reshape(-1)
    return idx


def _check_boxes(n, p, pls, out):
    """Compares what torch says this rank holds of parameter n (_held) with the boxes the manifest places on the
    local tensor n.  The fused experts map a live index to a canonical tensor: gate_up_proj (e, r, h) is expert
    e's gate_proj row r (r < I) or up_proj row r - I; down_proj (e, h, i) its down_proj (h, i)."""
    import torch
    idx = _held(p)
    held = tuple(len(i) for i in idx)
    errors = len(out)
    if held != tuple(p.to_local().shape):
        out.append(f"{n}: torch's placements give {held} elements a dim, the local tensor is "
                   f"{tuple(p.to_local().shape)}")
        return
    fused = n.endswith(FUSED_EXPERTS)
    gate_up = n.endswith(".gate_up_proj")
    pre = n.rsplit(".", 1)[0]
    half = p.shape[1] // 2 if gate_up else 0
    volume = 0
    for pl in pls:
        lo, ext, co = tuple(pl.local_offset), tuple(pl.extent), tuple(pl.canon_offset)
        k = len(lo) - len(ext)  # leading local dims (the fused experts' expert dim)
        if k != (1 if fused else 0) or any(lo[k + c] + ext[c] > held[k + c] for c in range(len(ext))) or \
                (k and lo[0] >= held[0]):
            out.append(f"{n}: the layout's box of {pl.canonical} at {lo} extent {ext} is not inside what this rank "
                       f"holds {held}")
            continue
        got = [idx[k + c][lo[k + c]:lo[k + c] + ext[c]] for c in range(len(ext))]
        if fused:
            e = int(idx[0][lo[0]])
            if gate_up:
                which = "gate_proj" if int(got[0][0]) < half else "up_proj"
                got[0] = got[0] - (half if which == "up_proj" else 0)
            else:
                which = "down_proj"
            canon = f"{pre}.{e}.{which}.weight"
        else:
            canon = n
        want = [torch.arange(co[c], co[c] + ext[c]) for c in range(len(ext))]
        if pl.canonical != canon or any(not torch.equal(g, w) for g, w in zip(got, want)):
            out.append(f"{n}: at local {lo} torch holds {canon} from {tuple(int(g[0]) for g in got)}, the layout "
                       f"places {pl.canonical} from {co} extent {ext}")
        vol = 1
        for x in ext:
            vol *= x
        volume += vol
    if len(out) == errors and volume != p.to_local().numel():
        out.append(f"{n}: the layout places {volume} elements on this rank, torch holds {p.to_local().numel()}")


def dtensor(model, rmodel: Model, *, experts: str = "fused", strip=("module.", "_orig_mod."),
            max_regions: int = MAX_REGIONS) -> FsdpBinding:
    """Binds an FSDP2-wrapped transformers model's local shards on this rank (see the module docstring).
    max_regions (at most MAX_REGIONS): above it, the smallest parameters are packed into one copied region."""
    import torch
    params = _named(model.named_parameters(), strip)
    rep, shard, tp, ep, (r, f, t) = mesh_geometry(params)
    layout = f"dtensor:dp_shard={shard},dp_replicate={rep},tp={tp}{f',ep={ep}' if ep > 1 else ''},experts={experts}"
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
        at = lt.storage_offset() * lt.element_size()
        if at + l.nbytes > st.nbytes():
            mismatched.append(f"{n}: storage of {st.nbytes()} bytes, the local tensor at byte {at}: no room for the "
                              f"layout's padded local tensor {list(l.shape)} ({l.nbytes} bytes) there")
        if not lt.is_contiguous():
            mismatched.append(f"{n}: the local tensor is not contiguous")
        _check_boxes(n, p, by_local.get(n, []), mismatched)
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
        lt = params[n]._local_tensor  # its padded window: FSDP2's buffer, or room inside a larger storage
        storage = torch.empty(0, dtype=torch.uint8).set_(lt.untyped_storage(), lt.storage_offset() * lt.element_size(),
                                                         (l.nbytes,))
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
    b._bound = b.addresses()
    b.sync()
    return b
