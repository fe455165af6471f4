"""The depthwise tactic of Conv: one input channel per output channel (MobileNet's 3x3).

A Conv whose groups hold one input channel each (``C / group == 1``: depthwise, with any
channel multiplier ``M / group``) has no channel sum for a GEMM to tile. Here a thread
computes ``tw`` neighbouring outputs of one row: it keeps the channel's ``kh x kw``
weights in registers and, per window row, loads the input segment the ``tw`` windows
span once (``(tw - 1) * sw + (kw - 1) * dw + 1`` values) into registers, so a 3x3
stride-1 window with ``tw = 4`` reads 6 inputs per window row instead of 12.

The window geometry (kernel, stride, dilation) is compiled in, so the loops unroll; sizes
and pads come from the 2-D table of :mod:`.geometry` (a 1-D node runs with H = 1).
The epilogue (:class:`plugrt.kernels.Epilogue`) is applied at the store, once per output.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import int64

from plugrt.kernels import Epilogue, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic

from .geometry import (
    G2_C, G2_CG, G2_DH, G2_DW, G2_H, G2_KH, G2_KW, G2_M, G2_MG, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH, G2_SW, G2_W,
    ConvGeometry, bias_or_dummy, compute_type, geometry_2d,
)

#: Outputs per thread along W offered, best guess first when the row is long enough.
OUTPUTS_PER_THREAD = (4, 1)
#: Register arrays past these sizes would spill: such windows get no depthwise tactic.
MAX_TAPS = 64
MAX_SEGMENT = 64


@functools.lru_cache(maxsize=None)
def depthwise_kernel(acc, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, tw: int, epilogue_fn):
    """``tw`` outputs of one row per thread; ``n_items`` counts (n, m, oh, W tile)."""
    taps = kh * kw
    segment = (tw - 1) * sw + (kw - 1) * dw + 1

    @jit
    def depthwise(y, x, w, b, has_bias, n_items, geo, operands):
        cin, height, width = geo[G2_C], geo[G2_H], geo[G2_W]
        cout, mg = geo[G2_M], geo[G2_MG]
        oh_size, ow_size = geo[G2_OH], geo[G2_OW]
        ph, pw = geo[G2_PH], geo[G2_PW]
        ow_tiles = (ow_size + tw - 1) // tw
        weights = cuda.local.array(taps, acc)
        row = cuda.local.array(segment, acc)
        total = cuda.local.array(tw, acc)
        for i in range(cuda.grid(1), n_items, cuda.gridsize(1)):
            ow0 = (i % ow_tiles) * tw
            rest = i // ow_tiles
            oh = rest % oh_size
            rest //= oh_size
            m = rest % cout
            n = rest // cout
            channel = m // mg  # one input channel per group: channel g feeds outputs g*mg ... g*mg + mg - 1
            for t in range(taps):
                weights[t] = acc(w[m * taps + t])
            for t in range(tw):
                total[t] = acc(0)
            iw0 = ow0 * sw - pw
            x_plane = (n * cin + channel) * height
            for r in range(kh):
                ih = oh * sh - ph + r * dh
                if ih >= 0 and ih < height:
                    x_row = (x_plane + ih) * width
                    for s in range(segment):
                        iw = iw0 + s
                        value = acc(0)
                        if iw >= 0 and iw < width:
                            value = acc(x[x_row + iw])
                        row[s] = value
                    for t in range(tw):
                        for c in range(kw):
                            total[t] += row[t * sw + c * dw] * weights[r * kw + c]
            bias = acc(0)
            if has_bias != 0:
                bias = acc(b[m])
            for t in range(tw):
                ow = ow0 + t
                if ow < ow_size:
                    o = ((n * cout + m) * oh_size + oh) * ow_size + ow
                    y[o] = epilogue_fn(total[t] + bias, int64(o), operands)

    return depthwise


def applies(geo: ConvGeometry) -> bool:
    """Depthwise form (one input channel per group), 1-D or 2-D, a window small enough."""
    if geo.transposed or geo.rank not in (1, 2) or geo.in_channels != geo.group:
        return False
    table = geometry_2d(geo)
    segment = (OUTPUTS_PER_THREAD[0] - 1) * table[G2_SW] + (table[G2_KW] - 1) * table[G2_DW] + 1
    return int(table[G2_KH] * table[G2_KW]) <= MAX_TAPS and int(segment) <= MAX_SEGMENT


def depthwise_tactic(geo: ConvGeometry, dtype, epilogue: Epilogue, tw: int) -> Tactic:
    """The depthwise tactic with ``tw`` outputs per thread (:func:`applies` must hold)."""
    assert applies(geo)
    table = geometry_2d(geo)
    assert table[G2_CG] == 1
    kernel = depthwise_kernel(compute_type(dtype), int(table[G2_KH]), int(table[G2_KW]), int(table[G2_SH]),
                              int(table[G2_SW]), int(table[G2_DH]), int(table[G2_DW]), tw, epilogue.fn)
    ow_tiles = -(-int(table[G2_OW]) // tw)
    n_items = geo.out_size // max(int(table[G2_OW]), 1) * ow_tiles

    def launches(ins, outs, workspace):
        if geo.out_size == 0:
            return []
        own = ins[:epilogue.first]
        bias = own[2] if len(own) > 2 else None
        blocks, threads = grid_1d(n_items)
        args = (flat(outs[0]), flat(own[0]), flat(own[1]), bias_or_dummy(bias, dtype), np.int64(bias is not None),
                np.int64(n_items), to_device(table), epilogue.arguments(ins))
        return [Launch(kernel, blocks, threads, args)]

    return Tactic(f"depthwise_w{tw}", launches, {"outputs_per_thread": tw})


def depthwise_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue) -> list[Tactic]:
    """The depthwise tactics of the node, more outputs per thread first when the output
    row has room for them; none when :func:`applies` fails."""
    if not applies(geo):
        return []
    width = int(geometry_2d(geo)[G2_OW])
    return [depthwise_tactic(geo, dtype, epilogue, tw) for tw in OUTPUTS_PER_THREAD if tw == 1 or width >= tw]
