"""Objects over the C API: models, layouts, manifests, plans, safetensors,
publishers and receivers.  Every failing C call raises RefitError carrying the
status name (REFIT_ERR_...) and the library's detail (refit_last_error)."""
import ctypes as C
from dataclasses import dataclass, field, fields
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from ._lib import lib

# ---------------------------------------------------------------- errors


class RefitError(Exception):
    """A refit call failed.  .status (int), .name ("REFIT_ERR_MISMATCH"), .detail (what happened), .call."""

    def __init__(self, status: int, detail: str, call: str = ""):
        self.status = status
        self.name = lib.refit_status_name(status).decode()
        self.detail = detail
        self.call = call
        super().__init__(f"{self.name}: {detail}" + (f" ({call})" if call else ""))

    def __reduce__(self):
        # Exceptions pickle as cls(*args) by default, which re-wraps the message in a subclass whose __init__
        # differs (RefitVllmError's status became UNSUPPORTED after crossing a Ray actor boundary); rebuild from
        # the fields instead, keeping subclass attributes (AdapterError's lists).
        return (_rebuild_error, (type(self), self.status, self.detail, self.call), dict(self.__dict__))


def _rebuild_error(cls, status, detail, call):
    e = Exception.__new__(cls)
    RefitError.__init__(e, status, detail, call)
    return e


# One class per family of status codes (include/refit/status.h groups them by how much they break), and one for
# each status a caller is likely to handle on its own.  All are RefitError, so `except RefitError` catches every
# failure; the input family is also a ValueError (a wrong type of argument also a TypeError), as Python expects.
class InputError(RefitError, ValueError):
    """The caller's input (-1..-19): arguments, files, manifests, geometries."""


class ArgumentTypeError(InputError, TypeError):
    """An argument of the wrong type (raised by the binding itself, status REFIT_ERR_INVALID_ARG)."""


class DataError(RefitError):
    """Planning and verification (-20..-39): the data does not add up."""


class VerifyError(DataError):
    """REFIT_ERR_VERIFY: bytes that do not match what their publishers published; nothing was committed."""


class ReplayError(DataError):
    """REFIT_ERR_REPLAY: a registry value names other bytes than its source holds (replayed, rolled back)."""


class EnvError(RefitError):
    """The environment (-40..-59): memory, I/O, peers, servers, time."""


class RefitTimeout(EnvError):
    """REFIT_ERR_TIMEOUT."""


class PeerError(EnvError):
    """REFIT_ERR_PEER: a peer process died or misbehaved."""


class StaleError(EnvError):
    """REFIT_ERR_STALE: the version or entry was replaced or retired."""


class AuthError(EnvError):
    """REFIT_ERR_AUTH: an entry or a peer did not prove the job's secret."""


_BY_STATUS = {-23: VerifyError, -25: ReplayError, -42: RefitTimeout, -43: PeerError, -46: StaleError, -48: AuthError}


def error_class(status: int) -> type:
    """The exception class a failing call with this status raises."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if -19 <= status <= -1:
        return InputError
    if -39 <= status <= -20:
        return DataError
    if -59 <= status <= -40:
        return EnvError
    return RefitError


def _check(status: int, call: str = ""):
    if status != 0:
        detail = (lib.refit_last_error() or b"").decode(errors="replace")
        raise error_class(status)(status, detail or lib.refit_status_message(status).decode(), call)


def _arg_error(detail: str, call: str) -> InputError:
    """A bad argument caught by the binding itself (status REFIT_ERR_INVALID_ARG)."""
    return InputError(-1, detail, call)


def _type_error(detail: str, call: str) -> ArgumentTypeError:
    return ArgumentTypeError(-1, detail, call)


def _b(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()


# ---------------------------------------------------------------- dtypes

DTYPES = {1: "bf16", 2: "f16", 3: "f32", 4: "f8_e4m3", 5: "i32", 6: "i64", 7: "u8"}
_NP = {"f16": np.float16, "f32": np.float32, "i32": np.int32, "i64": np.int64, "u8": np.uint8,
       "bf16": np.uint16, "f8_e4m3": np.uint8}  # numpy has no bf16/fp8: their bits


def dtype_code(name) -> int:
    if not isinstance(name, str):
        name = _dtype_name_of(name)
    code = lib.refit_dtype_parse(name.encode())
    if code == 0:
        raise _arg_error(f"unknown dtype {name!r}", "refit_dtype_parse")
    return code


def _dtype_name_of(dt) -> str:
    """A refit dtype name for a torch or numpy dtype."""
    s = str(dt)
    table = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32", "torch.float8_e4m3fn": "f8_e4m3",
             "torch.int32": "i32", "torch.int64": "i64", "torch.uint8": "u8",
             "float16": "f16", "float32": "f32", "int32": "i32", "int64": "i64", "uint8": "u8"}
    if s not in table:
        raise _arg_error(f"dtype {s} has no refit equivalent", "dtype")
    return table[s]


def torch_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f8_e4m3": torch.float8_e4m3fn,
            "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}[name]


def dtype_size(name: str) -> int:
    return lib.refit_dtype_size(dtype_code(name))


@dataclass(frozen=True)
class Tensor:
    """A tensor description: name, refit dtype name, shape."""
    name: str
    dtype: str
    shape: Tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = dtype_size(self.dtype)
        for d in self.shape:
            n *= d
        return n


def _tensor(ti: _lib.TensorInfo) -> Tensor:
    return Tensor(ti.name.decode(), DTYPES.get(ti.dtype, "invalid"), tuple(ti.shape[i] for i in range(ti.ndim)))


def _info(name: str, dtype: str, shape) -> Tuple[_lib.TensorInfo, bytes]:
    shape = tuple(int(x) for x in shape)
    if not 1 <= len(shape) <= _lib.MAX_DIMS:
        raise _arg_error(f"{name}: {len(shape)} dims (1..{_lib.MAX_DIMS})", "tensor")
    nb = name.encode()
    ti = _lib.make(_lib.TensorInfo, name=nb, dtype=dtype_code(dtype), ndim=len(shape),
                   shape=(C.c_uint64 * _lib.MAX_DIMS)(*shape))
    return ti, nb


# ---------------------------------------------------------------- models and layouts


class Model:
    """A model: a built-in name ("tiny-moe", "qwen3-30b-a3b") or a Hugging Face config.json (file or directory)."""

    def __init__(self, name_or_path: str):
        h = C.c_void_p()
        _check(lib.refit_model_open(str(name_or_path).encode(), C.byref(h)), f"refit_model_open({name_or_path})")
        self._h = h

    def __del__(self):
        if getattr(self, "_h", None):
            lib.refit_model_destroy(self._h)
            self._h = None

    @property
    def name(self) -> str:
        return lib.refit_model_name(self._h).decode()

    @property
    def total_bytes(self) -> int:
        return lib.refit_model_total_bytes(self._h)

    def tensors(self) -> List[Tensor]:
        """The canonical tensors (Hugging Face names, full shapes) in their fixed order."""
        out = []
        for i in range(lib.refit_model_num_tensors(self._h)):
            ti = _lib.TensorInfo()
            _check(lib.refit_model_tensor(self._h, i, C.byref(ti)))
            out.append(_tensor(ti))
        return out

    @staticmethod
    def builtins() -> List[str]:
        out, i = [], 0
        while True:
            n = lib.refit_model_builtin_name(i)
            if not n:
                return out
            out.append(n.decode())
            i += 1


class Layout:
    """A layout string: "hf", "megatron:tp=2,ep=2,...", "vllm:tp=2" (docs/layouts.md)."""

    def __init__(self, spec: str):
        h = C.c_void_p()
        _check(lib.refit_layout_parse(spec.encode(), C.byref(h)), f"refit_layout_parse({spec})")
        self._h = h

    def __del__(self):
        if getattr(self, "_h", None):
            lib.refit_layout_destroy(self._h)
            self._h = None

    def __str__(self):
        return lib.refit_layout_string(self._h).decode()

    @property
    def world(self) -> int:
        return lib.refit_layout_world(self._h)

    def check(self, model: Model):
        _check(lib.refit_layout_check(self._h, model._h), "refit_layout_check")

    def manifest(self, model: Model, rank: int) -> "Manifest":
        h = C.c_void_p()
        _check(lib.refit_layout_manifest(self._h, model._h, rank, C.byref(h)), f"refit_layout_manifest(rank {rank})")
        return Manifest(h)


# ---------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Local:
    """A local tensor of a manifest: where it lives."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    region: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Placement:
    """One box of a canonical tensor (by name) mapped onto a local tensor (by name).  Offsets and extents have
    the canonical tensor's ndim; local_offset has the local tensor's ndim (leading dims fixed, see manifest.h)."""
    canonical: str
    local: str
    canon_offset: Tuple[int, ...]
    extent: Tuple[int, ...]
    local_offset: Tuple[int, ...]


class Manifest:
    """What one rank holds.  From Layout.manifest(), or built: Manifest.build(model, layout, rank, world), then
    add_region / add_canonical / add_local / add_placement, finalize()."""

    def __init__(self, handle, owner=None):
        self._h = handle
        self._owner = owner  # when set, that object owns the C manifest

    @classmethod
    def build(cls, model: str, layout: str, rank: int = 0, world: int = 1) -> "Manifest":
        ident = _lib.make(_lib.Identity, model=model.encode(), layout=layout.encode(), rank=rank, world=world)
        h = C.c_void_p()
        _check(lib.refit_manifest_create(C.byref(ident), C.byref(h)), "refit_manifest_create")
        m = cls(h)
        m._canon_ids, m._local_ids = {}, {}
        return m

    def __del__(self):
        if getattr(self, "_h", None) and self._owner is None:
            lib.refit_manifest_destroy(self._h)
        self._h = None

    def _give_to(self, owner):
        self._owner = owner

    # building
    def add_region(self, size: int) -> int:
        rid = C.c_uint32()
        _check(lib.refit_manifest_add_region(self._h, int(size), C.byref(rid)), "refit_manifest_add_region")
        return rid.value

    def add_canonical(self, name: str, dtype: str, shape) -> int:
        ti, _keep = _info(name, dtype, shape)
        cid = C.c_uint32()
        _check(lib.refit_manifest_add_canonical(self._h, C.byref(ti), C.byref(cid)), f"add_canonical({name})")
        self._canon_ids[name] = cid.value
        return cid.value

    def add_local(self, name: str, dtype: str, shape, region: int, offset: int) -> int:
        ti, _keep = _info(name, dtype, shape)
        lid = C.c_uint32()
        _check(lib.refit_manifest_add_local(self._h, C.byref(ti), region, int(offset), C.byref(lid)),
               f"add_local({name})")
        self._local_ids[name] = lid.value
        return lid.value

    def add_placement(self, canonical, local, canon_offset, extent, local_offset):
        """canonical / local: ids or names (names of tensors added to this manifest)."""
        c = self._canon_ids[canonical] if isinstance(canonical, str) else canonical
        lo = self._local_ids[local] if isinstance(local, str) else local
        U = C.c_uint64 * _lib.MAX_DIMS
        p = _lib.make(_lib.PlacementC, canon=c, local=lo, ndim=len(extent), canon_offset=U(*canon_offset),
                      extent=U(*extent), local_offset=U(*local_offset))
        _check(lib.refit_manifest_add_placement(self._h, C.byref(p)), f"add_placement({canonical} -> {local})")

    def finalize(self) -> "Manifest":
        _check(lib.refit_manifest_finalize(self._h), "refit_manifest_finalize")
        return self

    # reading
    @property
    def identity(self):
        i = _lib.Identity()
        lib.refit_manifest_identity(self._h, C.byref(i))
        return {"model": i.model.decode(), "layout": i.layout.decode(), "rank": i.rank, "world": i.world}

    @property
    def signature(self) -> int:
        return lib.refit_manifest_signature(self._h)

    def regions(self) -> List[int]:
        return [lib.refit_manifest_region_size(self._h, r) for r in range(lib.refit_manifest_num_regions(self._h))]

    def canonical(self) -> List[Tensor]:
        out = []
        for i in range(lib.refit_manifest_num_canonical(self._h)):
            ti = _lib.TensorInfo()
            lib.refit_manifest_canonical(self._h, i, C.byref(ti))
            out.append(_tensor(ti))
        return out

    def locals(self) -> List[Local]:
        out = []
        for i in range(lib.refit_manifest_num_locals(self._h)):
            ti, r, o = _lib.TensorInfo(), C.c_uint32(), C.c_uint64()
            lib.refit_manifest_local(self._h, i, C.byref(ti), C.byref(r), C.byref(o))
            t = _tensor(ti)
            out.append(Local(t.name, t.dtype, t.shape, r.value, o.value, t.nbytes))
        return out

    def placements(self) -> List[Placement]:
        canon = self.canonical()
        loc = self.locals()
        out = []
        for i in range(lib.refit_manifest_num_placements(self._h)):
            p = _lib.PlacementC()
            lib.refit_manifest_placement(self._h, i, C.byref(p))
            nl = len(loc[p.local].shape)
            out.append(Placement(canon[p.canon].name, loc[p.local].name, tuple(p.canon_offset[:p.ndim]),
                                 tuple(p.extent[:p.ndim]), tuple(p.local_offset[:nl])))
        return out

    def encode(self) -> bytes:
        buf, n = C.c_void_p(), C.c_size_t()
        _check(lib.refit_manifest_encode(self._h, C.byref(buf), C.byref(n)), "refit_manifest_encode")
        try:
            return C.string_at(buf, n.value)
        finally:
            _lib.libc.free(buf)

    @classmethod
    def decode(cls, data: bytes) -> "Manifest":
        h = C.c_void_p()
        _check(lib.refit_manifest_decode(data, len(data), C.byref(h)), "refit_manifest_decode")
        return cls(h)

    def views(self, regions: Sequence) -> dict:
        """Each local tensor as a typed view (torch or numpy, as the regions are) into region memory."""
        out = {}
        for l in self.locals():
            out[l.name] = _typed_view(regions[l.region], l.offset, l.nbytes, l.dtype, l.shape)
        return out

    def truth_fill(self, regions: Sequence, version: int, fraction: float = 1.0):
        """The synthetic truth of `version`; with fraction < 1, only that share of elements changes per version."""
        _check(lib.refit_truth_fill_delta(self._h, _bases(regions), version, fraction), "refit_truth_fill")

    def truth_verify(self, regions: Sequence, version: int, fraction: float = 1.0) -> dict:
        rep = _lib.make(_lib.TruthReport)
        _check(lib.refit_truth_verify_delta(self._h, _bases(regions), version, fraction, C.byref(rep)),
               "refit_truth_verify")
        return {"elements_checked": rep.elements_checked, "bytes_checked": rep.bytes_checked}

    def write_safetensors(self, path: str, regions: Sequence):
        _check(lib.refit_safetensors_write(str(path).encode(), self._h, _bases(regions)), "refit_safetensors_write")


# ---------------------------------------------------------------- memory


def _addr(x) -> Tuple[int, int, int]:
    """(address, bytes, cuda device or -1) of a contiguous torch tensor, numpy array or raw address."""
    if isinstance(x, int):
        return x, -1, -1
    if isinstance(x, np.ndarray):
        if not x.flags["C_CONTIGUOUS"]:
            raise _arg_error("memory must be a C-contiguous array", "attach")
        return x.ctypes.data, x.nbytes, -1
    if hasattr(x, "data_ptr"):  # torch.Tensor
        if not x.is_contiguous():
            raise _arg_error("memory must be a contiguous tensor", "attach")
        dev = x.device.index if x.device.type == "cuda" else -1
        if x.device.type == "cuda" and dev is None:
            dev = 0
        return x.data_ptr(), x.numel() * x.element_size(), dev
    raise _type_error(f"cannot take memory from {type(x).__name__}", "attach")


def _bases(regions: Sequence):
    arr = (C.c_void_p * max(1, len(regions)))()
    for i, r in enumerate(regions):
        arr[i] = _addr(r)[0]
    return arr


class _CudaMem:
    def __init__(self, addr, nbytes, dev):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 3,
                                         "strides": None}
        self.dev = dev


def wrap_memory(addr: int, nbytes: int, device: int = -1, kind: str = "torch"):
    """Library-owned memory as a uint8 tensor (torch, or numpy with kind="numpy"), without copying."""
    if device >= 0:
        import torch
        return torch.as_tensor(_CudaMem(addr, nbytes, device), device=f"cuda:{device}")
    arr = np.ctypeslib.as_array((C.c_uint8 * nbytes).from_address(addr))
    if kind == "numpy":
        return arr
    import torch
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.frombuffer(arr, dtype=torch.uint8)


def _typed_view(region, offset, nbytes, dtype, shape):
    if isinstance(region, np.ndarray):
        return region[offset:offset + nbytes].view(_NP[dtype]).reshape(shape)
    return region[offset:offset + nbytes].view(torch_dtype(dtype)).view(shape)


# ---------------------------------------------------------------- plans


@dataclass
class PlanStats:
    bytes_written: int
    bytes_read: int
    bytes_redundant: int
    bytes_fill: int
    regions: int
    fills: int
    pieces: int
    sources_used: int
    plan_ms: float
    source_bytes: List[int] = field(default_factory=list)


class Plan:
    """The byte plan from source manifests (None for a missing rank) to one destination manifest."""

    def __init__(self, sources: Sequence[Optional[Manifest]], dest: Manifest, split_bytes: int = 0):
        self._srcs, self._dst = list(sources), dest
        arr = (C.c_void_p * max(1, len(sources)))(*[s._h if s is not None else None for s in sources])
        params = _lib.make(_lib.PlanParams, split_bytes=split_bytes)
        h = C.c_void_p()
        _check(lib.refit_plan_create(arr, len(sources), dest._h, C.byref(params), C.byref(h)), "refit_plan_create")
        self._h = h

    def __del__(self):
        if getattr(self, "_h", None):
            lib.refit_plan_destroy(self._h)
            self._h = None

    def stats(self) -> PlanStats:
        s = _lib.make(_lib.PlanStatsC)
        _check(lib.refit_plan_stats(self._h, C.byref(s)), "refit_plan_stats")
        return PlanStats(s.bytes_written, s.bytes_read, s.bytes_redundant, s.bytes_fill, s.regions, s.fills,
                         s.pieces, s.sources_used, s.plan_ms,
                         [lib.refit_plan_source_bytes(self._h, i) for i in range(len(self._srcs))])

    def execute(self, source_regions: Sequence[Sequence], dest_regions: Sequence, threads: int = 0):
        """memcpy in this process (host memory): source_regions[i][r] is region r of source i."""
        rows = [_bases(rs) for rs in source_regions]
        outer = (C.POINTER(C.c_void_p) * max(1, len(rows)))(*[C.cast(r, C.POINTER(C.c_void_p)) for r in rows])
        _check(lib.refit_plan_execute_memcpy(self._h, C.cast(outer, C.POINTER(C.POINTER(C.c_void_p))),
                                             _bases(dest_regions), threads), "refit_plan_execute_memcpy")


# ---------------------------------------------------------------- safetensors


class SafetensorsFile:
    """A validated, memory-mapped safetensors file (the C reader)."""

    def __init__(self, path: str):
        h = C.c_void_p()
        _check(lib.refit_safetensors_open(str(path).encode(), C.byref(h)), f"refit_safetensors_open({path})")
        self._h = h

    @classmethod
    def parse(cls, data: bytes):
        self = cls.__new__(cls)
        self._keep = C.create_string_buffer(data, len(data))
        h = C.c_void_p()
        _check(lib.refit_safetensors_parse(self._keep, len(data), C.byref(h)), "refit_safetensors_parse")
        self._h = h
        return self

    def close(self):
        if getattr(self, "_h", None):
            lib.refit_safetensors_close(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def tensors(self) -> dict:
        """name -> (Tensor, file offset, nbytes)."""
        out = {}
        for i in range(lib.refit_safetensors_count(self._h)):
            ti, off, nb = _lib.TensorInfo(), C.c_uint64(), C.c_uint64()
            _check(lib.refit_safetensors_tensor(self._h, i, C.byref(ti), C.byref(off), C.byref(nb)))
            t = Tensor(ti.name.decode(), DTYPES.get(ti.dtype, "invalid"), tuple(ti.shape[:ti.ndim]))
            out[t.name] = (t, off.value, nb.value)
        return out

    def numpy(self, name: str) -> np.ndarray:
        t, off, nb = self.tensors()[name]
        base = lib.refit_safetensors_data(self._h)
        raw = np.ctypeslib.as_array((C.c_uint8 * nb).from_address(base + off)) if nb else np.zeros(0, np.uint8)
        return raw.view(_NP[t.dtype]).reshape(t.shape).copy()


class HfSource:
    """A Hugging Face checkpoint directory (index + shards, or model.safetensors) mapped read-only and described
    as an hf-layout manifest with one region per shard: .manifest, .regions (uint8 arrays over the mappings)."""

    def __init__(self, directory: str, model: Model):
        h, m = C.c_void_p(), C.c_void_p()
        _check(lib.refit_hf_source_open(str(directory).encode(), model._h, C.byref(h), C.byref(m)),
               f"refit_hf_source_open({directory})")
        self._h = h
        self.manifest = Manifest(m)
        sizes = self.manifest.regions()
        self.files = [lib.refit_hf_source_file(h, r).decode() for r in range(len(sizes))]
        self.regions = [wrap_memory(lib.refit_hf_source_region(h, r), sizes[r], kind="numpy")
                        for r in range(len(sizes))]

    def close(self):
        if getattr(self, "_h", None):
            self.regions = []
            lib.refit_hf_source_close(self._h)
            self._h = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- engine


def default_registry() -> str:
    """The registry used when none is named; "" when there is nowhere private for one
    (no REFIT_REGISTRY, XDG_RUNTIME_DIR, HOME or passwd home): opening it then fails, saying what to set."""
    return lib.refit_default_registry().decode()


class _Endpoint:
    _destroy = None

    def __init__(self, manifest: Manifest, device: int):
        self.manifest = manifest
        self.device = device
        self.memory = [None] * len(manifest.regions())  # region -> tensor/array (kept alive)

    def _region_call(self, fn, region: int, memory):
        addr, nbytes, dev = _addr(memory)
        size = self.manifest.regions()[region]
        if nbytes >= 0 and nbytes < size:
            raise _arg_error(f"region {region} needs {size} bytes, the memory has {nbytes}", "attach")
        if nbytes >= 0 and dev != self.device:
            where = "host memory" if self.device < 0 else f"CUDA device {self.device}"
            raise _arg_error(f"region {region}: memory is on {'host' if dev < 0 else f'cuda:{dev}'}, "
                             f"the endpoint was created for {where}", "attach")
        _check(fn(self._h, region, addr), fn.__name__)
        self.memory[region] = memory

    def _alloc(self, fn, region: int, kind: str):
        base = C.c_void_p()
        _check(fn(self._h, region, C.byref(base)), fn.__name__)
        self.memory[region] = wrap_memory(base.value, self.manifest.regions()[region], self.device, kind)
        return self.memory[region]

    def tensors(self) -> dict:
        """Each local tensor as a typed view into the endpoint's memory (every region must have memory)."""
        return self.manifest.views(self.memory)

    def close(self):
        if getattr(self, "_h", None):
            type(self)._destroy(self._h)
            self._h = None
            self.manifest._h = None  # the C manifest was owned by the endpoint

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Publisher(_Endpoint):
    """One trainer rank (refit_publisher_*).  Memory: attach(region, tensor) uses the caller's tensor/array (its
    storage becomes the region; CUDA tensors need device=N), or alloc(region) lets the library allocate and returns
    it as a uint8 tensor (shared memory for shm; cudaMalloc for cuda_ipc).  A context manager: leaving it destroys
    the publisher (the rank leaves the registry)."""

    _destroy = staticmethod(lib.refit_publisher_destroy)

    def __init__(self, manifest: Manifest, *, registry: str = None, job: str = None, group: str = None,
                 transports: str = None, transport_options: str = None, mode: str = "in-place",
                 heartbeat_ms: int = 0, dead_ms: int = 0, device: int = -1, delta: bool = False,
                 delta_max_pct: int = 0, delta_threads: int = 0, secret_file: str = None, insecure: bool = False,
                 lease_ms: int = 0, no_digest: bool = False):
        super().__init__(manifest, device)
        if mode not in ("in-place", "snapshot"):
            raise _arg_error("mode is 'in-place' or 'snapshot'", "Publisher")
        self._keep = [_b(registry), _b(job), _b(group), _b(transports), _b(transport_options)]
        self._secret = _b(secret_file)
        pp = _lib.make(_lib.PublisherParams, **dict(zip(("registry", "job", "group", "transports",
                                                          "transport_options"), self._keep)),
                       mode=1 if mode == "snapshot" else 0, heartbeat_ms=heartbeat_ms, dead_ms=dead_ms, device=device,
                       delta=delta, delta_max_pct=delta_max_pct, delta_threads=delta_threads,
                       secret_file=self._secret, insecure=insecure, lease_ms=lease_ms, no_digest=no_digest)
        h = C.c_void_p()
        _check(lib.refit_publisher_create(C.byref(pp), manifest._h, C.byref(h)), "refit_publisher_create")
        self._h = h
        manifest._give_to(self)

    def attach(self, region: int, memory):
        self._region_call(lib.refit_publisher_attach, region, memory)

    def alloc(self, region: int = 0, kind: str = "torch"):
        return self._alloc(lib.refit_publisher_alloc, region, kind)

    def publish(self, version: int):
        _check(lib.refit_publisher_publish(self._h, version), f"publish({version})")

    def wait_readers(self, version: int, timeout_ms: int = 60000):
        _check(lib.refit_publisher_wait_readers(self._h, version, timeout_ms), f"wait_readers({version})")

    def wait_acks(self, version: int, n: int, timeout_ms: int = 60000):
        _check(lib.refit_publisher_wait_acks(self._h, version, n, timeout_ms), f"wait_acks({version}, {n})")


@dataclass
class PullReport:
    version: int
    bytes: int
    sources: int
    planned: bool
    manifests_read: int
    wait_ms: float
    discover_ms: float
    plan_ms: float
    transfer_ms: float
    verify_ms: float
    total_ms: float
    transport: str
    lanes: str
    connect_ms: float
    delta_base: int = 0  # a delta from this version was applied (0: a full pull)
    digest_bytes: int = 0  # bytes checked against the publishers' content digests
    unverified_bytes: int = 0  # bytes no digest covered (sources without digests, GPU memory)
    digest_ms: float = 0.0  # hashing, fetching and comparing digests (part of verify_ms)
    stamp_ms: float = 0.0  # reading the sources' version stamps before and after (docs/security.md)
    unstamped_sources: int = 0  # sources read without a version stamp (GPU publishers)
    path: str = "none"  # the way the bytes came: host_direct, host_fleet, gpu_direct, gpu_fp8, delta (refit_rx_path_t)
    digest_fused: bool = False  # the copies computed the digests as they wrote (no second pass over the memory)


@dataclass
class HolderStat:
    name: str  # "trainer:R" or "relay:S"
    bytes: int  # bytes read from it (re-read chunks included)
    chunks: int  # chunks it served
    steals: int  # chunks it re-read from a slower holder
    failed: bool  # dropped during the pull
    early: int  # a relay: chunks read while it was still receiving the version
    ahead: int = 0  # a relay: of those, chunks asked for before it had them (answered once written)
    late: int = 0  # a relay: such requests it did not answer in time


class Receiver(_Endpoint):
    """One rollout rank (refit_receiver_*).  attach(region, tensor) makes the tensor's storage the region that
    pulls write (e.g. an arena the model's parameters are views of), or alloc(region) returns library memory."""

    _destroy = staticmethod(lib.refit_receiver_destroy)

    def __init__(self, manifest: Manifest, *, registry: str = None, job: str = None, group: str = None,
                 transports: str = None, transport_options: str = None, reader: str = None, lease_ms: int = 0,
                 threads: int = 0, verify: bool = False, device: int = -1, relay_slot: int = -1,
                 max_readers: int = 0, chunk_kb: int = 0, no_delta: bool = False, truth_fraction: float = 0.0,
                 secret_file: str = None, insecure: bool = False, no_digest: bool = False):
        super().__init__(manifest, device)
        self._keep = [_b(registry), _b(job), _b(group), _b(transports), _b(transport_options), _b(reader)]
        self._secret = _b(secret_file)
        rp = _lib.make(_lib.ReceiverParams, **dict(zip(("registry", "job", "group", "transports",
                                                         "transport_options", "reader"), self._keep)),
                       lease_ms=lease_ms, threads=threads, verify=1 if verify else 0, device=device,
                       relay_slot=relay_slot, max_readers=max_readers, chunk_kb=chunk_kb, no_delta=no_delta,
                       truth_fraction=truth_fraction, secret_file=self._secret, insecure=insecure,
                       no_digest=no_digest)
        h = C.c_void_p()
        _check(lib.refit_receiver_create(C.byref(rp), manifest._h, C.byref(h)), "refit_receiver_create")
        self._h = h
        manifest._give_to(self)

    def attach(self, region: int, memory):
        self._region_call(lib.refit_receiver_attach, region, memory)

    def alloc(self, region: int = 0, kind: str = "torch"):
        return self._alloc(lib.refit_receiver_alloc, region, kind)

    def pull(self, version: Optional[int] = None, timeout_ms: int = 60000) -> PullReport:
        """Pulls `version` (None: the newest complete one newer than the committed one)."""
        rep = _lib.make(_lib.PullReportC)
        v = _lib.VERSION_NEWEST if version is None else version
        _check(lib.refit_receiver_pull(self._h, v, timeout_ms, C.byref(rep)), f"pull({version})")
        return PullReport(**{f.name: getattr(rep, f.name) for f in fields(PullReport)
                             if f.name not in ("transport", "lanes", "path")},
                          transport=rep.transport.decode(), lanes=rep.lanes.decode(),
                          path=lib.refit_rx_path_name(rep.path).decode())

    def prepare(self, timeout_ms: int = 60000) -> float:
        """Gets ready for the first pull without moving bytes (refit_receiver_prepare): waits up to timeout_ms
        for every source rank to have published, reads their manifests, plans and (GPU memory) connects to the
        sources.  Optional; returns the milliseconds it took."""
        ms = C.c_double()
        _check(lib.refit_receiver_prepare(self._h, timeout_ms, C.byref(ms)), "prepare")
        return ms.value

    def holders(self) -> List[HolderStat]:
        """What each holder served in the last pull (the fleet path; [] otherwise)."""
        n = C.c_size_t()
        _check(lib.refit_receiver_holders(self._h, None, 0, C.byref(n)), "holders")
        out = (_lib.HolderStatC * max(n.value, 1))()
        out[0].size = C.sizeof(_lib.HolderStatC)
        _check(lib.refit_receiver_holders(self._h, out, len(out), C.byref(n)), "holders")
        return [HolderStat(name=h.name.decode(), bytes=h.bytes, chunks=h.chunks, steals=h.steals,
                           failed=bool(h.failed), early=h.early, ahead=h.ahead, late=h.late)
                for h in out[:min(n.value, len(out))]]

    @property
    def committed(self) -> int:
        return lib.refit_receiver_committed(self._h)

    @property
    def usable(self) -> bool:
        return bool(lib.refit_receiver_usable(self._h))
