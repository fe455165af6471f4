"""CUDA kernels of ConvInteger: int8/uint8 convolutions accumulating in int32.

- ``direct``: one thread per output element, any spatial rank; zero points subtracted on
  load, padding contributes nothing. The plainly-correct tactic, first in the simulator.
- ``implicit_gemm``: 1-D/2-D convolutions as a GEMM per group, rows the output positions
  (batch included), columns the group's output channels, K = in-channels x kernel taps.
  A block stages a ``bm x bk`` tile of im2col rows and a ``bn x bk`` tile of weights in
  shared memory, four K values packed in each uint32 word (the weights read a word at a
  time where K is a multiple of 4), and every thread multiplies a
  ``tm x tn`` register tile with :func:`.dp4a.dot4` (``dp4a`` on the GPU, its plain
  sibling in the simulator). It multiplies raw bytes (a padded input reads as the input's
  zero point) and corrects once at the store: ``sum (x - zx)(w - zw) = sum x w
  - zw sum x - zx sum w + K zx zw``, the row and column sums taken by ``dp4a`` against
  ones, only for zero points present.

The input's K offsets come from a small table per node (:func:`tap_table`: per K index the
channel offset and the dilated kernel offset along each spatial axis), so no kernel
divides by the kernel's shape. Every kernel stores ``y[i] = epilogue.fn(acc, i, operands)``
with ``acc`` the int32 accumulator (:class:`plugrt.kernels.Epilogue`); ``y`` may be int32,
int8 or a float (what the fused chain ends in).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import int32, int64, uint32

from plugrt.kernels import c_strides, cuda, jit

from .dp4a import ONES, dot4, pack4

#: The most spatial dims of the direct kernel (its per-thread coordinate array).
MAX_RANK = 8

# The direct kernel's table: a header, then rows of ``rank`` values.
_N, _C, _M, _CG, _MG, _RANK, _K, _IN_SIZE = range(8)
_HEADER = 8
_IN, _OUT, _STRIDE, _PAD, _IN_STRIDE = range(5)

# The implicit GEMM's table (1-D runs as H = 1).
(G_C, G_H, G_W, G_M, G_CG, G_MG, G_OH, G_OW, G_SH, G_SW, G_PH, G_PW, G_K, G_ROWS) = range(14)


def tap_table(geo) -> np.ndarray:
    """Per K index ``k = (c, k1, .., kr)`` (C order over the group's channels and the
    kernel): ``[c * in_size, k1 * d1, .., kr * dr]`` (int64, ``K x (1 + rank)``)."""
    rank = geo.rank
    cg = geo.in_channels // geo.group
    in_size = int(np.prod(geo.in_spatial, dtype=np.int64))
    taps = np.indices((cg,) + tuple(geo.kernel)).reshape(1 + rank, -1).T.astype(np.int64)
    taps[:, 0] *= in_size
    taps[:, 1:] *= np.asarray(geo.dilations, np.int64)
    return np.ascontiguousarray(taps)


def direct_table(geo) -> np.ndarray:
    head = [geo.batch, geo.in_channels, geo.out_channels, geo.in_channels // geo.group,
            geo.out_channels // geo.group, geo.rank, (geo.in_channels // geo.group) * int(np.prod(geo.kernel)),
            int(np.prod(geo.in_spatial, dtype=np.int64))]
    rows = [geo.in_spatial, geo.out_spatial, geo.strides, geo.pads, c_strides(geo.in_spatial)]
    return np.concatenate([np.asarray(head, np.int64)] + [np.asarray(r, np.int64).reshape(geo.rank) for r in rows])


def gemm_table(geo) -> np.ndarray:
    """The implicit GEMM's int64 table; a 1-D node gets a unit H axis."""
    def pad2(values, fill):
        values = tuple(int(v) for v in values)
        return ((fill,) + values) if len(values) == 1 else values

    h, w = pad2(geo.in_spatial, 1)
    oh, ow = pad2(geo.out_spatial, 1)
    sh, sw = pad2(geo.strides, 1)
    ph, pw = pad2(geo.pads, 0)
    cg = geo.in_channels // geo.group
    k = cg * int(np.prod(geo.kernel))
    return np.asarray([geo.in_channels, h, w, geo.out_channels, cg, geo.out_channels // geo.group, oh, ow, sh, sw,
                       ph, pw, k, geo.batch * oh * ow], np.int64)


def gemm_taps(geo) -> np.ndarray:
    """:func:`tap_table` as the implicit GEMM reads it: ``[c * H * W, kh * dh, kw * dw]``."""
    taps = tap_table(geo)
    if geo.rank == 1:
        taps = np.concatenate([taps[:, :1], np.zeros((len(taps), 1), np.int64), taps[:, 1:]], axis=1)
    return np.ascontiguousarray(taps)


# --------------------------------------------------------------------------- direct


@functools.lru_cache(maxsize=None)
def direct_kernel(epilogue_fn):
    """``y[i] = epilogue(sum_k (x - x_zp) * (w - w_zp[m]))`` for one output per thread;
    ``wz_step`` is 1 for a per-channel weight zero point, 0 for a scalar one."""

    @jit
    def conv_integer(y, x, w, x_zp, w_zp, wz_step, n_out, geo, taps, operands):
        rank, cin, cout, cg, mg, k_size = geo[_RANK], geo[_C], geo[_M], geo[_CG], geo[_MG], geo[_K]
        in_size = geo[_IN_SIZE]
        xz = int32(x_zp[0])
        origin = cuda.local.array(MAX_RANK, int64)
        for i in range(int64(cuda.grid(1)), n_out, int64(cuda.gridsize(1))):
            rest = i
            for d in range(rank - 1, -1, -1):
                size = geo[_HEADER + _OUT * rank + d]
                origin[d] = (rest % size) * geo[_HEADER + _STRIDE * rank + d] - geo[_HEADER + _PAD * rank + d]
                rest //= size
            m = rest % cout
            n = rest // cout
            wz = int32(w_zp[m * wz_step])
            x_base = (n * cin + (m // mg) * cg) * in_size
            w_base = m * k_size
            total = int32(0)
            for k in range(k_size):
                row = k * (1 + rank)
                offset = taps[row]
                inside = True
                for d in range(rank):
                    pos = origin[d] + taps[row + 1 + d]
                    if pos < 0 or pos >= geo[_HEADER + _IN * rank + d]:
                        inside = False
                        break
                    offset += pos * geo[_HEADER + _IN_STRIDE * rank + d]
                if inside:
                    a = int32(x[x_base + offset]) - xz
                    total = int32(total + a * (int32(w[w_base + k]) - wz))
            y[i] = epilogue_fn(total, i, operands)

    return conv_integer


# --------------------------------------------------------------------------- implicit GEMM


@dataclass(frozen=True)
class TileConfig:
    """Block tile ``bm`` (output positions) x ``bn`` (output channels), ``bk`` of K per
    step (a multiple of 4: one packed word per 4), register tile ``tm x tn`` per thread."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def name(self) -> str:
        return f"implicit_gemm{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}"

    def params(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": self.bk, "tm": self.tm, "tn": self.tn}


@functools.lru_cache(maxsize=None)
def gemm_kernel(config: TileConfig, x_signed: bool, w_signed: bool, x_zero_point: bool, w_zero_point: bool,
                epilogue_fn, w_words: bool = False):
    """The implicit-GEMM kernel for one tile, operand signedness, zero points present and
    epilogue. Arguments ``(y, x, w, x_zp, w_zp, wz_step, geo, taps, operands)``; with
    ``w_words`` (K a multiple of 4) ``w`` is the weights' uint32 view, four K values a load.
    The K step's rows of ``taps`` are staged in shared memory first."""
    BM, BN, BK, TM, TN = config.bm, config.bn, config.bk, config.tm, config.tn
    BK4 = BK // 4
    TX, TY = BM // TM, BN // TN
    NT = TX * TY
    A_WORDS, B_WORDS = BM * BK4, BN * BK4
    A_LOADS, B_LOADS = -(-A_WORDS // NT), -(-B_WORDS // NT)
    dot = dot4(x_signed, w_signed)
    ones_x, ones_w = dot4(x_signed, False), dot4(False, w_signed)
    SUM_X, SUM_W = bool(w_zero_point), bool(x_zero_point)  # sum x corrects w's zero point, and vice versa
    W_WORDS = bool(w_words)

    def conv_integer_gemm(y, x, w, x_zp, w_zp, wz_step, geo, taps, operands):
        sa = cuda.shared.array((BK4, BM), uint32)
        sb = cuda.shared.array((BK4, BN), uint32)
        stap = cuda.shared.array((3, BK), int64)
        acc = cuda.local.array((TM, TN), int32)
        sum_x = cuda.local.array(TM, int32)
        sum_w = cuda.local.array(TN, int32)
        ra = cuda.local.array(TM, uint32)
        rb = cuda.local.array(TN, uint32)
        base = cuda.local.array(A_LOADS, int64)
        top = cuda.local.array(A_LOADS, int64)
        left = cuda.local.array(A_LOADS, int64)
        cin, height, width, cout = geo[G_C], geo[G_H], geo[G_W], geo[G_M]
        cg, mg, oh_size, ow_size = geo[G_CG], geo[G_MG], geo[G_OH], geo[G_OW]
        sh, sw, ph, pw, k_size, rows = geo[G_SH], geo[G_SW], geo[G_PH], geo[G_PW], geo[G_K], geo[G_ROWS]
        plane = oh_size * ow_size
        xz_raw = int64(x_zp[0])
        xz = int32(xz_raw)
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        row_tiles = (rows + BM - 1) // BM
        col_tiles = (mg + BN - 1) // BN
        per_group = row_tiles * col_tiles
        for tile in range(cuda.blockIdx.x, (cout // mg) * per_group, cuda.gridDim.x):
            g = tile // per_group
            rest = tile - g * per_group
            m0 = (rest // col_tiles) * BM
            n0 = (rest % col_tiles) * BN
            for r in range(A_LOADS):  # the im2col rows this thread loads: fixed for the tile
                gm = m0 + (tid + r * NT) % BM
                base[r] = -1
                if gm < rows:
                    n = gm // plane
                    p = gm - n * plane
                    oh = p // ow_size
                    base[r] = (n * cin + g * cg) * height * width
                    top[r] = oh * sh - ph
                    left[r] = (p - oh * ow_size) * sw - pw
            for i in range(TM):
                sum_x[i] = 0
                for j in range(TN):
                    acc[i, j] = 0
            for j in range(TN):
                sum_w[j] = 0
            for k0 in range(0, k_size, BK):
                for t in range(tid, BK, NT):
                    if k0 + t < k_size:
                        stap[0, t] = taps[3 * (k0 + t)]
                        stap[1, t] = taps[3 * (k0 + t) + 1]
                        stap[2, t] = taps[3 * (k0 + t) + 2]
                cuda.syncthreads()
                for r in range(A_LOADS):
                    e = tid + r * NT
                    if e < A_WORDS:
                        kq = e // BM
                        v0, v1, v2, v3 = int64(0), int64(0), int64(0), int64(0)
                        for b in range(4):
                            t = 4 * kq + b
                            v = int64(0)
                            if k0 + t < k_size and base[r] >= 0:
                                ih = top[r] + stap[1, t]
                                iw = left[r] + stap[2, t]
                                v = xz_raw
                                if ih >= 0 and ih < height and iw >= 0 and iw < width:
                                    v = int64(x[base[r] + stap[0, t] + ih * width + iw])
                            if b == 0:
                                v0 = v
                            elif b == 1:
                                v1 = v
                            elif b == 2:
                                v2 = v
                            else:
                                v3 = v
                        sa[kq, e % BM] = pack4(v0, v1, v2, v3)
                for r in range(B_LOADS):
                    e = tid + r * NT
                    if e < B_WORDS:
                        kq = e % BK4
                        col = e // BK4
                        gn = n0 + col
                        k = k0 + 4 * kq
                        if W_WORDS:  # K % 4 == 0: the word is whole and aligned
                            word = uint32(0)
                            if gn < mg and k < k_size:
                                word = uint32(w[((g * mg + gn) * k_size + k) // 4])
                            sb[kq, col] = word
                            continue
                        v0, v1, v2, v3 = int64(0), int64(0), int64(0), int64(0)
                        if gn < mg:
                            wrow = (g * mg + gn) * k_size
                            if k < k_size:
                                v0 = int64(w[wrow + k])
                            if k + 1 < k_size:
                                v1 = int64(w[wrow + k + 1])
                            if k + 2 < k_size:
                                v2 = int64(w[wrow + k + 2])
                            if k + 3 < k_size:
                                v3 = int64(w[wrow + k + 3])
                        sb[kq, col] = pack4(v0, v1, v2, v3)
                cuda.syncthreads()
                for kq in range(BK4):
                    for i in range(TM):
                        ra[i] = sa[kq, tx + i * TX]
                    for j in range(TN):
                        rb[j] = sb[kq, ty + j * TY]
                    for i in range(TM):
                        for j in range(TN):
                            acc[i, j] = dot(ra[i], rb[j], acc[i, j])
                    if SUM_X:
                        for i in range(TM):
                            sum_x[i] = ones_x(ra[i], ONES, sum_x[i])
                    if SUM_W:
                        for j in range(TN):
                            sum_w[j] = ones_w(ONES, rb[j], sum_w[j])
                cuda.syncthreads()
            for j in range(TN):
                gn = n0 + ty + j * TY
                if gn < mg:
                    m = g * mg + gn
                    wz = int32(w_zp[m * wz_step])
                    for i in range(TM):
                        gm = m0 + tx + i * TX
                        if gm < rows:
                            value = acc[i, j]
                            if SUM_X:
                                value = int32(value - wz * sum_x[i])
                            if SUM_W:
                                value = int32(value - xz * sum_w[j])
                            if SUM_X and SUM_W:
                                value = int32(value + int32(k_size) * xz * wz)
                            n = gm // plane
                            o = (n * cout + m) * plane + (gm - n * plane)
                            y[o] = epilogue_fn(value, o, operands)

    conv_integer_gemm.__name__ = f"conv_integer_{config.name}{'_words' if w_words else ''}"
    return jit(conv_integer_gemm)
