"""The Python binding's structures against the library's own layout (refit_abi_layout).

python/refit/_lib.py mirrors the public C structures by hand with ctypes.  These tests fail when the two
drift: a field added, removed, moved or resized in include/refit/*.h and not in _lib.py (or the reverse),
a ctypes structure in _lib.py that is not checked, or a structure the library's table does not describe
whole (src/engine/abi.c left behind by a header change).  Cheap: no processes, no models.
"""
import ctypes as C
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
    (lambda t: _insert(t, "refit_receiver_params_t", "version", "added_in_c", 8), "refit_receiver_params_t: sizeof"),
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


def test_sized_outputs_begin_with_their_size():
    for cls in (_lib.PullReportC, _lib.HolderStatC, _lib.PlanStatsC, _lib.TruthReport):
        assert cls.size.offset == 0 and cls.size.size == C.sizeof(C.c_size_t)
