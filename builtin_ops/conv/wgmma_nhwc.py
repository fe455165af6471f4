"""Channels-last convolution (``plugrt.conv::ConvNHWC``): the Hopper implicit GEMM on
``wgmma``, FP16 and TF32, and the plain kernel every other case runs.

Over NHWC a convolution is a GEMM whose rows are output pixels: ``Y[p, m] = sum_k
X_col[p, k] * W[m, k]`` with ``p = (n, oh, ow)``, ``k = (kh, kw, c)`` and W stored
``[M, kh, kw, C]``, so Y comes out NHWC, the weight is the K-contiguous B the FP16
``wgmma`` reads, and a K run of one tap is ``C`` contiguous input channels. The GEMM is
the matmul family's (:func:`plugrt_builtin_ops.matmul.wgmma.wgmma_kernel`: its ring,
swizzle, MMAs, K split and fused store); only A's copies differ (:func:`nhwc_gather`):
each thread decodes the window origins of its pixel rows once per block, and per K tile
the tap of its 16-byte chunk (8 halves or 4 floats of C) with two divisions; a chunk
outside the image, past K or past the last pixel is zero-filled by ``cp.async``. That
needs C in whole chunks (a multiple of 8 halves, 4 floats), one group, 1-D or 2-D. The
quant family's ConvIntegerNHWC runs the same gather over int8 (16 values a chunk).

A 1x1 convolution with unit strides and no padding is a plain GEMM over ``[N*H*W, C]``:
it gets the matmul family's own wgmma tactics too. :func:`direct_nhwc_tactic` (one thread
per output, any group, dtype and alignment) is the fallback and the simulator's tactic.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import int32, int64, uint32

from plugrt.kernels import Epilogue, aligned, cuda, flat, grid_1d, jit, simulated, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.matmul.plan import (
    K_, M_, META_LEN, N_, NB, OFFS_W, SAK, SAM, SBK, SBN, SCM, SCN, USE_C, A_KC,
)
from plugrt_builtin_ops.matmul.simt import RAGGED, choose_splits, is_even
from plugrt_builtin_ops.matmul.store import gemm_launches, staging_bytes
from plugrt_builtin_ops.matmul.wgmma import BK, WgmmaConfig, hopper, wgmma_kernel, wgmma_tactics
from plugrt_builtin_ops.matmul.wgmma_f16 import wgmma_half_tactics
from plugrt_builtin_ops.matmul.tactics import product_tactics
from plugrt_builtin_ops.matmul.wgmma_intrinsics import copy_ops

from .im2col import gemm_meta, im2col_tactics
from .geometry import (
    G2_C, G2_CG, G2_DH, G2_DW, G2_H, G2_KH, G2_KW, G2_M, G2_MG, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH, G2_SW, G2_W,
    ConvGeometry, bias_or_dummy, compute_type, geometry_2d,
)

# The gather's slots after the GEMM's in ``meta``, in 4-byte words along C.
GM_H, GM_W, GM_CW, GM_OH, GM_OW, GM_KW, GM_SH, GM_SW, GM_DH, GM_DW, GM_PH, GM_PW = range(META_LEN, META_LEN + 12)
GATHER_META_LEN = META_LEN + 12

#: Tiles offered on a Hopper GPU: two warpgroups (128 pixels) over 256, 128 or 64 channels;
#: deep rings for long K, and shallow ones that leave shared memory for a second block per
#: SM (a layer's K is often 9 tiles or fewer: prologue and store then matter). Shared memory
#: alone does not give the second block: compiled for one, the 128 x 128 conv takes 194
#: registers a thread and the 128 x 64 one 138 (ptxas, sm_90), so one block of 256 threads
#: fills an SM; the ``min_blocks=2`` twins are held to 128 (no spill but the 128 x 128
#: gather's setup, 460 bytes), and one block's store overlaps the other's main loop.
GPU_CONFIGS: tuple[WgmmaConfig, ...] = (WgmmaConfig(2, 256, 4), WgmmaConfig(2, 128, 5), WgmmaConfig(2, 64, 6),
                                        WgmmaConfig(2, 128, 3), WgmmaConfig(2, 64, 3), WgmmaConfig(4, 64, 3),
                                        WgmmaConfig(2, 128, 3, 2), WgmmaConfig(2, 64, 3, 2), WgmmaConfig(2, 64, 4, 2))
#: The simulator offers none (its emulated MMAs are slow) unless a test swaps in a tile.
SIM_CONFIGS: tuple[WgmmaConfig, ...] = ()
#: What the tactics' ``params["format"]`` say of their tensors (``plugrt inspect``'s format).
FORMAT = "channels_last"
#: A far-off window origin for the pixel rows past the last: never inside the image (the
#: copies compute in 32 bits: an image's rows, columns and words fit them).
OUTSIDE = -(1 << 30)


def configs() -> tuple[WgmmaConfig, ...]:
    return SIM_CONFIGS if simulated() else GPU_CONFIGS


# --------------------------------------------------------------------------- the gather


@functools.lru_cache(maxsize=None)
def nhwc_gather(rows: int, threads: int, emulated: bool):
    """A's copies for :func:`.wgmma_kernel` (``gather``): thread ``tid`` copies 16-byte chunk
    ``tid % 8`` of the K tile for pixel rows ``tid // 8 + c * threads / 8``, as the
    strided copier does; ``state`` holds each row's image offset and window origin, then
    the geometry the copies read every K tile (held in registers: a load from ``meta``
    after the ring's asynchronous copies and MMAs would be made again each tile). A K
    tile's tap is two 32-bit unsigned divisions (K counts words: far below 2^32)."""
    copy16, _ = copy_ops(emulated)
    step = threads // 8
    per = -(-rows // step)
    ragged = rows % step != 0
    held = 3 * per  # (state: the rows' slots, then C in words, KW, DH, DW, H and W)

    @jit(device=True)
    def setup(meta, row0, nrows, state, tid):
        ow_size = meta[GM_OW]
        ohw = meta[GM_OH] * ow_size
        image = meta[GM_H] * meta[GM_W] * meta[GM_CW]
        r_t = tid >> 3
        for c in range(per):
            p = row0 + r_t + c * step
            if p < nrows and (not ragged or r_t + c * step < rows):
                n = p // ohw
                rest = p - n * ohw
                oh = rest // ow_size
                ih0 = oh * meta[GM_SH] - meta[GM_PH]
                iw0 = (rest - oh * ow_size) * meta[GM_SW] - meta[GM_PW]
                state[3 * c] = n * image + (ih0 * meta[GM_W] + iw0) * meta[GM_CW]  # (the window's origin word)
                state[3 * c + 1] = ih0
                state[3 * c + 2] = iw0
            else:
                state[3 * c] = 0
                state[3 * c + 1] = OUTSIDE
                state[3 * c + 2] = 0
        state[held] = meta[GM_CW]
        state[held + 1] = meta[GM_KW]
        state[held + 2] = meta[GM_DH]
        state[held + 3] = meta[GM_DW]
        state[held + 4] = meta[GM_H]
        state[held + 5] = meta[GM_W]

    @jit(device=True)
    def copy(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid, meta, state):
        r_t = tid >> 3
        chunk = ((tid & 7) ^ (r_t & 7)) << 2  # step is a multiple of 8: every row's swizzle
        k = k0 + ((tid & 7) << 2)
        cw_size = int32(state[held])
        taps_w = uint32(state[held + 1])
        tap = uint32(k) // uint32(cw_size)
        kh = tap // taps_w
        dh = int32(int32(kh) * int32(state[held + 2]))
        dw = int32(int32(tap - kh * taps_w) * int32(state[held + 3]))
        at_c = int32(int32(k) - int32(tap) * cw_size)
        height, width = uint32(state[held + 4]), uint32(state[held + 5])
        offset = int32(int32(int32(dh * int32(width)) + dw) * cw_size + at_c)  # (the same for every row)
        k_ok = k < k_end
        for c in range(per):
            r = r_t + c * step
            if not ragged or r < rows:  # (unsigned: a negative row or column is far out too)
                ok = (k_ok and uint32(int32(state[3 * c + 1]) + dh) < height
                      and uint32(int32(state[3 * c + 2]) + dw) < width)
                copy16(smem, tile + r * BK + chunk, src, state[3 * c] + offset if ok else 0, ok)

    return setup, copy, held + 6


def gather_meta(geo: ConvGeometry, itemsize: int, has_bias: bool) -> np.ndarray:
    """``meta`` of the NHWC implicit GEMM over elements of ``itemsize`` bytes (4: float32,
    2: FP16, 1: int8/uint8): the GEMM's slots (pixels x K by K x channels, in elements;
    the bias as Gemm's C broadcast along rows), then the gather's, C in 32-bit words."""
    table = geometry_2d(geo)
    per_word = 4 // itemsize
    meta = np.zeros(GATHER_META_LEN, np.int64)
    k = int(table[G2_KH] * table[G2_KW] * table[G2_C])
    meta[[NB, M_, N_, K_]] = 1, geo.batch * int(table[G2_OH] * table[G2_OW]), geo.out_channels, k
    meta[[SAM, SAK, SBK, SBN]] = k, 1, 1, k
    meta[A_KC] = 1
    if has_bias:
        meta[[USE_C, SCM, SCN]] = 1, 0, 1
    meta[[GM_H, GM_W, GM_OH, GM_OW, GM_KW, GM_SH, GM_SW, GM_DH, GM_DW, GM_PH, GM_PW]] = table[
        [G2_H, G2_W, G2_OH, G2_OW, G2_KW, G2_SH, G2_SW, G2_DH, G2_DW, G2_PH, G2_PW]]
    meta[GM_CW] = table[G2_C] // per_word
    return meta


# --------------------------------------------------------------------------- tactics


#: A layer with at most this many K tiles prefers shallow rings: its blocks run a few K
#: steps, so the prologue and the store dominate, and a second and third block per SM
#: (what a shallow ring leaves shared memory for) hide them.
SHORT_K_TILES = 9


def nhwc_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue, has_bias: bool, weight=None) -> list[Tactic]:
    """Every tactic of a ConvNHWC node, best guess first (the tuner times only the first
    few at the default optimization level): on a Hopper GPU a 1x1's plain GEMMs, then the
    wgmma implicit GEMM (FP16, or TF32 for float32) in :func:`config_order`, each with K
    split first where the output tiles cannot fill the GPU, then a first layer's explicit
    im2col and GEMM where its weight (``weight``, the constant) leaves padded channels
    unused (:mod:`.im2col`: timed at level 5), then :func:`direct_nhwc_tactic` (first in
    the simulator)."""
    direct = direct_nhwc_tactic(geo, dtype, epilogue)
    dtype = np.dtype(dtype)
    if not (geo.rank in (1, 2) and geo.group == 1 and dtype in (np.float16, np.float32) and hopper()):
        return [renamed(direct, "", FORMAT)]
    half = dtype == np.float16
    if geo.in_channels % (8 if half else 4):
        return [renamed(direct, "", FORMAT)]
    plain = _plain_gemm(geo, dtype, epilogue, has_bias, direct) if is_pointwise(geo) else []
    packed = im2col_tactics(geo, dtype, epilogue, has_bias, weight,
                            lambda meta, offs: _packed_gemms(meta, offs, dtype, epilogue, has_bias))
    meta = gather_meta(geo, dtype.itemsize, has_bias)
    bk = 2 * BK if half else BK
    gathered, twins = [], [t for t in plain if t.name.endswith(RAGGED)]
    for config in config_order(geo.out_channels, -(-int(meta[K_]) // bk)):
        splits = choose_splits(meta, config.bm, config.bn, bk)
        for s in ((splits, 1) if splits > 1 else (1,)):
            gathered.append(_gather_tactic(config, meta, half, s, epilogue, has_bias, direct))
        if not simulated():  # (emulated MMAs: the simulator's tests run every tactic)
            twins.append(_gather_tactic(config, meta, half, 1, epilogue, has_bias, direct, ragged=True))
    plain = [t for t in plain if not t.name.endswith(RAGGED)]
    # (Last, the ragged twins: the same kernels at every batch of a dynamic profile.)
    found = ([direct] + gathered + plain + packed + twins if simulated()
             else plain + gathered + packed + [direct] + twins)
    return [renamed(t, "", FORMAT) for t in found]  # the emulated MMAs are slow: the plain kernel leads there


def config_order(out_channels: int, k_tiles: int) -> list[WgmmaConfig]:
    """The tiles worth compiling for ``out_channels`` and a K of ``k_tiles`` tiles, best
    guess first: tiles no wider than the channels (above 64), and not narrower than 128
    for 256 channels or more; shallow rings first for a short K (:data:`SHORT_K_TILES`),
    those for two blocks an SM first (their rings hold two tiles in flight an SM, or four),
    deep ones first otherwise; wider tiles first among equals. Measured on the H200
    (``conv_nhwc`` part, one block an SM): ResNet-50's 3x3 layers with 9 K tiles run best
    on a 3-stage ring, those with 18 and more on 4- and 5-stage ones."""
    keep = [c for c in configs() if not ((c.bn > out_channels and c.bn > 64) or (out_channels >= 256 and c.bn < 128))]
    short = k_tiles <= SHORT_K_TILES
    return sorted(keep, key=lambda c: ((c.min_blocks == 1, c.stages > 3) if short else (c.stages <= 3, c.min_blocks > 1),
                                       -c.bn, -c.bm))


def is_pointwise(geo: ConvGeometry) -> bool:
    """A 1x1 convolution with unit strides and no padding: a plain GEMM over ``[N*H*W, C]``."""
    return (all(k == 1 for k in geo.kernel) and all(s == 1 for s in geo.strides) and not any(geo.pads)
            and tuple(geo.in_spatial) == tuple(geo.out_spatial))


def pointwise_meta(geo: ConvGeometry, has_bias: bool) -> np.ndarray:
    """The matmul family's ``meta`` of a pointwise convolution (:func:`is_pointwise`): X
    ``[N*H*W, C]`` by W ``[M, C]`` (K-contiguous, as ``wgmma`` reads it), the bias as
    Gemm's C broadcast along rows."""
    return gemm_meta(geo.batch * int(np.prod(geo.in_spatial)), geo.out_channels, geo.in_channels, has_bias)


def _plain_gemm(geo: ConvGeometry, dtype, epilogue: Epilogue, has_bias: bool, fallback: Tactic) -> list[Tactic]:
    """A 1x1 convolution as the matmul family's wgmma GEMM: X ``[N*H*W, C]`` by W ``[M, C]``,
    on the tiles :func:`config_order` picks for its channels and K: tiles no wider than 64
    for 64 channels (ResNet-50's 256 -> 64 at batch 32 on an H100: 128x64 s3 0.023 ms).
    A one-K-tile 1x1 gets the shallow ring first, though there the deep one won (64 -> 256:
    s4 0.062 ms, s3 0.074): the tuner times the first three."""
    meta, offs = pointwise_meta(geo, has_bias), np.zeros(OFFS_W, np.int64)
    return [renamed(t, "gemm_1x1_") for t in _gemms(meta, offs, dtype, epilogue, has_bias, fallback)]


def _gemms(meta: np.ndarray, offs: np.ndarray, dtype, epilogue: Epilogue, has_bias: bool, fallback) -> list[Tactic]:
    """The matmul family's wgmma GEMMs of a convolution's product ``meta`` (FP16, or TF32
    for float32), on the tiles :func:`config_order` picks for its N and K."""
    kw = dict(epilogue=epilogue, beta=1.0, c_index=2 if has_bias else None)
    half = dtype == np.float16
    configs = config_order(int(meta[N_]), -(-int(meta[K_]) // (2 * BK if half else BK))) or None  # (none: the defaults)
    if half:
        return wgmma_half_tactics(dtype, dtype, dtype, meta, offs, fallback=fallback, configs=configs, **kw)
    return wgmma_tactics(dtype, dtype, dtype, meta, offs, configs=configs, **kw)


def _packed_gemms(meta: np.ndarray, offs: np.ndarray, dtype, epilogue: Epilogue, has_bias: bool) -> list[Tactic]:
    """The GEMMs of :mod:`.im2col`'s packed product, best first: on a GPU the first two
    wgmma tiles (FP16, or TF32 for float32), each falling back to the plain tiled GEMM,
    or that tiled GEMM where the product is too small for any tile; in the simulator the
    tiled GEMM alone."""
    kw = dict(epilogue=epilogue, beta=1.0, c_index=2 if has_bias else None)
    tiled = [t for t in product_tactics(dtype, dtype, dtype, meta, offs, **kw) if t.name.startswith("tiled")][:1]
    if simulated():
        return tiled
    found = _gemms(meta, offs, dtype, epilogue, has_bias, tiled[0] if tiled else None)
    return [t for t in found if not t.name.endswith(RAGGED)][:2] or tiled


def renamed(tactic: Tactic, prefix: str, layout: str | None = None) -> Tactic:
    """``tactic`` under ``prefix + name``, its ``params["format"]`` set to ``layout`` when given."""
    params = dict(tactic.params) if layout is None else {**tactic.params, "format": layout}
    return Tactic(prefix + tactic.name, tactic.launches, params, tactic.workspace_bytes, math=tactic.math)


def _gather_tactic(config: WgmmaConfig, meta: np.ndarray, half: bool, splits: int, epilogue: Epilogue,
                   has_bias: bool, fallback: Tactic, ragged: bool = False) -> Tactic:
    bk = 2 * BK if half else BK
    even = not ragged and is_even(meta, config.bm, config.bn, bk)

    def kernel_for(split, vector):
        return wgmma_kernel(config, True, True, even, split, epilogue.fn, None, half, nhwc_gather,
                            epilogue.vector if vector else None)

    def views(a, b):
        return (a.view(np.float32), b.view(np.float32)) if half else (a, b)

    direct, workspace_bytes, splits = gemm_launches(
        kernel_for, meta, np.zeros(OFFS_W, np.int64), config.bm, config.bn, bk, config.threads,
        staging_bytes(config.bm, config.bn, config.ring_floats(), config.ld), splits, epilogue, 1.0, 1.0,
        2 if has_bias else None, views)

    def launches(ins, outs, workspace):
        if aligned(ins[0]) and aligned(ins[1]):
            return direct(ins, outs, workspace)
        return fallback.launches(ins, outs, workspace)

    name = (f"wgmma_nhwc_{config.tile(bk)}" + (f"_splitk{splits}" if splits > 1 else "")
            + (RAGGED if ragged else ""))
    params = {**config.params(), "bk": bk, "splits": splits, "even": even}
    return Tactic(name, launches, params, max(workspace_bytes, fallback.workspace_bytes), math="" if half else "tf32")


# --------------------------------------------------------------------------- the plain kernel


@functools.lru_cache(maxsize=None)
def direct_nhwc_kernel(acc, epilogue_fn):
    """``y[n, oh, ow, m] = epilogue(sum over (kh, kw, c) x[n, ih, iw, g*cg + c] *
    w[m, kh, kw, c] (+ b[m]))``, one output per thread: consecutive threads take
    consecutive output channels, reading the same input pixel."""

    @jit
    def conv(y, x, w, b, has_bias, n_out, geo, operands):
        cin, height, width = geo[G2_C], geo[G2_H], geo[G2_W]
        cout, cg, mg = geo[G2_M], geo[G2_CG], geo[G2_MG]
        oh_size, ow_size = geo[G2_OH], geo[G2_OW]
        kh_size, kw_size = geo[G2_KH], geo[G2_KW]
        sh, sw, dh, dw, ph, pw = geo[G2_SH], geo[G2_SW], geo[G2_DH], geo[G2_DW], geo[G2_PH], geo[G2_PW]
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            m = i % cout
            rest = i // cout
            ow = rest % ow_size
            rest //= ow_size
            oh = rest % oh_size
            n = rest // oh_size
            c0 = (m // mg) * cg
            total = acc(0)
            for kh in range(kh_size):
                ih = oh * sh - ph + kh * dh
                if ih < 0 or ih >= height:
                    continue
                for kw in range(kw_size):
                    iw = ow * sw - pw + kw * dw
                    if iw < 0 or iw >= width:
                        continue
                    x_at = ((n * height + ih) * width + iw) * cin + c0
                    w_at = ((m * kh_size + kh) * kw_size + kw) * cg
                    for c in range(cg):
                        total += acc(x[x_at + c]) * acc(w[w_at + c])
            if has_bias != 0:
                total += acc(b[m])
            y[i] = epilogue_fn(total, int64(i), operands)

    return conv


def direct_nhwc_tactic(geo: ConvGeometry, dtype, epilogue: Epilogue) -> Tactic:
    """Any 1-D/2-D ConvNHWC, one thread per output (:func:`direct_nhwc_kernel`)."""
    kernel = direct_nhwc_kernel(compute_type(dtype), epilogue.fn)
    table, n_out = geometry_2d(geo), geo.out_size

    def launches(ins, outs, workspace):
        if n_out == 0:
            return []
        own = ins[:epilogue.first]
        bias = own[2] if len(own) > 2 else None
        blocks, threads = grid_1d(n_out)
        return [Launch(kernel, blocks, threads, (flat(outs[0]), flat(own[0]), flat(own[1]), bias_or_dummy(bias, dtype),
                                                 np.int64(bias is not None), np.int64(n_out), to_device(table),
                                                 epilogue.arguments(ins)))]

    return Tactic("direct_nhwc", launches, {})
