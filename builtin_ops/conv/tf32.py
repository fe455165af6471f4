"""The TF32 tensor-core tactic of Conv (float32, one or two spatial dims, ``math="tf32"``).

The same implicit GEMM as :mod:`.implicit_gemm` (``Y[m, p] = sum_k W[m, k] * X_col[k, p]``
per group, X_col gathered from X through the K table, never built), with the block tile
``bm x bn`` (output channels x output pixels) computed by ``wm x wn`` warps of ``mi x ni``
``mma.sync.m16n8k8`` tiles, as the TF32 GEMM does (:mod:`plugrt_builtin_ops.matmul.tf32`):
both operand tiles are staged k-major in shared memory, rounded to TF32 once as they are
staged, and each warp multiplies its fragments with the GEMM's warp step
(:mod:`plugrt_builtin_ops.matmul.mma_sync`; the scalar emulation of it in the simulator).
The output tile then goes through shared memory to stores of consecutive pixels with the
bias and the fused epilogue, or, with K split, as partial sums for
:func:`.implicit_gemm.split_sum_kernel`.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import float32

from plugrt.kernels import Epilogue, cuda, jit, literal_unroll, no_epilogue, round_tf32, simulated, tf32_mma
from plugrt.plugin import Tactic
from plugrt_builtin_ops.matmul.mma_sync import accumulator_stager, warp_mma_for
from plugrt_builtin_ops.matmul.tf32 import PAD, Tf32Config

from .geometry import (
    G2_C, G2_CG, G2_H, G2_M, G2_MG, G2_N, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH, G2_SW, G2_W, ConvGeometry,
)
from .implicit_gemm import (
    GE_GROUP, GE_HAS_BIAS, GE_K, GE_KCHUNK, GE_SPLITS, choose_splits, conv_gemm_launches, conv_tile_store,
    is_pointwise,
)

#: Tiles offered on a GPU: 8 warps, 128 output channels x 64 pixels or 64 x 128, K step 16
#: (254 registers, no spills for sm_90; 128 x 128 spills 264 bytes a thread). The
#: simulator offers none unless a test swaps in a one-warp tile.
GPU_CONFIGS: tuple[Tf32Config, ...] = (Tf32Config(4, 2, 2, 4, 16), Tf32Config(2, 4, 2, 4, 16))
SIM_CONFIGS: tuple[Tf32Config, ...] = ()


def configs() -> tuple[Tf32Config, ...]:
    return SIM_CONFIGS if simulated() else GPU_CONFIGS


def check(config: Tf32Config) -> None:
    """The staging loops' thread mapping needs whole passes over both tiles."""
    config.check()
    nt = config.threads
    if config.stages or nt % config.bk or config.bm % (nt // config.bk) or nt % config.bn \
            or config.bk % (nt // config.bn):
        raise ValueError(f"TF32 conv: tile {config} does not stage evenly over its {nt} threads")


@functools.lru_cache(maxsize=None)
def conv_tf32_kernel(config: Tf32Config, epilogue_fn, pointwise: bool, emulated: bool | None = None):
    """The kernel, with :func:`.implicit_gemm.gemm_kernel`'s arguments and grid."""
    check(config)
    emulated = simulated() if emulated is None else bool(emulated)
    BM, BN, BK, MI, NI, WN, NT = config.bm, config.bn, config.bk, config.mi, config.ni, config.wn, config.threads
    LDA, LDB = BM + PAD, BN + PAD
    A_SIZE = BK * LDA
    SMEM = max(A_SIZE + BK * LDB, BM * BN)  # staging, later the output tile
    ACC = MI * NI * 4
    A_ROWS, B_ROWS = NT // BK, NT // BN
    A_PASSES, B_PASSES = BM // A_ROWS, BK // B_ROWS
    SLICES = tuple(range(0, BK, 8))
    warp_mma = warp_mma_for(MI, NI, (1, LDA), (1, LDB), False, emulated)
    stage = accumulator_stager(MI, NI, BN)
    to_tf32 = round_tf32 if emulated else tf32_mma()[0]
    store = conv_tile_store(BM, BN, NT, epilogue_fn)

    def conv_tf32(y, x, w, b, partial, ktab, geo, operands):
        smem = cuda.shared.array(SMEM, float32)  # A tile k-major, then B tile k-major
        acc = cuda.local.array(ACC, float32)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        wrow = (warp // WN) * (MI * 16)
        wcol = (warp % WN) * (NI * 8)
        b_col = tid % BN
        b_row0 = tid // BN
        a_k = tid % BK
        a_row0 = tid // BK

        cin, height, width, cout = geo[G2_C], geo[G2_H], geo[G2_W], geo[G2_M]
        cg, mg, ow_size = geo[G2_CG], geo[G2_MG], geo[G2_OW]
        sh, sw, ph, pw = geo[G2_SH], geo[G2_SW], geo[G2_PH], geo[G2_PW]
        groups, ktotal, splits, kchunk = geo[GE_GROUP], geo[GE_K], geo[GE_SPLITS], geo[GE_KCHUNK]
        has_bias = geo[GE_HAS_BIAS]
        ohw = geo[G2_OH] * ow_size
        npix = geo[G2_N] * ohw
        ptiles = (npix + BN - 1) // BN
        mtiles = (mg + BM - 1) // BM
        plane = height * width

        for z in range(cuda.blockIdx.z, splits, cuda.gridDim.z):
            k_begin = z * kchunk
            k_end = min(ktotal, k_begin + kchunk)
            for gm in range(cuda.blockIdx.y, groups * mtiles, cuda.gridDim.y):
                g = gm // mtiles
                m0 = (gm - g * mtiles) * BM
                for pt in range(cuda.blockIdx.x, ptiles, cuda.gridDim.x):
                    p0 = pt * BN
                    p = p0 + b_col  # the output pixel whose X_col column this thread stages
                    p_ok = p < npix
                    n = p // ohw
                    q = p - n * ohw
                    oh = q // ow_size
                    ow = q - oh * ow_size
                    ih0 = oh * sh - ph
                    iw0 = ow * sw - pw
                    x_base = (n * cin + g * cg) * plane + ih0 * width + iw0
                    for i in range(ACC):
                        acc[i] = float32(0)
                    for k0 in range(k_begin, k_end, BK):
                        k = k0 + a_k
                        for r in range(A_PASSES):
                            mm = a_row0 + r * A_ROWS
                            value = float32(0)
                            if m0 + mm < mg and k < k_end:
                                value = float32(w[(g * mg + m0 + mm) * ktotal + k])
                            smem[a_k * LDA + mm] = to_tf32(value)
                        for r in range(B_PASSES):
                            kk = b_row0 + r * B_ROWS
                            kb = k0 + kk
                            value = float32(0)
                            if p_ok and kb < k_end:
                                if pointwise:
                                    value = float32(x[x_base + kb * plane])
                                else:
                                    ih = ih0 + ktab[ktotal + kb]
                                    iw = iw0 + ktab[2 * ktotal + kb]
                                    if ih >= 0 and ih < height and iw >= 0 and iw < width:
                                        value = float32(x[x_base + ktab[kb]])
                            smem[A_SIZE + kk * LDB + b_col] = to_tf32(value)
                        cuda.syncthreads()
                        for ks in literal_unroll(SLICES):
                            warp_mma(smem, wrow + ks * LDA, A_SIZE + wcol + ks * LDB, lane, acc)
                        cuda.syncthreads()
                    # The block's output tile goes through shared memory (the staging buffers,
                    # free after the last barrier); then consecutive threads store
                    # consecutive pixels.
                    stage(smem, acc, wrow, wcol, lane)
                    cuda.syncthreads()
                    store(smem, y, b, partial, operands, g, m0, p0, z, mg, cout, npix, ohw, splits, has_bias, tid)
                    cuda.syncthreads()  # the next tile stages into the same buffer

    conv_tf32.__name__ = f"conv_tf32_{config.bm}x{config.bn}x{config.bk}{'_1x1' if pointwise else ''}"
    return jit(conv_tf32, launch_bounds=(NT, 1))


def conv_tf32_tactic(geo: ConvGeometry, config: Tf32Config, splits: int | None = None,
                     epilogue: Epilogue | None = None, emulated: bool | None = None) -> Tactic:
    """One TF32 tactic of a float32 Conv (``math="tf32"``); ``splits`` as
    :func:`.implicit_gemm.gemm_tactic`'s."""
    check(config)
    epilogue = epilogue or no_epilogue(3)
    pointwise = is_pointwise(geo)
    kernel = conv_tf32_kernel(config, epilogue.fn, pointwise, emulated)
    launches, workspace_bytes, splits = conv_gemm_launches(geo, np.float32, config, config.threads, kernel, splits,
                                                           epilogue, pointwise)
    name = f"tf32_{'gemm_1x1' if pointwise else 'implicit_gemm'}_{config.bm}x{config.bn}x{config.bk}" \
           f"{'_splitk' if splits > 1 else ''}"
    return Tactic(name, launches, {**config.params(), "splits": splits}, workspace_bytes, math="tf32")


def conv_tf32_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue) -> list[Tactic]:
    """The TF32 tactics of a float32 node: per tile the problem fills at least once, one
    whole and, where the output tiles cannot fill the GPU, one with K split (that first)."""
    if np.dtype(dtype) != np.float32 or geo.transposed or geo.rank not in (1, 2):
        return []
    found = []
    npix = geo.batch * int(np.prod(geo.out_spatial))
    for config in configs():
        if geo.out_channels // geo.group < config.bm or npix < config.bn:
            continue  # smaller than one tile: the exact tactics do as well
        whole = conv_tf32_tactic(geo, config, 1, epilogue)
        split = conv_tf32_tactic(geo, config, choose_splits(geo, config), epilogue)
        found += ([split] if split.params["splits"] > 1 else []) + [whole]
    return found
