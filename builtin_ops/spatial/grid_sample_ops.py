"""GridSample (opset 16: 2-D, modes bilinear/nearest/bicubic; opset 20+: 1 to 3 spatial
dims, modes linear/nearest/cubic), as ONNX's reference computes it.

Each output position reads its normalized coordinates (x first, for the last spatial axis)
from the grid, maps them to input coordinates (``align_corners``), moves coordinates
outside the input per ``padding_mode`` (border: clamped; reflection: mirrored about the
borders), then interpolates from 1 (nearest, ties to even), 2 (linear) or 4 (cubic, Keys
a = -0.75) taps per axis; a tap outside the input reads 0 (zeros), the edge (border) or its
mirror image (reflection). The CUDA kernels are in :mod:`.grid_sample`.

Coordinates and weights are computed in float32, or in float64 when X or the grid is
float64 (ONNX's reference computes coordinates in float32 and weights in X's dtype; for a
float16 X it rounds every step to float16, where this computes in float32 and rounds once).
"""

from __future__ import annotations

import itertools

import numpy as np

from plugrt import ModelError
from plugrt.plugin import ALL_DTYPES, FLOAT_DTYPES, Attr, Example, OpPlugin, TensorInfo

#: The interpolation modes by opset: their names before opset 20, and from it.
_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
PADDING_MODES = ("zeros", "border", "reflection")
#: Taps per spatial axis of each (canonical) mode.
TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
#: Keys' cubic convolution coefficient, as PyTorch and ONNX use it.
CUBIC_A = -0.75
#: The most spatial dims the kernels take (a cubic 3-D sample reads 64 taps).
MAX_SPATIAL = 3


def coordinate_type(x_dtype, grid_dtype) -> np.dtype:
    """The type coordinates and weights are computed in."""
    wide = np.dtype(np.float64) in (np.dtype(x_dtype), np.dtype(grid_dtype))
    return np.dtype(np.float64 if wide else np.float32)


def reflect(x, low, high):
    """Mirror ``x`` about ``low`` and ``high`` until it lies between them (a span of 0
    gives ``low``, as PyTorch does)."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below, above = x < low, x > high
    dx = np.where(below, low - x, np.where(above, x - high, 0))
    flips = np.floor(dx / span)
    rest = dx - flips * span
    even = flips % 2 == 0
    from_below = np.where(even, low + rest, high - rest)
    from_above = np.where(even, high - rest, low + rest)
    return np.where(below, from_below, np.where(above, from_above, x)).astype(x.dtype)


def cubic_weights(t):
    """Keys' weights of the taps at -1, 0, 1, 2 from the floor, for a fraction ``t``."""
    a = t.dtype.type(CUBIC_A)
    one, two = t.dtype.type(1), t.dtype.type(2)
    far, near, next_near, next_far = t + one, t, one - t, two - t
    w0 = ((a * far - 5 * a) * far + 8 * a) * far - 4 * a
    w1 = ((a + 2) * near - (a + 3)) * near * near + one
    w2 = ((a + 2) * next_near - (a + 3)) * next_near * next_near + one
    w3 = ((a * next_far - 5 * a) * next_far + 8 * a) * next_far - 4 * a
    return [w0, w1, w2, w3]


def axis_taps(g, length: int, mode: str, padding: str, align: bool):
    """One spatial axis: ``[(index, weight, valid)]`` per tap, for normalized coordinates
    ``g`` (any shape); ``weight`` is ``None`` for nearest."""
    f = g.dtype.type
    if align:
        x = (g + f(1)) / f(2) * f(length - 1)
        low, high = f(0), f(length - 1)
    else:
        x = ((g + f(1)) * f(length) - f(1)) / f(2)
        low, high = f(-0.5), f(length - 0.5)
    if mode == "nearest":
        x = np.rint(x)
    outside = (x < low) | (x > high)
    if padding == "border":
        x = np.where(outside, np.clip(x, f(0), f(length - 1)), x)
    elif padding == "reflection":
        x = np.where(outside, reflect(x, low, high), x)
    if mode == "nearest":
        indices, weights = [np.trunc(x).astype(np.int64)], [None]
    else:
        base = np.floor(x)
        t = (x - base).astype(g.dtype)
        base = base.astype(np.int64)
        if mode == "linear":
            indices, weights = [base, base + 1], [f(1) - t, t]
        else:
            indices, weights = [base - 1, base, base + 1, base + 2], cubic_weights(t)
    taps = []
    for index, weight in zip(indices, weights):
        valid = np.ones(index.shape, bool)
        if padding == "zeros":
            valid = (index >= 0) & (index < length)
            index = np.where(valid, index, 0)
        elif padding == "border":
            index = np.clip(index, 0, length - 1)
        else:
            index = np.trunc(reflect(index.astype(g.dtype), low, high)).astype(np.int64)
        taps.append((index, weight, valid))
    return taps


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    """GridSample of ``x`` (N, C, D1..Dr) at ``grid`` (N, H1..Hr, r); ``mode`` canonical."""
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    out_spatial = grid.shape[1:-1]
    shape = (n, c, *out_spatial)
    if 0 in shape:
        return np.zeros(shape, x.dtype)
    ct = coordinate_type(x.dtype, grid.dtype)
    points = int(np.prod(out_spatial, dtype=np.int64))
    coords = grid.astype(ct).reshape(n, points, len(spatial))[:, :, ::-1]
    per_axis = [axis_taps(coords[:, :, d], length, mode, padding, align) for d, length in enumerate(spatial)]
    strides = [int(np.prod(spatial[d + 1:], dtype=np.int64)) for d in range(len(spatial))]
    source = x.reshape(n, c, -1)
    total = None
    for combo in itertools.product(*per_axis):
        offset = sum(index * stride for (index, _, _), stride in zip(combo, strides))
        valid = np.logical_and.reduce([v for _, _, v in combo])[:, None, :]
        values = np.take_along_axis(source, offset[:, None, :], axis=2)
        if mode == "nearest":
            return np.where(valid, values, np.zeros((), x.dtype)).reshape(shape)
        weight = np.prod([w for _, w, _ in combo], axis=0)[:, None, :]
        term = np.where(valid, values.astype(ct), ct.type(0)) * weight
        total = term if total is None else total + term
    return total.astype(x.dtype).reshape(shape)


class GridSample(OpPlugin):
    """Y (N, C, H1..Hr) sampled from X (N, C, D1..Dr) at the grid's (N, H1..Hr, r) points."""

    op_type = "GridSample"
    since_opset = 16
    attributes = (Attr("align_corners", "int", 0), Attr("mode", "string", None),
                  Attr("padding_mode", "string", "zeros"))
    inputs = (2, 2)
    dtypes = ALL_DTYPES

    def mode(self, node) -> str:
        """The canonical mode (nearest, linear, cubic) of the node's mode attribute."""
        names = _MODES_16 if node.opset < 20 else _MODES_20
        given = node.attrs["mode"] or ("bilinear" if node.opset < 20 else "linear")
        if given not in names:
            raise self.unsupported(node, f"mode={given!r} at opset {node.opset}", f"use one of {', '.join(names)}")
        return names[given]

    def check(self, node, inputs):
        x, grid = inputs
        mode = self.mode(node)
        if node.attrs["padding_mode"] not in PADDING_MODES:
            raise self.unsupported(node, f"padding_mode={node.attrs['padding_mode']!r}",
                                   f"use one of {', '.join(PADDING_MODES)}")
        self.require_dtypes(node, inputs, FLOAT_DTYPES, which=[1])
        if mode != "nearest":
            self.require_dtypes(node, inputs, FLOAT_DTYPES, which=[0])
        r = x.rank - 2
        if node.opset < 20 and x.rank != 4:
            raise self.unsupported(node, f"an input of rank {x.rank} at opset {node.opset}",
                                   "GridSample-16 samples 4-D inputs; opset 20 takes 3 to 5 dims")
        if not 1 <= r <= MAX_SPATIAL:
            raise self.unsupported(node, f"an input of rank {x.rank}",
                                   f"X is (N, C, D1..Dr) with 1 to {MAX_SPATIAL} spatial dims")
        if grid.rank != x.rank:
            raise ModelError(f"{node.describe()}: the grid has rank {grid.rank}, X rank {x.rank}; "
                             "the grid is (N, H1..Hr, r) for X (N, C, D1..Dr)")
        if isinstance(grid.shape[-1], int) and grid.shape[-1] != r:
            raise ModelError(f"{node.describe()}: the grid's last dim is {grid.shape[-1]}, "
                             f"it must be {r} (one coordinate per spatial dim of X)")
        if any(d == 0 for d in x.shape[2:]):
            raise self.unsupported(node, f"an input of shape {list(x.shape)} (an empty spatial dim)",
                                   "there is nothing to sample from")

    def infer(self, node, inputs):
        x, grid = inputs
        return [TensorInfo(x.dtype, (grid.shape[0], x.shape[1], *grid.shape[1:-1]))]

    def reference(self, node, inputs):
        x, grid = inputs
        return [grid_sample(x, grid, self.mode(node), node.attrs["padding_mode"], bool(node.attrs["align_corners"]))]

    def tactics(self, node, inputs, outputs):
        from .grid_sample import grid_sample_tactics

        x, grid = inputs
        return grid_sample_tactics(x, grid, outputs[0], self.mode(node), node.attrs["padding_mode"],
                                   bool(node.attrs["align_corners"]))

    def examples(self):
        f16, f32, f64 = (np.dtype(t) for t in ("float16", "float32", "float64"))
        wide = {1: (-1.3, 1.3)}  # some points outside the input, to exercise the padding modes
        return [Example((TensorInfo(f32, (2, 3, 4, 5)), TensorInfo(f32, (2, 3, 2, 2))), {}, opset=16, ranges=wide),
                Example((TensorInfo(f32, (1, 2, 5, 4)), TensorInfo(f32, (1, 4, 3, 2))),
                        {"mode": "bicubic", "padding_mode": "reflection", "align_corners": 1}, opset=16,
                        ranges=wide, rtol=1e-4, atol=1e-5),
                Example((TensorInfo(f16, (1, 3, 4, 4)), TensorInfo(f16, (1, 3, 3, 2))),
                        {"mode": "nearest", "padding_mode": "border"}, opset=20, ranges=wide, rtol=1e-3, atol=1e-3),
                Example((TensorInfo(np.dtype(np.int32), (1, 2, 3, 4)), TensorInfo(f32, (1, 2, 2, 2))),
                        {"mode": "nearest"}, opset=20, ranges=wide),
                Example((TensorInfo(f64, (1, 2, 3, 3, 4)), TensorInfo(f64, (1, 2, 2, 2, 3))),
                        {"mode": "linear", "padding_mode": "border", "align_corners": 1}, opset=20, ranges=wide),
                Example((TensorInfo(f32, (2, 2, 6)), TensorInfo(f32, (2, 5, 1))),
                        {"mode": "cubic", "padding_mode": "zeros"}, opset=22, ranges=wide, rtol=1e-4, atol=1e-5)]


OPS = (GridSample,)
