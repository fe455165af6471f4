"""The per-axis and blocked tactic of QuantizeLinear and DequantizeLinear.

One grid-stride kernel applies the op's scalar device function (the same one the
per-tensor pointwise tactic uses, :mod:`.device_functions`) to every element, reading
its scale and zero point through the index map of :func:`.granularity.parameter_strides`
(per-axis: the element's coordinate along ``axis``; blocked: that coordinate over the
block size, in a scale of x's rank).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import int64

from plugrt.kernels import cuda, elementwise_grid, flat, jit, to_device
from plugrt.plugin import Launch, Tactic

from .granularity import Granularity, parameter_strides

# Slots of the index table.
_N, _DIM, _INNER, _BLOCK, _SO, _SB, _SI = range(7)


@functools.lru_cache(maxsize=None)
def _widen(dtype):
    """The load of one element as the scalar functions take it (float16 as float32)."""
    if np.dtype(dtype) == np.float16:
        @jit(device=True)
        def load_half(a, i):
            return np.float32(a[i])

        return load_half

    @jit(device=True)
    def load(a, i):
        return a[i]

    return load


@functools.lru_cache(maxsize=None)
def per_axis_kernel(fn, x_dtype, scale_dtype, with_zero_point: bool):
    """``y[i] = fn(x[i], scale[p(i)], zero_point[p(i)])`` (``zero_point`` not read
    without one) for the parameter index ``p`` the table describes."""
    load_x, load_scale = _widen(x_dtype), _widen(scale_dtype)

    @jit
    def per_axis(y, x, scale, zero_point, table):
        n, dim, inner, block = table[_N], table[_DIM], table[_INNER], table[_BLOCK]
        so, sb, si = table[_SO], table[_SB], table[_SI]
        for i in range(int64(cuda.grid(1)), n, int64(cuda.gridsize(1))):
            rest = i // inner
            p = (rest // dim) * so + ((rest % dim) // block) * sb + (i - rest * inner) * si
            if with_zero_point:
                y[i] = fn(load_x(x, i), load_scale(scale, p), zero_point[p])
            else:
                y[i] = fn(load_x(x, i), load_scale(scale, p))

    return per_axis


def per_axis_tactic(fn, x_info, scale_info, with_zero_point: bool, g: Granularity) -> Tactic:
    """The tactic of a per-axis or blocked node; ``fn`` is the op's scalar function."""
    kernel = per_axis_kernel(fn, np.dtype(x_info.dtype), np.dtype(scale_info.dtype), with_zero_point)
    table = parameter_strides(x_info.shape, g)
    n = int(table[_N])

    def launches(ins, outs, workspace):
        if n == 0:
            return []
        x, scale = flat(ins[0]), flat(ins[1])
        zero_point = flat(ins[2]) if with_zero_point else scale
        blocks, threads = elementwise_grid(n)
        return [Launch(kernel, blocks, threads, (flat(outs[0]), x, scale, zero_point, to_device(table)))]

    return Tactic(f"{g.kind}_quantization", launches, {"axis": g.axis, "block_size": g.block_size})
