"""The conversions a context keeps between runs (:class:`plugrt.engine.feeds.Conversions`):
the same device object fed again is not converted again, while anything that could make
the kept conversion wrong converts afresh: another object, the same object describing
other memory, a conversion that copied the data, and NumPy arrays (their contents are read
on every run)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.engine.feeds import Conversions


class CudaArrayLike:
    """A CuPy- or PyTorch-like array: only ``__cuda_array_interface__``."""

    def __init__(self, pointer: int, shape=(2, 3)):
        self.__cuda_array_interface__ = {"data": (pointer, False), "shape": shape, "strides": None,
                                         "typestr": "<f4", "version": 3}


class Counting:
    """A convert function that counts its calls; wraps (same memory) or copies."""

    def __init__(self, copies: bool = False):
        self.calls, self.copies = 0, copies

    def __call__(self, name, value):
        self.calls += 1
        if isinstance(value, np.ndarray):
            return value
        pointer = value.__cuda_array_interface__["data"][0]
        return CudaArrayLike(pointer + 4096 if self.copies else pointer, value.__cuda_array_interface__["shape"])


def test_the_same_device_object_is_converted_once():
    conversions, convert = Conversions(), Counting()
    x = CudaArrayLike(1 << 20)
    first = conversions.get("x", x, convert)
    assert conversions.get("x", x, convert) is first
    assert convert.calls == 1
    assert conversions.get(("output", "x"), x, convert) is not first  # outputs are kept apart from inputs
    assert convert.calls == 2


@pytest.mark.parametrize("change", ["another object", "moved", "reshaped"])
def test_anything_that_could_change_the_memory_converts_afresh(change):
    conversions, convert = Conversions(), Counting()
    x = CudaArrayLike(1 << 20)
    first = conversions.get("x", x, convert)
    if change == "another object":
        x = CudaArrayLike(1 << 20)
    elif change == "moved":  # a PyTorch tensor given other storage in place
        x.__cuda_array_interface__ = dict(x.__cuda_array_interface__, data=(1 << 21, False))
    else:
        x.__cuda_array_interface__ = dict(x.__cuda_array_interface__, shape=(3, 2))
    again = conversions.get("x", x, convert)
    assert convert.calls == 2 and again is not first
    assert again.__cuda_array_interface__["data"][0] == x.__cuda_array_interface__["data"][0]


def test_a_copying_conversion_and_numpy_arrays_are_never_kept():
    conversions, convert = Conversions(), Counting(copies=True)
    x = CudaArrayLike(1 << 20)
    conversions.get("x", x, convert)
    conversions.get("x", x, convert)
    assert convert.calls == 2  # a copy of the data would go stale when the caller writes new data
    host, count = np.random.default_rng(0).standard_normal((2, 3)), Counting()
    for _ in range(3):
        assert conversions.get("h", host, count) is host
    assert count.calls == 3
