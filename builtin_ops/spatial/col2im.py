"""CUDA tactic of Col2Im: one thread per image element gathers the block taps that land
on it (no atomics, so the sums are in tap order, as the reference adds them): tap ``k``
of block ``b`` lands at ``b * stride - pad + k * dilation`` along each axis.

Geometry travels in one int64 table (header, then one row per attribute, one entry per
spatial axis), so one compiled kernel per dtype serves every shape. float16 adds in
float32; integers add in their own type, wrapping as the reference's sums do.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import c_strides, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type

from .col2im_ops import block_counts

# Header of the geometry table, then per-axis rows each ``rank`` long.
_RANK, _TAPS, _LENGTH, _IMAGE_SIZE = range(4)
_HEADER = 4
_IMAGE, _COUNTS, _BLOCK, _STRIDE, _DILATION, _PAD, _COUNT_STRIDE = range(7)


@functools.lru_cache(maxsize=None)
def col2im_kernel(dtype: str):
    """``kernel(y, x, n_out, geo)``: ``y[i]`` the sum of the taps landing on image element
    ``i`` (Y viewed as (N * C, image size), X as (N * C, taps, L))."""
    _, npt, load = compute_type(dtype)
    zero = npt(0)

    @jit
    def kernel(y, x, n_out, geo):
        rank = geo[_RANK]
        taps = geo[_TAPS]
        length = geo[_LENGTH]
        image_size = geo[_IMAGE_SIZE]
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            pixel = i % image_size
            x_base = (i // image_size) * taps * length
            acc = zero
            for t in range(taps):
                rest_t = t
                rest_p = pixel
                col = 0
                inside = True
                for d in range(rank - 1, -1, -1):
                    k = geo[_HEADER + _BLOCK * rank + d]
                    kd = rest_t % k
                    rest_t //= k
                    size = geo[_HEADER + _IMAGE * rank + d]
                    position = rest_p % size
                    rest_p //= size
                    stride = geo[_HEADER + _STRIDE * rank + d]
                    q = position + geo[_HEADER + _PAD * rank + d] - kd * geo[_HEADER + _DILATION * rank + d]
                    if q < 0 or q % stride != 0:
                        inside = False
                        break
                    b = q // stride
                    if b >= geo[_HEADER + _COUNTS * rank + d]:
                        inside = False
                        break
                    col += b * geo[_HEADER + _COUNT_STRIDE * rank + d]
                if inside:
                    acc += load(x, x_base + t * length + col)
            y[i] = acc

    return kernel


def geometry_table(image, block, dilations, pads, strides, length: int) -> np.ndarray:
    """The int64 table the kernel reads."""
    r = len(image)
    counts = block_counts(image, block, dilations, pads, strides)
    head = [r, math.prod(block), length, math.prod(image)]
    rows = [image, counts, block, strides, dilations, pads[:r], c_strides(counts)]
    return np.concatenate([np.asarray(head, np.int64)] + [np.asarray(row, np.int64).reshape(r) for row in rows])


def col2im_tactic(data_info, y_info, image, block, dilations, pads, strides) -> Tactic:
    """The gather tactic of a Col2Im node with known image and block shapes."""
    n_out = math.prod(int(d) for d in y_info.shape)
    geo = geometry_table(image, block, dilations, pads, strides, int(data_info.shape[2]))
    dtype = np.dtype(data_info.dtype).str

    def launches(inputs, outputs, workspace):
        if n_out == 0:
            return []
        blocks, threads = grid_1d(n_out)
        args = (flat(outputs[0]), flat(inputs[0]), np.int64(n_out), to_device(geo))
        return [Launch(col2im_kernel(dtype), blocks, threads, args)]

    return Tactic("gather", launches, {})
