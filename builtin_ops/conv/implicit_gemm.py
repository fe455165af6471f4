"""The GEMM tactics of Conv with one or two spatial dims (NCHW, float32/float16).

Per group the convolution is a matrix product ``Y[m, p] = sum_k W[m, k] * X_col[k, p]``
with ``m`` the group's output channels, ``p = (n, oh, ow)`` the output pixels and
``k = (c, kh, kw)`` the group's input channels times kernel taps (W's own row layout).
X_col is never built: a block stages a ``BK x BN`` slice of it in shared memory straight
from X, using a host-made table that maps ``k`` to its input offset and (kh, kw) shift,
next to a ``BM x BK`` slice of W; each thread then accumulates a ``TM x TN`` register
tile in float32.

Small problems (few output tiles, long K: late ResNet layers at batch 1) split K over
``gridDim.z``: each split writes float32 partial sums to the workspace and a second kernel
adds them up with the bias. The epilogue (:class:`plugrt.kernels.Epilogue`) runs at the one
final store of each element: in the GEMM kernel without a split, in ``split_sum`` with one.
A 1-D node runs as 2-D with a unit H axis.

A 1x1 convolution without padding (any stride) is a plain GEMM per image,
``Y[n][m, p] = W[m, c] x X[n][c, p]``: the ``pointwise`` form of the same kernel reads X
straight from the channel index, with no k table.

:func:`gemm_tactics` offers every tile configuration of :data:`GPU_CONFIGS` that fits the
node (:data:`SIM_CONFIGS` under the simulator), each without and, where it helps, with a
K split, ordered by :func:`estimated_cycles`, a rough model the tuner then corrects.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import float32, int64, uint64

from plugrt.kernels import Epilogue, cuda, flat, grid_1d, jit, no_epilogue, simulated, to_device
from plugrt.plugin import Launch, Tactic

from .geometry import (
    G2_C, G2_CG, G2_DH, G2_DW, G2_H, G2_KH, G2_KW, G2_M, G2_MG, G2_N, G2_OH, G2_OW, G2_PH, G2_PW, G2_SH,
    G2_SW, G2_W, ConvGeometry, bias_or_dummy, geometry_2d,
)

#: Streaming multiprocessors of the target GPU (H200); split-K aims for two blocks each.
SMS = 132
#: A K split gets at least this many BK-deep tiles.
MIN_KTILES_PER_SPLIT = 4

# Entries appended to the 2-D geometry table.
GE_GROUP, GE_K, GE_SPLITS, GE_KCHUNK, GE_HAS_BIAS = range(17, 22)


@dataclass(frozen=True)
class GemmConfig:
    """Block tile ``bm x bn`` (output channels x output pixels), K step ``bk``, and the
    ``tm x tn`` register tile per thread; ``(bm / tm) * (bn / tn)`` threads per block."""

    bm: int = 64
    bn: int = 64
    bk: int = 16
    tm: int = 4
    tn: int = 4

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def check(self) -> None:
        nt = self.threads
        ok = (self.bm % self.tm == 0 and self.bn % self.tn == 0 and nt % self.bn == 0 and nt % self.bk == 0
              and self.bk % (nt // self.bn) == 0 and self.bm % (nt // self.bk) == 0)
        if not ok:
            raise ValueError(f"conv implicit GEMM: tile {self} does not divide evenly among its {nt} threads")

    def params(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": self.bk, "tm": self.tm, "tn": self.tn}

    @property
    def label(self) -> str:
        """``64x128x16_4x8``: block tile, K step, register tile."""
        return f"{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}"


#: The measured GPU tile (10.5 TFLOP/s SGEMM on the H200); the simulator's small one.
GPU_CONFIG = GemmConfig(64, 64, 16, 4, 4)
SIM_CONFIG = GemmConfig(16, 16, 8, 2, 2)

#: The tiles offered on a GPU, all 256 threads a block. 8x8 register tiles take about
#: 100 registers a thread; shared memory stays under 17 KiB.
GPU_CONFIGS = (
    GPU_CONFIG,
    GemmConfig(64, 64, 8, 4, 4),      # short K (first layers: C * kh * kw of 27 to 147)
    GemmConfig(128, 64, 16, 8, 4),    # many output channels, fewer pixels
    GemmConfig(64, 128, 16, 4, 8),    # many pixels (early layers, large batches)
    GemmConfig(128, 128, 8, 8, 8),    # large layers: the most reuse per shared-memory load
    GemmConfig(32, 64, 16, 2, 4),     # few output channels per group
)
#: The same kernel at simulator sizes (16 and 64 threads), so tests run every form quickly.
SIM_CONFIGS = (SIM_CONFIG, GemmConfig(8, 16, 8, 2, 4))


def default_config() -> GemmConfig:
    return SIM_CONFIG if simulated() else GPU_CONFIG


def default_configs() -> tuple:
    return SIM_CONFIGS if simulated() else GPU_CONFIGS


@functools.lru_cache(maxsize=None)
def gemm_kernel(bm: int, bn: int, bk: int, tm: int, tn: int, epilogue_fn, pointwise: bool = False):
    """The implicit-GEMM kernel for one tile shape and epilogue (see the module doc);
    ``pointwise`` for 1x1 kernels without padding (k is the channel, ``ktab`` unused)."""
    tx_n, ty_n = bn // tn, bm // tm
    nt = tx_n * ty_n
    b_rows = nt // bn          # B-tile rows one pass of the block loads
    b_passes = bk // b_rows
    a_rows = nt // bk          # A-tile rows (output channels) one pass loads
    a_passes = bm // a_rows
    a_ld = bm + 1              # A tile row length, padded so staging stores spread over banks
    a_size = bk * a_ld
    b_size = bk * bn
    # The inner loop indexes with unsigned constants: Numba then skips negative-index wraparound.
    u_bk, u_tm, u_tn, u_a_ld, u_bn = np.uint64(bk), np.uint64(tm), np.uint64(tn), np.uint64(a_ld), np.uint64(bn)
    u_tx_n, u_ty_n = np.uint64(tx_n), np.uint64(ty_n)

    @jit
    def conv_gemm(y, x, w, b, partial, ktab, geo, operands):
        # Both tiles k-major and flat, so the inner loop's loads are base + constant offsets.
        a_tile = cuda.shared.array(a_size, float32)
        b_tile = cuda.shared.array(b_size, float32)
        acc = cuda.local.array((tm, tn), float32)
        a_reg = cuda.local.array(tm, float32)
        b_reg = cuda.local.array(tn, float32)
        tid = cuda.threadIdx.x
        tx = tid % tx_n
        ty = tid // tx_n
        b_col = tid % bn
        b_row0 = tid // bn
        a_k = tid % bk
        a_row0 = tid // bk
        u_tx = uint64(tx)
        u_ty = uint64(ty)

        cin, height, width, cout = geo[G2_C], geo[G2_H], geo[G2_W], geo[G2_M]
        cg, mg, ow_size = geo[G2_CG], geo[G2_MG], geo[G2_OW]
        sh, sw, ph, pw = geo[G2_SH], geo[G2_SW], geo[G2_PH], geo[G2_PW]
        groups, ktotal, splits, kchunk = geo[GE_GROUP], geo[GE_K], geo[GE_SPLITS], geo[GE_KCHUNK]
        has_bias = geo[GE_HAS_BIAS]
        ohw = geo[G2_OH] * ow_size
        npix = geo[G2_N] * ohw
        ptiles = (npix + bn - 1) // bn
        mtiles = (mg + bm - 1) // bm
        plane = height * width

        for z in range(cuda.blockIdx.z, splits, cuda.gridDim.z):
            k_begin = z * kchunk
            k_end = min(ktotal, k_begin + kchunk)
            for gm in range(cuda.blockIdx.y, groups * mtiles, cuda.gridDim.y):
                g = gm // mtiles
                m0 = (gm - g * mtiles) * bm
                for pt in range(cuda.blockIdx.x, ptiles, cuda.gridDim.x):
                    p0 = pt * bn
                    # The output pixel whose X_col column this thread stages.
                    p = p0 + b_col
                    p_ok = p < npix
                    n = p // ohw
                    q = p - n * ohw
                    oh = q // ow_size
                    ow = q - oh * ow_size
                    ih0 = oh * sh - ph
                    iw0 = ow * sw - pw
                    x_base = (n * cin + g * cg) * plane + ih0 * width + iw0
                    for i in range(tm):
                        for j in range(tn):
                            acc[i, j] = float32(0)
                    for k0 in range(k_begin, k_end, bk):
                        k = k0 + a_k
                        for r in range(a_passes):
                            mm = a_row0 + r * a_rows
                            value = float32(0)
                            if m0 + mm < mg and k < k_end:
                                value = float32(w[(g * mg + m0 + mm) * ktotal + k])
                            a_tile[a_k * a_ld + mm] = value
                        for r in range(b_passes):
                            kk = b_row0 + r * b_rows
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
                            b_tile[kk * bn + b_col] = value
                        cuda.syncthreads()
                        for kk in range(u_bk):
                            a_off = kk * u_a_ld + u_ty
                            b_off = kk * u_bn + u_tx
                            for i in range(u_tm):
                                a_reg[i] = a_tile[a_off + i * u_ty_n]
                            for j in range(u_tn):
                                b_reg[j] = b_tile[b_off + j * u_tx_n]
                            for i in range(u_tm):
                                for j in range(u_tn):
                                    acc[i, j] += a_reg[i] * b_reg[j]
                        cuda.syncthreads()
                    for j in range(tn):
                        pj = p0 + tx + j * tx_n
                        if pj < npix:
                            nj = pj // ohw
                            qj = pj - nj * ohw
                            for i in range(tm):
                                m = m0 + ty + i * ty_n
                                if m < mg:
                                    channel = g * mg + m
                                    if splits == 1:
                                        value = acc[i, j]
                                        if has_bias != 0:
                                            value += float32(b[channel])
                                        o = int64((nj * cout + channel) * ohw + qj)
                                        y[o] = epilogue_fn(value, o, operands)
                                    else:
                                        partial[(z * cout + channel) * npix + pj] = acc[i, j]

    return conv_gemm


@functools.lru_cache(maxsize=None)
def split_sum_kernel(epilogue_fn):
    """``y[n, m, q] = epilogue(sum_z partial[z, m, n * ohw + q] (+ b[m]))``: the split-K
    final reduction, the one place a split node applies its epilogue."""

    @jit
    def split_sum(y, partial, b, has_bias, n_out, cout, ohw, splits, operands):
        npix = n_out // cout
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            q = i % ohw
            rest = i // ohw
            m = rest % cout
            n = rest // cout
            p = n * ohw + q
            total = float32(0)
            for z in range(splits):
                total += partial[(z * cout + m) * npix + p]
            if has_bias != 0:
                total += float32(b[m])
            y[i] = epilogue_fn(total, int64(i), operands)

    return split_sum


@functools.lru_cache(maxsize=None)
def conv_tile_store(bm: int, bn: int, threads: int, epilogue_fn):
    """``store(smem, y, b, partial, operands, g, m0, p0, z, mg, cout, npix, ohw, splits,
    has_bias, tid)``: a block's ``bm x bn`` output tile (output channels x pixels, staged
    row-major in ``smem`` beforehand, between barriers) stored by consecutive threads on
    consecutive pixels: with the bias and the fused epilogue, or with K split as partial
    sums for :func:`split_sum_kernel` (the TF32 tensor-core conv's store)."""

    @jit(device=True)
    def store(smem, y, b, partial, operands, g, m0, p0, z, mg, cout, npix, ohw, splits, has_bias, tid):
        for e in range(tid, bm * bn, threads):
            row = e // bn
            m = m0 + row
            pj = p0 + e - row * bn
            if m < mg and pj < npix:
                channel = g * mg + m
                total = smem[e]
                if splits == 1:
                    if has_bias != 0:
                        total += float32(b[channel])
                    nj = pj // ohw
                    o = int64((nj * cout + channel) * ohw + (pj - nj * ohw))
                    y[o] = epilogue_fn(total, o, operands)
                else:
                    partial[(z * cout + channel) * npix + pj] = total

    return store


def k_table(geo2: np.ndarray) -> np.ndarray:
    """int64[3, K] for K = (c, kh, kw): X offset from the window origin, kh * dh, kw * dw."""
    height, width = int(geo2[G2_H]), int(geo2[G2_W])
    cg, kh, kw = int(geo2[G2_CG]), int(geo2[G2_KH]), int(geo2[G2_KW])
    dh, dw = int(geo2[G2_DH]), int(geo2[G2_DW])
    c, r, s = np.meshgrid(np.arange(cg), np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
    table = np.stack([c * height * width + r * width + s, r, s]).astype(np.int64)
    return table.reshape(3, -1)


def choose_splits(geo: ConvGeometry, config: GemmConfig) -> int:
    """Split K when the output tiles alone cannot fill the GPU."""
    npix = geo.batch * int(np.prod(geo.out_spatial))
    mg = geo.out_channels // geo.group
    tiles = -(-npix // config.bn) * geo.group * -(-mg // config.bm)
    ktiles = -(-(geo.in_channels // geo.group * int(np.prod(geo.kernel))) // config.bk)
    if tiles == 0 or tiles >= SMS:
        return 1
    return max(1, min(-(-2 * SMS // tiles), ktiles // MIN_KTILES_PER_SPLIT))


def is_pointwise(geo: ConvGeometry) -> bool:
    """A 1x1 kernel without padding: each output pixel reads one input pixel per channel."""
    return all(k == 1 for k in geo.kernel) and all(p == 0 for p in geo.pads)


def gemm_tactic(geo: ConvGeometry, dtype, config: GemmConfig | None = None, splits: int | None = None,
                epilogue: Epilogue | None = None, pointwise: bool = False) -> Tactic:
    """The implicit-GEMM tactic of a 1-D or 2-D Conv (see the module doc), or with
    ``pointwise`` the plain GEMM of a 1x1 one (:func:`is_pointwise` must hold).

    ``epilogue`` defaults to none, for a node with inputs X, W and B. The name says the
    form, the tile and whether K is split; ``splits`` itself is a parameter.
    """
    config = config or default_config()
    config.check()
    epilogue = epilogue or no_epilogue(3)
    kernel = gemm_kernel(config.bm, config.bn, config.bk, config.tm, config.tn, epilogue.fn, pointwise)
    launches, workspace_bytes, splits = conv_gemm_launches(geo, dtype, config, config.threads, kernel, splits,
                                                           epilogue, pointwise)
    name = f"{'gemm_1x1' if pointwise else 'implicit_gemm'}_{config.label}{'_splitk' if splits > 1 else ''}"
    return Tactic(name, launches, {**config.params(), "splits": splits}, workspace_bytes)


def conv_gemm_launches(geo: ConvGeometry, dtype, tile, threads: int, kernel, splits: int | None,
                       epilogue: Epilogue, pointwise: bool):
    """``(launches, workspace_bytes, splits)`` of a GEMM-form Conv kernel with
    :func:`gemm_kernel`'s arguments and block loops, for a tile with ``bm``, ``bn`` and
    ``bk`` (output channels, output pixels, K step): the K table, the geometry header, the
    grid, and split K's partial sums with their :func:`split_sum_kernel` launch."""
    assert not geo.transposed and geo.rank in (1, 2)
    assert not pointwise or is_pointwise(geo)
    geo2 = geometry_2d(geo)
    ktotal = int(geo2[G2_CG] * geo2[G2_KH] * geo2[G2_KW])
    ktiles = -(-ktotal // tile.bk)
    splits = choose_splits(geo, tile) if splits is None else int(splits)
    splits = max(1, min(splits, ktiles))
    kchunk = max(1, -(-ktiles // splits)) * tile.bk
    splits = max(1, -(-ktotal // kchunk))
    npix = int(geo2[G2_N] * geo2[G2_OH] * geo2[G2_OW])
    cout = geo.out_channels
    workspace_bytes = 4 * splits * cout * npix if splits > 1 else 0
    ptiles = -(-npix // tile.bn)
    mtiles = -(-(cout // geo.group) // tile.bm)
    grid = (min(ptiles, 2**31 - 1), min(geo.group * mtiles, 65535), min(splits, 65535))
    table = k_table(geo2) if not pointwise else np.zeros((3, 1), np.int64)

    def launches(ins, outs, workspace):
        if geo.out_size == 0:
            return []
        own = ins[:epilogue.first]
        bias = own[2] if len(own) > 2 else None
        header = np.asarray([geo.group, ktotal, splits, kchunk, int(bias is not None)], np.int64)
        b = bias_or_dummy(bias, dtype)
        if splits > 1:
            partial = workspace[:workspace_bytes].view(np.float32)
        else:
            partial = to_device(np.zeros(1, np.float32))
        y = flat(outs[0])
        operands = epilogue.arguments(ins)
        run = [Launch(kernel, grid, threads,
                      (y, flat(own[0]), flat(own[1]), b, partial, to_device(table.reshape(-1)),
                       to_device(np.concatenate([geo2, header])), operands))]
        if splits > 1:
            n_out = geo.out_size
            blocks, block = grid_1d(n_out)
            run.append(Launch(split_sum_kernel(epilogue.fn), blocks, block,
                              (y, partial, b, np.int64(bias is not None), np.int64(n_out), np.int64(cout),
                               np.int64(npix // int(geo2[G2_N])), np.int64(splits), operands)))
        return run

    return launches, workspace_bytes, splits


# --------------------------------------------------------------------------- choosing


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def fits(geo: ConvGeometry, config: GemmConfig, configs) -> bool:
    """Whether a tile is worth offering: not more than twice the problem along M (output
    channels per group) or N (output pixels) when a smaller tile of the set exists."""
    npix = geo.batch * int(np.prod(geo.out_spatial))
    mg = geo.out_channels // geo.group
    return (config.bm <= max(min(c.bm for c in configs), _next_pow2(mg))
            and config.bn <= max(min(c.bn for c in configs), _next_pow2(npix)))


#: Model constants: resident 256-thread blocks per SM, FP32 FMAs per SM and cycle, the
#: GPU's bytes per cycle from memory, and the second launch of a split (cycles).
BLOCKS_PER_SM, FMAS_PER_CYCLE, BYTES_PER_CYCLE, SPLIT_LAUNCH = 2, 128, 2100, 2000


def estimated_cycles(geo: ConvGeometry, config: GemmConfig, splits: int) -> float:
    """A rough run time, only to order the tactics: waves of blocks, each block's FMAs
    at an efficiency that grows with the register tile's reuse, plus a split's partial
    sums written and read back and its second launch."""
    npix = geo.batch * int(np.prod(geo.out_spatial))
    mg = geo.out_channels // geo.group
    ktotal = geo.in_channels // geo.group * int(np.prod(geo.kernel))
    ktiles = -(-ktotal // config.bk)
    per_split = -(-ktiles // splits)
    blocks = geo.group * -(-mg // config.bm) * -(-npix // config.bn) * splits
    waves = -(-blocks // (SMS * BLOCKS_PER_SM))
    reuse = config.tm * config.tn / (config.tm + config.tn)
    efficiency = reuse / (reuse + 2)
    cycles = waves * config.bm * config.bn * config.bk * per_split / (FMAS_PER_CYCLE / BLOCKS_PER_SM * efficiency)
    if splits > 1:
        cycles += 8 * splits * geo.out_channels * npix / BYTES_PER_CYCLE + SPLIT_LAUNCH
    return cycles


def gemm_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue, configs=None) -> list[Tactic]:
    """Every GEMM tactic of the node, fastest estimate first: the plain 1x1 GEMM for
    :func:`is_pointwise` nodes, else the implicit GEMM; per fitting tile one tactic
    without a K split and one with :func:`choose_splits`' split where that is above 1."""
    configs = tuple(configs or default_configs())
    pointwise = is_pointwise(geo)
    candidates = []
    for config in configs:
        if not fits(geo, config, configs):
            continue
        for splits in sorted({1, choose_splits(geo, config)}):
            tactic = gemm_tactic(geo, dtype, config, splits, epilogue, pointwise)
            if splits > 1 and tactic.params["splits"] == 1:
                continue  # K too short to split after all
            candidates.append((estimated_cycles(geo, config, tactic.params["splits"]), len(candidates), tactic))
    return [tactic for _, _, tactic in sorted(candidates, key=lambda c: c[:2])]
