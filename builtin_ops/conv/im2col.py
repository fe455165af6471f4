"""A first layer's channels-last convolution as an explicit im2col and one GEMM.

A network's first convolution reads 3 channels (RGB; 1 for grayscale), which the
channels-last pass pads to 8 so that every pixel is one 16-byte chunk of FP16. The
implicit GEMM (:mod:`.wgmma_nhwc`) then gathers one tap per chunk and multiplies the zeros
too: ResNet-50's 7x7 stem has K = 7*7*8 = 392, of which 147 count. Here the K axis is
packed without the channels whose weights are all zero (what they read never counts,
whatever the input holds there) into a workspace matrix ``X_col [N*OH*OW, Kp]`` (``Kp`` =
kh*kw*C_used rounded up to whole chunks), one 16-byte chunk per thread
(:func:`im2col_kernel`), and the matmul family's GEMM multiplies it by the packed weight
``W_col [M, Kp]`` (K-contiguous, as ``wgmma`` reads it), the bias and the epilogue fused
at its store. :func:`im2col_tactics` offers it where packing drops at least a third of K.

Measured on an H100 (ResNet-50's stem at batch 32, FP16): 0.669 ms against the implicit
GEMM's 0.293 (TF32: 0.733 against 0.423): writing and reading ``X_col`` (122 MB) costs more
than the wasted MMAs save. So it comes after the implicit GEMM's tiles (timed at
optimization level 5), for the shapes where it may still win.
"""

from __future__ import annotations

import functools

import numpy as np

from numba import float32

from plugrt.kernels import VECTOR, Epilogue, cuda, elementwise_grid, flat, jit, to_device, vector8
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.matmul.plan import A_KC, K_, M_, META_LEN, N_, NB, OFFS_W, SAK, SAM, SBK, SBN, SCM, SCN, USE_C

from .geometry import (
    G2_C, G2_DH, G2_DW, G2_H, G2_KH, G2_KW, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH, G2_SW, G2_W, ConvGeometry,
    geometry_2d,
)

#: The im2col kernel's table: the 2-D geometry's slots, then the channels used and K's
#: packed and real lengths.
(IC_CU, IC_KP, IC_KR) = range(17, 20)
#: Packing must drop at least this share of K for the tactic to be offered.
MIN_DROPPED = 1 / 3
#: Workspace slices start on this many bytes.
ALIGN = 256


def used_channels(weight: np.ndarray | None) -> int | None:
    """How many leading input channels of a channels-last weight ``[M, kh, kw, C]`` have a
    nonzero weight somewhere (the rest are padding: never read); ``None`` without one."""
    if weight is None or np.ndim(weight) != 4:
        return None
    nonzero = np.flatnonzero(np.any(np.asarray(weight) != 0, axis=(0, 1, 2)))
    return int(nonzero[-1]) + 1 if nonzero.size else 1


def packed_weight(weight: np.ndarray, used: int, dtype) -> np.ndarray:
    """``W_col [M, Kp]``: each output channel's taps over the ``used`` channels, K in
    (kh, kw, c) order, zero past ``kh*kw*used``."""
    m = weight.shape[0]
    real = np.asarray(weight)[..., :used].reshape(m, -1)
    return np.ascontiguousarray(np.pad(real, [(0, 0), (0, -real.shape[1] % VECTOR)]).astype(dtype))


@functools.lru_cache(maxsize=None)
def im2col_kernel():
    """``col[p, k] = x[n, oh*sh - ph + r*dh, ow*sw - pw + s*dw, c]`` for ``k = (r, s, c)``
    below ``kh*kw*used`` (zero outside the image and past it), ``p = (n, oh, ow)``: one
    16-byte chunk of a row per thread, written in one vector store."""
    _, store8 = vector8()

    @jit
    def kernel(col, x, table, chunks):
        height, width, cin = table[G2_H], table[G2_W], table[G2_C]
        oh_size, ow_size, kw_size = table[G2_OH], table[G2_OW], table[G2_KW]
        sh, sw, dh, dw, ph, pw = table[G2_SH], table[G2_SW], table[G2_DH], table[G2_DW], table[G2_PH], table[G2_PW]
        used, per_row, real = table[IC_CU], table[IC_KP] // VECTOR, table[IC_KR]
        held = cuda.local.array(VECTOR, float32)
        for t in range(cuda.grid(1), chunks, cuda.gridsize(1)):
            p = t // per_row
            k0 = (t - p * per_row) * VECTOR
            ow = p % ow_size
            rest = p // ow_size
            oh = rest % oh_size
            n = rest // oh_size
            for e in range(VECTOR):
                k = k0 + e
                held[e] = float32(0)
                if k < real:
                    c = k % used
                    tap = k // used
                    ih = oh * sh - ph + (tap // kw_size) * dh
                    iw = ow * sw - pw + (tap % kw_size) * dw
                    if 0 <= ih < height and 0 <= iw < width:
                        held[e] = float32(x[((n * height + ih) * width + iw) * cin + c])
            store8(col, t * VECTOR, (held[0], held[1], held[2], held[3], held[4], held[5], held[6], held[7]))

    return kernel


def gemm_meta(pixels: int, out_channels: int, packed: int, has_bias: bool) -> np.ndarray:
    """The matmul family's ``meta`` of ``X_col [pixels, packed]`` by ``W_col [out_channels,
    packed]`` (K-contiguous), the bias as Gemm's C broadcast along rows."""
    meta = np.zeros(META_LEN, np.int64)
    meta[[NB, M_, N_, K_]] = 1, pixels, out_channels, packed
    meta[[SAM, SAK, SBK, SBN]] = packed, 1, 1, packed
    meta[A_KC] = 1
    if has_bias:
        meta[[USE_C, SCM, SCN]] = 1, 0, 1
    return meta


def im2col_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue, has_bias: bool, weight, gemms) -> list[Tactic]:
    """The explicit-im2col tactics of a 2-D, ungrouped ConvNHWC whose constant ``weight``
    (``[M, kh, kw, C]``) leaves at least :data:`MIN_DROPPED` of K unused, one per GEMM
    tactic ``gemms(meta, offs)`` gives for the packed product (a list, best first); none
    otherwise."""
    used = used_channels(weight)
    if used is None or geo.rank != 2 or geo.group != 1 or np.dtype(dtype) not in (np.float16, np.float32):
        return []
    table = geometry_2d(geo)
    taps = int(table[G2_KH] * table[G2_KW])
    real = taps * used
    packed = real + (-real % VECTOR)
    if packed > (1 - MIN_DROPPED) * taps * geo.in_channels:
        return []
    table = np.concatenate([table, np.asarray([used, packed, real], np.int64)])
    pixels = geo.batch * int(table[G2_OH] * table[G2_OW])
    col_bytes = -(-pixels * packed * np.dtype(dtype).itemsize // ALIGN) * ALIGN
    w_col = packed_weight(weight, used, dtype)
    kernel = im2col_kernel()
    found = []
    for gemm in gemms(gemm_meta(pixels, geo.out_channels, packed, has_bias), np.zeros(OFFS_W, np.int64)):
        found.append(_tactic(gemm, kernel, table, pixels, packed, col_bytes, w_col, dtype, epilogue))
    return found


def _tactic(gemm: Tactic, kernel, table, pixels: int, packed: int, col_bytes: int, w_col, dtype,
            epilogue: Epilogue) -> Tactic:
    chunks = pixels * packed // VECTOR

    def launches(ins, outs, workspace):
        if pixels == 0:
            return []
        col = workspace[:pixels * packed * np.dtype(dtype).itemsize].view(dtype)
        blocks, threads = elementwise_grid(chunks)
        gather = Launch(kernel, blocks, threads, (col, flat(ins[0]), to_device(table), np.int64(chunks)))
        rest = workspace[col_bytes:] if gemm.workspace_bytes else None
        own = [col, to_device(w_col)] + list(ins[2:])
        return [gather] + list(gemm.launches(own, outs, rest))

    params = {"gemm": gemm.name, "packed_k": packed, **gemm.params}
    return Tactic(f"im2col_{gemm.name}", launches, params, col_bytes + gemm.workspace_bytes, math=gemm.math)


__all__ = ["im2col_tactics", "im2col_kernel", "used_channels", "packed_weight", "gemm_meta"]
