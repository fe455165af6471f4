"""The CUDA tactic of RotaryEmbedding: ``y = x * cos + rotate_half(x) * sin`` in one pass.

One thread per pair of elements half a row apart (``c`` and ``c + half`` of the last
axis): it reads both, and writes ``x0 * cos - x1 * sin`` and ``x1 * cos' + x0 * sin'``, so
X is read once and the rotation costs no extra traffic. cos and sin broadcast to X: the
pair's row is decoded into their offsets through a small table of X's leading dims and
their strides (dims where both broadcast alike merged, so ``[1, 1, S, D]`` tables over
``[B, H, S, D]`` decode two dims, not three). float16 computes in float32.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import broadcast_strides, cuda, elementwise_grid, flat, jit, to_device
from plugrt.plugin import Launch, Tactic

# Rows of the geometry table, one column per (merged) leading dim of X.
SIZE, COS_STRIDE, SIN_STRIDE = range(3)


def accumulator(dtype) -> np.dtype:
    """float64 for float64 data, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


@functools.lru_cache(maxsize=None)
def rotary_kernel(acc_name: str):
    """Pairs ``p`` in a grid-stride loop: row ``p // half``, column ``c = p % half``."""
    acc = np.dtype(acc_name).type

    @jit
    def kernel(y, x, cos, sin, pairs, half, ndim, geo, cos_last, sin_last):
        for p in range(cuda.grid(1), pairs, cuda.gridsize(1)):
            row = p // half
            c = p - row * half
            i0 = row * 2 * half + c
            i1 = i0 + half
            oc = c * cos_last
            os = c * sin_last
            r = row
            for k in range(ndim - 1, -1, -1):
                j = r % geo[SIZE, k]
                r //= geo[SIZE, k]
                oc += j * geo[COS_STRIDE, k]
                os += j * geo[SIN_STRIDE, k]
            x0 = acc(x[i0])
            x1 = acc(x[i1])
            y[i0] = x0 * acc(cos[oc]) - x1 * acc(sin[os])
            y[i1] = x1 * acc(cos[oc + half * cos_last]) + x0 * acc(sin[os + half * sin_last])

    return kernel


def geometry(x_shape, cos_shape, sin_shape) -> tuple[np.ndarray, int, int, int]:
    """(table of X's leading dims and cos/sin strides, its number of dims, cos's and sin's
    last-axis strides).

    Adjacent dims merge where both strides of each of cos and sin continue each other
    (contiguous, or broadcast along both); dims of size 1 go.
    """
    cos_strides = broadcast_strides(cos_shape, x_shape)
    sin_strides = broadcast_strides(sin_shape, x_shape)
    dims: list[list[int]] = []
    for k in range(len(x_shape) - 1):
        size, cs, ss = int(x_shape[k]), int(cos_strides[k]), int(sin_strides[k])
        if size == 1:
            continue
        if dims and dims[-1][1] == cs * size and dims[-1][2] == ss * size:
            dims[-1] = [dims[-1][0] * size, cs, ss]
        else:
            dims.append([size, cs, ss])
    table = np.array(dims, dtype=np.int64).T if dims else np.ones((3, 1), np.int64)
    return np.ascontiguousarray(table), len(dims), int(cos_strides[-1]), int(sin_strides[-1])


def rotary_tactics(x_info, cos_info, sin_info) -> list[Tactic]:
    """The pair kernel over X of any rank >= 1 with an even last axis."""
    shape = tuple(int(d) for d in x_info.shape)
    half = shape[-1] // 2
    pairs = int(np.prod(shape, dtype=np.int64)) // 2
    table, ndim, cos_last, sin_last = geometry(shape, tuple(int(d) for d in cos_info.shape),
                                               tuple(int(d) for d in sin_info.shape))
    kernel = rotary_kernel(accumulator(x_info.dtype).name)

    def launches(inputs, outputs, workspace):
        if pairs == 0:
            return []
        blocks, threads = elementwise_grid(pairs)
        args = (flat(outputs[0]), flat(inputs[0]), flat(inputs[1]), flat(inputs[2]), np.int64(pairs),
                np.int64(half), np.int64(ndim), to_device(table), np.int64(cos_last), np.int64(sin_last))
        return [Launch(kernel, blocks, threads, args)]

    return [Tactic("pairs", launches)]
