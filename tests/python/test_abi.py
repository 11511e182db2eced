"""The Python binding's structures against the library's own layout (refit_abi_layout).

python/refit/_lib.py mirrors the public C structures by hand with ctypes.  These tests fail when the two
drift: a field added, removed, moved or resized in include/refit/*.h and not in _lib.py (or the reverse),
a ctypes structure in _lib.py that is not checked, or a structure the library's table does not describe
whole (src/engine/abi.c left behind by a header change).  Cheap: no processes, no models.
"""
import ast
import ctypes as C
import glob
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from refit import _lib  # noqa: E402


def test_every_mirrored_structure_matches_the_library_field_by_field():
    assert _lib.abi_mismatches() == []
    layout = _lib.abi_layout()
    for name, cls in _lib.STRUCTS.items():
        size, fields = layout[name]
        assert [f for f, _, _ in fields] == [f for f, *_ in cls._fields_], name
        assert size == C.sizeof(cls) == _lib.lib.refit_struct_size(name.encode()), name


def test_every_ctypes_structure_is_checked():
    mirrored = {cls for cls in vars(_lib).values() if isinstance(cls, type) and issubclass(cls, C.Structure)}
    assert mirrored == set(_lib.STRUCTS.values())


def test_the_library_table_describes_each_structure_whole():
    # Fields in order, each after the last, with at most alignment padding between them and at the end:
    # a field added in a header but not in src/engine/abi.c leaves a hole (or a short sizeof) here.
    for name, (size, fields) in _lib.abi_layout().items():
        assert fields, name
        end = 0
        for f, off, sz in fields:
            assert end <= off < end + 8, f"{name}.{f}: at {off}, the previous field ends at {end}"
            end = off + sz
        assert end <= size < end + 8, f"{name}: fields end at {end}, sizeof is {size}"


def _insert(layout, name, after, field, size):
    # As the compiler lays it out when a header gains `field` (8-byte aligned here) after `after`.
    total, fields = layout[name]
    i = [f for f, _, _ in fields].index(after) + 1
    at = -(-(fields[i - 1][1] + fields[i - 1][2]) // 8) * 8
    moved = [(f, o + size, z) for f, o, z in fields[i:]]
    layout[name] = (total + size, fields[:i] + [(field, at, size)] + moved)


@pytest.mark.parametrize("mutate,needle", [
    (lambda t: _insert(t, "refit_pull_report_t", "digest_ms", "added_in_c", 8), "refit_pull_report_t.added_in_c"),
    (lambda t: _insert(t, "refit_holder_stat_t", "size", "added_in_c", 8), "refit_holder_stat_t.name"),
    (lambda t: _insert(t, "refit_receiver_params_t", "size", "added_in_c", 8), "refit_receiver_params_t: sizeof"),
    (lambda t: t.update(refit_plan_stats_t=(t["refit_plan_stats_t"][0] + 8, t["refit_plan_stats_t"][1])),
     "refit_plan_stats_t: sizeof"),
    (lambda t: t.pop("refit_truth_report_t"), "refit_truth_report_t: not in"),
])
def test_the_check_sees_drift(mutate, needle):
    # The checker on a layout as a changed header would give it: it must name what moved.
    layout = _lib.abi_layout()
    mutate(layout)
    problems = _lib.abi_mismatches(layout)
    assert any(needle in p for p in problems), problems


def test_sized_structures_begin_with_their_size():
    # Sized outputs and params with a size (refit/engine.h) alike: `size_t size` first.
    for cls in (_lib.PullReportC, _lib.HolderStatC, _lib.PlanStatsC, _lib.TruthReport, _lib.PublisherParams,
                _lib.ReceiverParams, _lib.PlanParams):
        assert cls.size.offset == 0 and cls.size.size == C.sizeof(C.c_size_t), cls.__name__
        assert cls in _lib.SIZED, cls.__name__


PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "refit")


def _positional_struct_calls(source, filename):
    """Calls in `source` that build one of _lib's ctypes structures with positional field values: X(a, b),
    _lib.X(a, b), or make(X, a, b) beyond its first argument."""
    names = {cls.__name__ for cls in _lib.STRUCTS.values()}
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if callee in names and node.args:
            found.append(f"{filename}:{node.lineno}: {callee}(...) with {len(node.args)} positional values")
        if callee == "make" and len(node.args) > 1:
            found.append(f"{filename}:{node.lineno}: make(...) with positional field values")
    return found


def test_the_package_builds_structures_by_field_name():
    files = sorted(glob.glob(os.path.join(PACKAGE, "*.py")))
    assert len(files) > 5
    found = [hit for f in files for hit in _positional_struct_calls(open(f).read(), os.path.basename(f))]
    assert found == []


def test_the_positional_check_sees_positional_initialisers():
    # Without this, the check above could pass by finding nothing at all.
    src = "rp = _lib.ReceiverParams(1, None)\nti = TensorInfo(b'x', 2)\np = make(PlanParams, 5)\nok = make(PlanParams, split_bytes=5)\n"
    assert len(_positional_struct_calls(src, "x.py")) == 3


def test_make_sets_size_by_sizeof_and_fields_by_name():
    rp = _lib.make(_lib.ReceiverParams, job=b"j", device=-1, relay_slot=-1, chunk_kb=64)
    assert rp.size == C.sizeof(_lib.ReceiverParams) == _lib.lib.refit_struct_size(b"refit_receiver_params_t")
    assert (rp.job, rp.device, rp.relay_slot, rp.chunk_kb, rp.lease_ms, rp.registry) == (b"j", -1, -1, 64, 0, None)
    ti = _lib.make(_lib.TensorInfo, name=b"w", ndim=2)  # not sized: no size field to set
    assert (ti.name, ti.ndim) == (b"w", 2)
    with pytest.raises(TypeError, match="no field chunk_kbb"):
        _lib.make(_lib.ReceiverParams, chunk_kbb=64)
    with pytest.raises(TypeError, match="size is set from ctypes.sizeof"):
        _lib.make(_lib.PlanParams, size=8)


def test_the_library_reads_params_by_their_size():
    # A size the library does not know (a binding from newer headers) is refused, naming the structure; the
    # size ctypes gives is accepted.
    from refit import core
    model = core.Model("tiny-dense")
    src, dst = core.Layout("megatron:tp=1").manifest(model, 0), core.Layout("hf").manifest(model, 0)
    arr = (C.c_void_p * 1)(src._h)
    h = C.c_void_p()
    params = _lib.make(_lib.PlanParams)
    params.size += 8
    assert _lib.lib.refit_plan_create(arr, 1, dst._h, C.byref(params), C.byref(h)) != 0
    assert b"refit_plan_params_t: size is" in _lib.lib.refit_last_error()
    params.size = C.sizeof(_lib.PlanParams)
    assert _lib.lib.refit_plan_create(arr, 1, dst._h, C.byref(params), C.byref(h)) == 0
    _lib.lib.refit_plan_destroy(h)
