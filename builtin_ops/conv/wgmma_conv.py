"""The Hopper TF32 tactic of Conv: an implicit GEMM on ``wgmma`` (float32, 1-D and 2-D,
``math="tf32"``).

``Y[m, p] = sum_k W[m, k] * X_col[k, p]`` per group, as :mod:`.implicit_gemm` computes it,
with the GEMM's Hopper pipeline (:mod:`plugrt_builtin_ops.matmul.wgmma`): a block is
``wgs`` warpgroups of 64 output channels over ``bn`` output pixels; K tiles of 32 go
through a ring of ``stages`` swizzled shared buffers with ``cp.async`` while the tensor
cores multiply an earlier tile, and ``wgmma`` reads both tiles through descriptors.

- W (the M side) is K-contiguous, ``[C_out, C_in/group * kh * kw]``: 16-byte chunk copies,
  the GEMM's own copier. A K that is not a multiple of 4 (a first layer's 3 * 3 * 3) is
  held by the tactic padded with zero columns to one that is.
- X_col (the N side) is never built: im2col happens in the copies. Each thread keeps one
  output pixel of the tile (its window origin decoded once per tile) and copies its share
  of the tile's 32 K with 4-byte ``cp.async`` from ``x[origin + ktab[k]]`` (the K table of
  :func:`.implicit_gemm.k_table`), zero-filled outside the image, past K or past the last
  pixel. Consecutive threads take consecutive pixels: coalesced reads at stride 1.

The output tile goes through shared memory to stores of consecutive pixels with the bias
and the fused epilogue, or with K split, to partial sums for
:func:`.implicit_gemm.split_sum_kernel`, as the TF32 ``mma.sync`` conv (:mod:`.tf32`).
In the simulator the MMAs are emulated (:func:`plugrt_builtin_ops.matmul.wgmma_intrinsics.emulated_ops`),
so the gather, the ring and the store are tested there; the descriptors on a GPU.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import float32, int64, uint32

from plugrt.kernels import Epilogue, aligned, cuda, jit, no_epilogue, simulated
from plugrt.plugin import Tactic
from plugrt_builtin_ops.matmul.simt import staging_bytes
from plugrt_builtin_ops.matmul.wgmma import ATOM_FLOATS, BK, WgmmaConfig, hopper, tile_copier
from plugrt_builtin_ops.matmul.wgmma_intrinsics import copy_ops, ops_for

from .geometry import (
    G2_C, G2_CG, G2_H, G2_M, G2_MG, G2_N, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH, G2_SW, G2_W, ConvGeometry,
)
from .implicit_gemm import (
    GE_GROUP, GE_HAS_BIAS, GE_K, GE_KCHUNK, GE_SPLITS, choose_splits, conv_gemm_launches, conv_tile_store,
)

#: Tiles offered on a Hopper GPU: two warpgroups (128 output channels) over 128 or 256 pixels.
#: None offered: on the H200 (2026-12-04) these tiles gave wrong results on batch-2 layers
#: (ResNet's batch-32 ones were right; not understood). Channels-last convolutions
#: (:mod:`.wgmma_nhwc`, FP16 and TF32) are the tensor-core path; these stay for study.
PRODUCTION_CONFIGS: tuple[WgmmaConfig, ...] = (WgmmaConfig(2, 128, 4), WgmmaConfig(2, 256, 3))
GPU_CONFIGS: tuple[WgmmaConfig, ...] = ()
#: The simulator offers none unless a test swaps in a one-warpgroup tile.
SIM_CONFIGS: tuple[WgmmaConfig, ...] = ()


def configs() -> tuple[WgmmaConfig, ...]:
    return SIM_CONFIGS if simulated() else GPU_CONFIGS


def check(config: WgmmaConfig) -> None:
    """Each thread keeps one pixel row of the tile: the threads cover the rows evenly and
    each row's 32 K evenly."""
    config.check()
    if config.threads % config.bn or BK % (config.threads // config.bn):
        raise ValueError(f"wgmma conv: {config.bn} pixels do not divide among {config.threads} threads")


@functools.lru_cache(maxsize=None)
def pixel_copier(config: WgmmaConfig, emulated: bool):
    """``copy(x, ktab, kt, x_base, ih0, iw0, height, width, pix_ok, k0, k_end, smem, tile, tid)``:
    this thread's share of the ``bn x 32`` X_col tile at K ``k0``: K ``k0 + kq + j * step``
    of its pixel row ``tid % bn`` into the swizzled K-major shared tile at ``smem[tile]``."""
    _, copy4 = copy_ops(emulated)
    BN, NT = config.bn, config.threads
    STEP = NT // BN  # threads per row
    PER = BK // STEP

    @jit(device=True)
    def copy(x, ktab, kt, x_base, ih0, iw0, height, width, pix_ok, k0, k_end, smem, tile, tid):
        row = tid % BN
        kq = tid // BN
        line = tile + row * BK
        swz = row & 7
        for j in range(PER):
            kk = kq + j * STEP
            k = k0 + kk
            ok = pix_ok and k < k_end
            src = int64(0)
            if ok:
                ih = ih0 + ktab[kt + k]
                iw = iw0 + ktab[2 * kt + k]
                ok = ih >= 0 and ih < height and iw >= 0 and iw < width
                if ok:
                    src = x_base + ktab[k]
            copy4(smem, line + ((((kk >> 2) ^ swz) << 2) | (kk & 3)), x, src, ok)

    return copy


@functools.lru_cache(maxsize=None)
def wgmma_conv_kernel(config: WgmmaConfig, epilogue_fn, emulated: bool | None = None):
    """The kernel, with :func:`.implicit_gemm.gemm_kernel`'s arguments and grid, plus the
    row stride of W (its K, padded) in the geometry's K slot."""
    check(config)
    emulated = simulated() if emulated is None else bool(emulated)
    BM, BN, S, NT, ACC = config.bm, config.bn, config.stages, config.threads, config.accumulators
    A_STAGE, B_STAGE = BM * BK, BN * BK
    B_RING = S * A_STAGE
    WG_ROWS = 64 * BK
    mma, wait, fence, commit, commit_copies, wait_copies, fence_async, shared_address = ops_for(BN, emulated)
    copy_a = tile_copier(BM, True, NT, False, emulated)
    copy_b = pixel_copier(config, emulated)
    store = conv_tile_store(BM, BN, NT, epilogue_fn)
    AHEAD = S - 2
    PENDING = AHEAD - 1

    def conv_wgmma(y, x, w, b, partial, ktab, geo, operands):
        smem = cuda.shared.array(0, float32)
        acc = cuda.local.array(ACC, float32)
        tid = cuda.threadIdx.x
        cin, height, width, cout = geo[G2_C], geo[G2_H], geo[G2_W], geo[G2_M]
        cg, mg, ow_size = geo[G2_CG], geo[G2_MG], geo[G2_OW]
        sh, sw, ph, pw = geo[G2_SH], geo[G2_SW], geo[G2_PH], geo[G2_PW]
        groups, ktotal, splits, kchunk = geo[GE_GROUP], geo[GE_K], geo[GE_SPLITS], geo[GE_KCHUNK]
        has_bias = geo[GE_HAS_BIAS]
        kpad = (ktotal + 3) & ~3  # W's row stride
        ohw = geo[G2_OH] * ow_size
        npix = geo[G2_N] * ohw
        ptiles = (npix + BN - 1) // BN
        mtiles = (mg + BM - 1) // BM
        plane = height * width
        ring = ((ATOM_FLOATS * 4 - (shared_address(smem) & uint32(ATOM_FLOATS * 4 - 1)))
                & uint32(ATOM_FLOATS * 4 - 1)) >> 2
        a_ring = ring + (tid >> 7) * WG_ROWS
        b_ring = ring + B_RING
        lane = tid & 31
        out_row = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2)
        out_col = 2 * (lane & 3)

        for z in range(cuda.blockIdx.z, splits, cuda.gridDim.z):
            k_begin = z * kchunk
            k_end = min(ktotal, k_begin + kchunk)
            ktiles = (k_end - k_begin + BK - 1) // BK
            for gm in range(cuda.blockIdx.y, groups * mtiles, cuda.gridDim.y):
                g = gm // mtiles
                m0 = (gm - g * mtiles) * BM
                w_base = g * mg * kpad
                for pt in range(cuda.blockIdx.x, ptiles, cuda.gridDim.x):
                    p0 = pt * BN
                    p = p0 + tid % BN  # the output pixel whose X_col row this thread copies
                    pix_ok = p < npix
                    n = p // ohw
                    q = p - n * ohw
                    oh = q // ow_size
                    ow = q - oh * ow_size
                    ih0 = oh * sh - ph
                    iw0 = ow * sw - pw
                    x_base = (n * cin + g * cg) * plane + ih0 * width + iw0
                    for i in range(ACC):
                        acc[i] = float32(0)
                    for s in range(AHEAD):
                        if s < ktiles:
                            kt = k_begin + s * BK
                            copy_a(w, w_base, kpad, 1, m0, mg, kt, k_end, smem, ring + s * A_STAGE, tid)
                            copy_b(x, ktab, ktotal, x_base, ih0, iw0, height, width, pix_ok, kt, k_end, smem,
                                   b_ring + s * B_STAGE, tid)
                        commit_copies()
                    for t in range(ktiles):
                        wait_copies(PENDING)
                        fence_async()
                        cuda.syncthreads()
                        slot = t % S
                        a_at = a_ring + slot * A_STAGE
                        b_at = b_ring + slot * B_STAGE
                        fence()
                        mma(acc, smem, a_at, b_at)
                        mma(acc, smem, a_at + 8, b_at + 8)
                        mma(acc, smem, a_at + 16, b_at + 16)
                        mma(acc, smem, a_at + 24, b_at + 24)
                        commit()
                        ahead = t + AHEAD
                        if ahead < ktiles:
                            free = ahead % S
                            kt = k_begin + ahead * BK
                            copy_a(w, w_base, kpad, 1, m0, mg, kt, k_end, smem, ring + free * A_STAGE, tid)
                            copy_b(x, ktab, ktotal, x_base, ih0, iw0, height, width, pix_ok, kt, k_end, smem,
                                   b_ring + free * B_STAGE, tid)
                        commit_copies()
                        wait(acc, 1)
                    wait(acc, 0)
                    wait_copies(0)
                    cuda.syncthreads()
                    for j in range(BN // 8):  # the accumulators, row-major (channel, pixel)
                        smem[out_row * BN + out_col + 8 * j] = acc[4 * j]
                        smem[out_row * BN + out_col + 8 * j + 1] = acc[4 * j + 1]
                        smem[(out_row + 8) * BN + out_col + 8 * j] = acc[4 * j + 2]
                        smem[(out_row + 8) * BN + out_col + 8 * j + 1] = acc[4 * j + 3]
                    cuda.syncthreads()
                    store(smem, y, b, partial, operands, g, m0, p0, z, mg, cout, npix, ohw, splits, has_bias, tid)
                    cuda.syncthreads()  # the next tile's copies reuse the buffers

    conv_wgmma.__name__ = f"conv_wgmma_{config.bm}x{config.bn}x{BK}_s{config.stages}"
    return jit(conv_wgmma, launch_bounds=(NT, 1))


def wgmma_conv_tactic(geo: ConvGeometry, config: WgmmaConfig, splits: int | None = None,
                      epilogue: Epilogue | None = None, emulated: bool | None = None,
                      fallback: Tactic | None = None) -> Tactic:
    """One tactic of a float32 Conv (``math="tf32"``); ``splits`` as
    :func:`.implicit_gemm.gemm_tactic`'s. A weight array not 16-byte aligned at launch
    runs ``fallback``."""
    check(config)
    epilogue = epilogue or no_epilogue(3)
    kernel = wgmma_conv_kernel(config, epilogue.fn, emulated)
    ktotal = geo.in_channels // geo.group * int(np.prod(geo.kernel))
    kpad = -(-ktotal // 4) * 4

    def weights(w):
        if kpad == ktotal:
            return w
        host = np.zeros((geo.out_channels, kpad), np.float32)
        host[:, :ktotal] = w.copy_to_host().reshape(geo.out_channels, ktotal)
        return cuda.to_device(host).reshape(host.size)

    shared = staging_bytes(config.bm, config.bn, config.ring_floats())
    direct, workspace_bytes, splits = conv_gemm_launches(geo, np.float32, config, config.threads, kernel, splits,
                                                         epilogue, False, shared, weights)

    def launches(ins, outs, workspace):
        if kpad != ktotal or aligned(ins[1]):
            return direct(ins, outs, workspace)
        if fallback is None:
            raise ValueError("wgmma conv: the weights are not 16-byte aligned and there is no fallback")
        return fallback.launches(ins, outs, workspace)

    if fallback is not None:
        workspace_bytes = max(workspace_bytes, fallback.workspace_bytes)
    name = f"wgmma_implicit_gemm_{config.bm}x{config.bn}x{BK}_s{config.stages}" + ("_splitk" if splits > 1 else "")
    return Tactic(name, launches, {**config.params(), "splits": splits}, workspace_bytes, math="tf32")


#: Whether K-split tactics are offered. On the H200 (2026-12-04) the whole tactics of the
#: production tiles matched cuDNN on ResNet's 3x3 layers at batch 32 and a 7x7 first layer,
#: but K-split ones gave wrong results on batch-2 layers (right on others), as did the
#: one-warpgroup n8 test tile: not offered until that is understood.
OFFER_SPLIT_K = False


def wgmma_conv_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue, fallback: Tactic | None = None) -> list[Tactic]:
    """The tactics of a float32 1-D/2-D Conv on a Hopper GPU (or the simulator's test
    tiles): one per tile the problem fills (and, with :data:`OFFER_SPLIT_K`, one with K
    split where the output tiles cannot fill the GPU, that first)."""
    if np.dtype(dtype) != np.float32 or geo.transposed or geo.rank not in (1, 2) or not hopper():
        return []
    found = []
    npix = geo.batch * int(np.prod(geo.out_spatial))
    for config in configs():
        if geo.out_channels // geo.group < config.bm // 2 or npix < config.bn:
            continue  # mostly empty tiles: the other tactics do as well
        whole = wgmma_conv_tactic(geo, config, 1, epilogue, fallback=fallback)
        split = wgmma_conv_tactic(geo, config, choose_splits(geo, config), epilogue, fallback=fallback) \
            if OFFER_SPLIT_K else whole
        found += ([split] if split.params["splits"] > 1 else []) + [whole]
    return found
