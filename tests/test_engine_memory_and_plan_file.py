"""The memory planner and the plan file container (engine pieces that need no GPU)."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrt import PlanError
from plugrt.engine.memory import align, plan_memory
from plugrt.engine.plan_file import decode_plan, encode_plan, read_plan, write_plan


@st.composite
def tensors(draw):
    count = draw(st.integers(1, 25))
    sizes, lifetimes = {}, {}
    for i in range(count):
        first = draw(st.integers(0, 20))
        sizes[f"t{i}"] = draw(st.integers(1, 5000))
        lifetimes[f"t{i}"] = (first, first + draw(st.integers(0, 6)))
    return sizes, lifetimes


@settings(max_examples=200, deadline=None)
@given(tensors())
def test_live_tensors_never_overlap(case):
    sizes, lifetimes = case
    plan = plan_memory(sizes, lifetimes)
    names = list(sizes)
    for i, a in enumerate(names):
        assert plan.offsets[a] % 256 == 0
        assert plan.offsets[a] + sizes[a] <= plan.arena_bytes
        for b in names[i + 1:]:
            (fa, la), (fb, lb) = lifetimes[a], lifetimes[b]
            if fa <= lb and fb <= la:
                apart = (plan.offsets[a] + align(sizes[a]) <= plan.offsets[b]
                         or plan.offsets[b] + align(sizes[b]) <= plan.offsets[a])
                assert apart, (a, b)
    assert plan.peak_live_bytes <= plan.arena_bytes <= sum(align(s) for s in sizes.values())


def test_chain_reuses_memory():
    # a -> b -> c -> d: only two neighbours live at once, so the arena holds two buffers.
    sizes = {n: 1024 for n in "abcd"}
    lifetimes = {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (3, 4)}
    assert plan_memory(sizes, lifetimes).arena_bytes == 2048


def test_plan_round_trip(tmp_path, rng):
    arrays = {"w": rng.standard_normal((3, 5)).astype(np.float32), "idx": np.arange(7, dtype=np.int64),
              "mask": rng.random(4) > 0.5, "half": rng.standard_normal(9).astype(np.float16)}
    header = {"plugrt_version": "0.1.0", "layers": [{"name": "conv", "alpha": float("inf")}]}
    path = str(tmp_path / "m.plan")
    write_plan(path, header, arrays)
    got_header, got = read_plan(path)
    assert got_header["layers"] == header["layers"]
    for name, array in arrays.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
    assert [p for p in os.listdir(tmp_path) if p != "m.plan"] == []


def test_corrupt_and_truncated_plans_fail_clearly(rng):
    data = encode_plan({"a": 1}, {"w": rng.standard_normal(100).astype(np.float32)})
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    with pytest.raises(PlanError, match="checksum"):
        decode_plan(bytes(flipped), "x.plan")
    for cut in (0, 10, len(data) // 2, len(data) - 1):
        with pytest.raises(PlanError, match="truncated|checksum"):
            decode_plan(data[:cut], "x.plan")
    with pytest.raises(PlanError, match="not a plugrt plan"):
        decode_plan(b"GARBAGE!" + data[8:], "x.plan")


def test_no_pickle_in_plans():
    with pytest.raises(PlanError, match="cannot store"):
        encode_plan({}, {"o": np.array([object()], dtype=object)})


def test_failed_write_leaves_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "m.plan")
    write_plan(path, {"v": 1}, {})
    import plugrt.engine.plan_file as pf

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pf.os, "replace", boom)
    with pytest.raises(OSError):
        write_plan(path, {"v": 2}, {})
    assert read_plan(path)[0]["v"] == 1 and os.listdir(tmp_path) == ["m.plan"]


def test_plan_keeps_zero_dimensional_arrays():
    from plugrt.engine.plan_file import decode_plan, encode_plan

    header, arrays = decode_plan(encode_plan({}, {"scalar": np.array(3, np.int64), "empty": np.zeros((0, 2))}))
    assert arrays["scalar"].shape == () and arrays["scalar"] == 3
    assert arrays["empty"].shape == (0, 2)
