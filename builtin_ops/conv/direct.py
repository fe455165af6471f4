"""CUDA tactics of Conv and ConvTranspose: direct kernels, one thread per output element.

- ``direct``: any spatial rank (up to :data:`MAX_RANK`), groups, strides, dilations and
  begin pads (negative pads crop); Conv and ConvTranspose (gather form: an output element
  sums the input positions whose strided, dilated taps land on it).
- ``direct2d``: one or two spatial dims, geometry as scalars in one table and the kernel
  window walked by nested loops; ConvTranspose's fast path, and Conv's for depthwise and
  small-group convolutions, where an implicit GEMM's channel tile would be mostly empty.

Geometry travels in one small int64 device table per node (:func:`geometry_table`, or
:func:`.geometry.geometry_2d` for ``direct2d``), so one compiled kernel serves every shape
and attribute (kernels are compiled per epilogue function, which every tactic applies at
its store: ``y[i] = fn(value, i, operands)``, see :class:`plugrt.kernels.Epilogue`).
float16 loads widen to float32 and accumulate in float32; float64 accumulates in float64.
The implicit-GEMM tactic lives in :mod:`.implicit_gemm`.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import int64

from plugrt.kernels import Epilogue, c_strides, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic

from .geometry import (
    G2_C, G2_CG, G2_DH, G2_DW, G2_H, G2_KH, G2_KW, G2_M, G2_MG, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH, G2_SW, G2_W,
    ConvGeometry, bias_or_dummy, compute_type, geometry_2d,
)

#: The most spatial dims the ``direct`` kernels take (their per-thread coordinate array).
MAX_RANK = 8

# Header of the generic geometry table; per-dim rows follow, each ``rank`` long.
_N, _C, _M, _CG, _MG, _RANK = range(6)
_HEADER = 6
_IN, _KERNEL, _OUT, _STRIDE, _DILATION, _PAD, _IN_STRIDE = range(7)


def geometry_table(geo: ConvGeometry) -> np.ndarray:
    """The int64 table of the ``direct`` kernels: header, then one row per attribute."""
    r = geo.rank
    head = [geo.batch, geo.in_channels, geo.out_channels, geo.in_channels // geo.group,
            geo.out_channels // geo.group, r]
    rows = [geo.in_spatial, geo.kernel, geo.out_spatial, geo.strides, geo.dilations, geo.pads,
            c_strides(geo.in_spatial)]
    return np.concatenate([np.asarray(head, np.int64)] + [np.asarray(row, np.int64).reshape(r) for row in rows])


# --------------------------------------------------------------------------- kernels


@functools.lru_cache(maxsize=None)
def direct_kernel(acc, transposed: bool, epilogue_fn):
    """``y[i] = epilogue(sum over (c, taps) x * w (+ b))`` for one output element per thread."""

    @jit
    def conv(y, x, w, b, has_bias, n_out, geo, operands):
        rank = geo[_RANK]
        cin, cout, cg, mg = geo[_C], geo[_M], geo[_CG], geo[_MG]
        in_size = int64(1)
        taps = int64(1)
        for d in range(rank):
            in_size *= geo[_HEADER + _IN * rank + d]
            taps *= geo[_HEADER + _KERNEL * rank + d]
        origin = cuda.local.array(MAX_RANK, int64)
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            rest = i
            for d in range(rank - 1, -1, -1):
                size = geo[_HEADER + _OUT * rank + d]
                o = rest % size
                rest //= size
                if transposed:
                    origin[d] = o + geo[_HEADER + _PAD * rank + d]
                else:
                    origin[d] = o * geo[_HEADER + _STRIDE * rank + d] - geo[_HEADER + _PAD * rank + d]
            m = rest % cout
            n = rest // cout
            g = m // mg
            total = acc(0)
            for c in range(cg):
                channel = g * cg + c
                x_base = (n * cin + channel) * in_size
                if transposed:
                    w_base = (channel * mg + (m - g * mg)) * taps
                else:
                    w_base = (m * cg + c) * taps
                for t in range(taps):
                    rest_t = t
                    offset = int64(0)
                    inside = True
                    for d in range(rank - 1, -1, -1):
                        k = geo[_HEADER + _KERNEL * rank + d]
                        kd = rest_t % k
                        rest_t //= k
                        step = kd * geo[_HEADER + _DILATION * rank + d]
                        if transposed:
                            pos = origin[d] - step
                            stride = geo[_HEADER + _STRIDE * rank + d]
                            if pos < 0 or pos % stride != 0:
                                inside = False
                                break
                            pos //= stride
                        else:
                            pos = origin[d] + step
                        if pos < 0 or pos >= geo[_HEADER + _IN * rank + d]:
                            inside = False
                            break
                        offset += pos * geo[_HEADER + _IN_STRIDE * rank + d]
                    if inside:
                        total += acc(x[x_base + offset]) * acc(w[w_base + t])
            if has_bias != 0:
                total += acc(b[m])
            y[i] = epilogue_fn(total, int64(i), operands)

    return conv


@functools.lru_cache(maxsize=None)
def direct2d_kernel(acc, transposed: bool, epilogue_fn):
    """1 or 2 spatial dims, one output element per thread, the window by nested loops.

    ConvTranspose gathers: output row ``oh`` takes input row ``(oh + ph - kh * dh) / sh``
    for each tap ``kh`` where that division is exact and lands inside the input.
    """

    @jit
    def conv2d(y, x, w, b, has_bias, n_out, geo, operands):
        cin, height, width = geo[G2_C], geo[G2_H], geo[G2_W]
        cout, cg, mg = geo[G2_M], geo[G2_CG], geo[G2_MG]
        oh_size, ow_size = geo[G2_OH], geo[G2_OW]
        kh_size, kw_size = geo[G2_KH], geo[G2_KW]
        sh, sw, dh, dw, ph, pw = geo[G2_SH], geo[G2_SW], geo[G2_DH], geo[G2_DW], geo[G2_PH], geo[G2_PW]
        taps = kh_size * kw_size
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            ow = i % ow_size
            rest = i // ow_size
            oh = rest % oh_size
            rest //= oh_size
            m = rest % cout
            n = rest // cout
            g = m // mg
            total = acc(0)
            for c in range(cg):
                channel = g * cg + c
                x_plane = (n * cin + channel) * height
                if transposed:
                    w_base = (channel * mg + (m - g * mg)) * taps
                else:
                    w_base = (m * cg + c) * taps
                for kh in range(kh_size):
                    if transposed:
                        ih = oh + ph - kh * dh
                        if ih < 0 or ih % sh != 0:
                            continue
                        ih //= sh
                    else:
                        ih = oh * sh - ph + kh * dh
                    if ih < 0 or ih >= height:
                        continue
                    x_row = (x_plane + ih) * width
                    w_row = w_base + kh * kw_size
                    for kw in range(kw_size):
                        if transposed:
                            iw = ow + pw - kw * dw
                            if iw < 0 or iw % sw != 0:
                                continue
                            iw //= sw
                        else:
                            iw = ow * sw - pw + kw * dw
                        if iw >= 0 and iw < width:
                            total += acc(x[x_row + iw]) * acc(w[w_row + kw])
            if has_bias != 0:
                total += acc(b[m])
            y[i] = epilogue_fn(total, int64(i), operands)

    return conv2d


# --------------------------------------------------------------------------- tactics


def _direct_launches(kernel, geo: ConvGeometry, dtype, table: np.ndarray, epilogue: Epilogue):
    """The ``launches`` of a one-thread-per-output kernel: X, W, B from the node's own
    inputs, the epilogue's operands as the last argument."""
    n_out = geo.out_size

    def launches(ins, outs, workspace):
        if n_out == 0:
            return []
        own = ins[:epilogue.first]
        bias = own[2] if len(own) > 2 else None
        blocks, threads = grid_1d(n_out)
        args = (flat(outs[0]), flat(own[0]), flat(own[1]), bias_or_dummy(bias, dtype), np.int64(bias is not None),
                np.int64(n_out), to_device(table), epilogue.arguments(ins))
        return [Launch(kernel, blocks, threads, args)]

    return launches


def direct_tactic(geo: ConvGeometry, dtype, epilogue: Epilogue) -> Tactic:
    """The generic tactic: any rank, Conv or ConvTranspose."""
    kernel = direct_kernel(compute_type(dtype), geo.transposed, epilogue.fn)
    return Tactic("direct", _direct_launches(kernel, geo, dtype, geometry_table(geo), epilogue), {"rank": geo.rank})


def direct2d_tactic(geo: ConvGeometry, dtype, epilogue: Epilogue) -> Tactic:
    """Conv or ConvTranspose with 1 or 2 spatial dims (see :func:`direct2d_kernel`)."""
    assert geo.rank in (1, 2)
    kernel = direct2d_kernel(compute_type(dtype), geo.transposed, epilogue.fn)
    return Tactic("direct2d", _direct_launches(kernel, geo, dtype, geometry_2d(geo), epilogue), {})
