"""The CUDA tactic of Pad: constant, edge, reflect and wrap, with cropping by negative pads.

Pure data movement: the kernel copies elements of any dtype (bool included) and takes
every shape from small int64 device tables, so one compiled kernel per mode serves all.
"""

from __future__ import annotations

import functools

import numpy as np

from numba import float32

from plugrt.kernels import VECTOR, aligned, c_strides, cuda, flat, grid_1d, jit, to_device, vector8
from plugrt.plugin import Launch, Tactic

PAD_MODES = {"constant": 0, "edge": 1, "reflect": 2, "wrap": 3}
# Rows of Pad's geometry table, one column per axis.
OUT_SIZE, IN_STRIDE, CROP_BEGIN, KEPT, GROW_BEGIN = range(5)


@functools.lru_cache(maxsize=None)
def pad_kernel(mode: str):
    """``y[i] = x[source(i)]``, or ``fill[0]`` where the constant mode falls outside.

    Per axis the output coordinate ``o`` maps to ``c = o - GROW_BEGIN`` in the cropped
    input of ``KEPT`` elements (negative pads crop first, as the reference does), then
    ``c`` is folded back into ``[0, KEPT)`` as the mode says (np.pad's semantics).
    """
    code = PAD_MODES[mode]

    @jit
    def kernel(y, x, fill, n, ndim, geo):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = i
            off = 0
            outside = False
            for d in range(ndim - 1, -1, -1):
                o = r % geo[OUT_SIZE, d]
                r //= geo[OUT_SIZE, d]
                m = geo[KEPT, d]
                c = o - geo[GROW_BEGIN, d]
                if c < 0 or c >= m:
                    if code == 0:
                        outside = True
                        c = 0
                    elif code == 1:
                        c = min(max(c, 0), m - 1)
                    elif code == 2:
                        if m == 1:
                            c = 0
                        else:
                            period = 2 * (m - 1)
                            c = c % period
                            if c >= m:
                                c = period - c
                    else:
                        c = c % m
                off += (c + geo[CROP_BEGIN, d]) * geo[IN_STRIDE, d]
            if outside:
                y[i] = fill[0]
            else:
                y[i] = x[off]

    return kernel


@functools.lru_cache(maxsize=None)
def row_pad_kernel():
    """``y[r, j] = x[r, j - begin]`` inside the row's copy, ``fill[0]`` outside: rows of
    ``width`` grown to ``out_width`` (one division per element instead of one per axis)."""

    @jit
    def kernel(y, x, fill, n, width, out_width, begin):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = i // out_width
            c = i - r * out_width - begin
            if c >= 0 and c < width:
                y[i] = x[r * width + c]
            else:
                y[i] = fill[0]

    return kernel


@functools.lru_cache(maxsize=None)
def row_pad_vector_kernel():
    """:func:`row_pad_kernel` by 16-byte vectors: a thread per eight consecutive outputs
    (float16 or float32; a vector may span rows narrower than eight, as an image's 3
    channels padded to 4), one vector store each, one division per vector."""
    _, store8 = vector8()

    @jit
    def kernel(y, x, fill, chunks, width, out_width, begin):
        held = cuda.local.array(VECTOR, float32)
        for t in range(cuda.grid(1), chunks, cuda.gridsize(1)):
            r = (t * VECTOR) // out_width
            column = t * VECTOR - r * out_width
            for e in range(VECTOR):
                if column == out_width:
                    column = 0
                    r += 1
                c = column - begin
                held[e] = float32(x[r * width + c]) if c >= 0 and c < width else float32(fill[0])
                column += 1
            store8(y, t * VECTOR, (held[0], held[1], held[2], held[3], held[4], held[5], held[6], held[7]))

    return kernel


def pad_tactics(x_info, y_info, pairs, mode: str, fill_value=None, fill_input: int | None = None) -> list[Tactic]:
    """Pad's tactics: the row kernel where only the last axis grows with a constant (a
    channels-last image's channels padded), first, by 16-byte vectors where the output is
    whole vectors of float16 or float32 (ResNet-50's 3 -> 8 input channels, or 3 -> 4 where
    its stem reads pairs of pixels); then :func:`pad_tactic`."""
    found = [pad_tactic(x_info, y_info, pairs, mode, fill_value, fill_input)]
    pairs = [(int(b), int(e)) for b, e in pairs]
    if mode != "constant" or not pairs or any(b or e for b, e in pairs[:-1]) or min(pairs[-1]) < 0:
        return found
    width, out_width = int(x_info.shape[-1]), int(y_info.shape[-1])
    n = int(np.prod([int(d) for d in y_info.shape], dtype=np.int64))
    dtype = np.dtype(x_info.dtype)
    fill_value = np.zeros((), dtype) if fill_value is None and fill_input is None else fill_value

    def launcher(vector: bool):
        """The row kernel's launches, by vectors where ``vector`` (the plain ones on an
        output not 16-byte aligned)."""
        def launches(inputs, outputs, workspace):
            if vector and not aligned(outputs[0]):
                return launcher(False)(inputs, outputs, workspace)
            fill = (to_device(np.asarray(fill_value, dtype).reshape(1)) if fill_value is not None
                    else flat(inputs[fill_input]))
            items = n // VECTOR if vector else n
            blocks, threads = grid_1d(items)
            args = (flat(outputs[0]), flat(inputs[0]), fill, np.int64(items), np.int64(width), np.int64(out_width),
                    np.int64(pairs[-1][0]))
            kernel = row_pad_vector_kernel() if vector else row_pad_kernel()
            return [Launch(kernel, blocks, threads, args)] if n else []
        return launches

    rows = Tactic("rows", launcher(False), {"mode": mode})
    if n % VECTOR or dtype not in (np.float16, np.float32):
        return [rows] + found
    return [Tactic("rows_vec8", launcher(True), {"mode": mode}), rows] + found


def pad_tactic(x_info, y_info, pairs, mode: str, fill_value=None, fill_input: int | None = None) -> Tactic:
    """The direct tactic of Pad for per-axis ``(begin, end)`` pairs.

    The constant comes from ``fill_value`` (a host scalar known at build) or, when that is
    ``None``, from input ``fill_input`` on the device (read by the kernel, so it may
    change between runs); with neither, zero.
    """
    dtype = np.dtype(x_info.dtype)
    x_shape = tuple(int(d) for d in x_info.shape)
    y_shape = tuple(int(d) for d in y_info.shape)
    ndim = len(x_shape)
    table = np.zeros((5, max(ndim, 1)), np.int64)
    table[OUT_SIZE] = 1
    if ndim:
        table[OUT_SIZE, :ndim] = y_shape
        table[IN_STRIDE, :ndim] = c_strides(x_shape)
        for d, (b, e) in enumerate(pairs):
            b, e = int(b), int(e)
            table[CROP_BEGIN, d] = max(-b, 0)
            table[KEPT, d] = x_shape[d] - max(-b, 0) - max(-e, 0)
            table[GROW_BEGIN, d] = max(b, 0)
    n = int(np.prod(y_shape, dtype=np.int64))
    if fill_value is None and fill_input is None:
        fill_value = np.zeros((), dtype)

    def launches(inputs, outputs, workspace):
        if fill_value is not None:
            fill = to_device(np.asarray(fill_value, dtype).reshape(1))
        else:
            fill = flat(inputs[fill_input])
        blocks, threads = grid_1d(n)
        args = (flat(outputs[0]), flat(inputs[0]), fill, np.int64(n), np.int64(ndim), to_device(table))
        return [Launch(pad_kernel(mode), blocks, threads, args)]

    return Tactic("direct", launches, {"mode": mode})
