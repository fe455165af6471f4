"""The SIMT SGEMM tactics of MatMul and Gemm: float32 on the CUDA cores, tuned for big products.

A block computes a ``bm x bn`` output tile; each of its ``(bm / tm) * (bn / tn)`` threads
owns a ``tm x tn`` register tile, laid out in strips of 4 rows (columns) strided over the
block tile, so one thread's operands for a K step are contiguous shared-memory words and
a warp's reads are broadcasts or conflict-free. Both operand tiles are staged **k-major**
(A transposed: ``sa[k * lda + m]``, B as ``sb[k * ldb + n]``) in two shared buffers: while
the block multiplies tile ``k`` from one buffer, each thread already holds tile ``k + 1``
in registers, loaded from global memory, and stores it into the other buffer afterwards
(one barrier per K step). The outer-product loop runs over closure constants only, so it
unrolls and the accumulators stay in registers.

Kernels are compiled per shape class: ``even`` when M, N and K are multiples of the tile
(no bounds checks) or guarded; the global loads follow the operand whose stride is 1. Split-K (``splits > 1``, for few output
tiles and a long K) makes ``gridDim.z`` cover ``batch x splits``; every split writes float32
partial sums to the workspace and :func:`split_reduce_kernel` adds them up and applies
alpha, Gemm's C and the fused epilogue exactly once.

The operand staging (:func:`tile_loader`) serves the tensor-core tactics (:mod:`.tf32`) too;
the store side (tile store, fused epilogue, split-K reduction, launches) is :mod:`.store`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import float32, int64

from plugrt.kernels import Epilogue, cuda, jit, vector4
from plugrt.plugin import Tactic

from .plan import K_, M_, N_, NB, OFFS_W, SAK, SAM, SBK, SBN
from .store import gemm_launches, staging_bytes, tile_store

#: Streaming multiprocessors of the target GPU (H200): split-K aims for two blocks per SM.
SMS = 132
#: A K split gets at least this many BK-deep tiles.
MIN_KTILES_PER_SPLIT = 8
#: Largest gridDim.y / gridDim.z.
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class SimtConfig:
    """Block tile ``bm x bn``, K step ``bk``, register tile ``tm x tn`` per thread;
    ``occupancy``: the blocks per SM asked of ptxas through launch bounds (2 caps a
    256-thread block at 128 registers per thread, 1 lets it use up to 255)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    occupancy: int = 2

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def check(self) -> None:
        nt = self.threads
        strips = all(t % min(4, t) == 0 for t in (self.tm, self.tn))
        if not (self.bm % self.tm == 0 and self.bn % self.tn == 0 and strips
                and (self.bm * self.bk) % nt == 0 and (self.bn * self.bk) % nt == 0):
            raise ValueError(f"SIMT SGEMM: tile {self} does not divide evenly among its {nt} threads")

    def params(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": self.bk, "tm": self.tm, "tn": self.tn, "occupancy": self.occupancy}

    @property
    def name(self) -> str:
        return f"simt{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}" + ("" if self.occupancy == 2 else
                                                                         f"_occ{self.occupancy}")


#: Configurations offered on a GPU, best first for big products (tests swap in tiny ones).
#: Measured on the H200 at 4096^3: 8x4 register tiles in 512 threads (126 registers, no
#: spills) 25.2 TFLOP/s; 8x8 in 256 threads 24.8 with up to 255 registers, but 22.0 when
#: capped at 128 (168 bytes of spills per thread).
SIMT_CONFIGS: tuple[SimtConfig, ...] = (
    SimtConfig(128, 128, 8, 8, 4, occupancy=1),
    SimtConfig(128, 128, 8, 8, 8, occupancy=1),
    SimtConfig(128, 64, 8, 8, 8, occupancy=1),
    SimtConfig(64, 128, 8, 8, 8, occupancy=1),
)


# --------------------------------------------------------------------------- staging


@functools.lru_cache(maxsize=None)
def tile_loader(rows: int, bk: int, ld: int, threads: int, k_contiguous: bool, even: bool):
    """``(fetch, stash)`` device functions that stage one operand's ``rows x bk`` tile.

    The operand is read as ``src[base + row * srow + k * sk]`` (A: rows are M; B: rows are N,
    ``srow`` = B's column stride). ``fetch(src, base, srow, sk, row0, k0, nrows, kend, tid,
    regs)`` loads this thread's ``rows * bk / threads`` elements into ``regs`` (zeros outside
    ``nrows x kend`` unless compiled ``even``); ``stash(regs, smem, offset, tid)`` stores them
    k-major at ``smem[offset + k * ld + row]``. Consecutive threads walk K when
    ``k_contiguous`` (the operand's K stride is 1), else the rows, so loads coalesce.
    """
    loads = rows * bk // threads

    @jit(device=True)
    def slot(e):
        """(k, row) of the tile element thread load ``e`` moves: consecutive along the
        contiguous axis, so global loads coalesce."""
        if k_contiguous:
            return e % bk, e // bk
        return e // rows, e % rows

    @jit(device=True)
    def fetch(src, base, srow, sk, row0, k0, nrows, kend, tid, regs):
        for r in range(loads):
            kk, rr = slot(tid + r * threads)
            gr = row0 + rr
            gk = k0 + kk
            value = float32(0)
            if even or (gr < nrows and gk < kend):
                value = float32(src[base + gr * srow + gk * sk])
            regs[r] = value

    @jit(device=True)
    def stash(regs, smem, offset, tid):
        for r in range(loads):
            kk, rr = slot(tid + r * threads)
            smem[offset + kk * ld + rr] = regs[r]

    return fetch, stash


def loads_per_thread(rows: int, bk: int, threads: int) -> int:
    return rows * bk // threads


def launch_bounds(threads: int, occupancy: int = 2) -> tuple[int, int]:
    """``(threads, blocks per SM)``: with the default, at most 128 registers per thread for
    256-thread blocks, so two share an SM."""
    return threads, max(1, occupancy * 256 // threads)


# --------------------------------------------------------------------------- kernels


@functools.lru_cache(maxsize=None)
def simt_kernel(config: SimtConfig, a_k_contiguous: bool, b_k_contiguous: bool, even: bool, split: bool,
                epilogue_fn, vector_fn=None):
    """The SIMT SGEMM kernel for one configuration, operand layout, shape class and epilogue.

    Arguments: ``(out, a, b, c, partial, meta, offs, alpha, beta, splits, kchunk, operands)``
    with ``meta``/``offs`` as :func:`.plan.product_plan` makes
    them. Grid: ``(N tiles, M tiles, batch * splits)``; dynamic shared memory
    :func:`staging_bytes`. With ``split`` the kernel writes raw sums to the workspace
    (see :func:`tile_store`) instead of ``out``.
    """
    config.check()
    BM, BN, BK, TM, TN = config.bm, config.bn, config.bk, config.tm, config.tn
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    VM, VN = min(4, TM), min(4, TN)          # strip widths
    LDA, LDB = BM + 4, BN + 4                # padding spreads the transposing stores over banks
    A_SIZE, B_SIZE = BK * LDA, BK * LDB
    B_AT = 2 * A_SIZE                        # smem: two A buffers, then two B buffers
    TMN = TM * TN
    A_LOADS, B_LOADS = loads_per_thread(BM, BK, NT), loads_per_thread(BN, BK, NT)
    fetch_a, stash_a = tile_loader(BM, BK, LDA, NT, bool(a_k_contiguous), bool(even))
    fetch_b, stash_b = tile_loader(BN, BK, LDB, NT, bool(b_k_contiguous), bool(even))
    store_tile = tile_store(BM, BN, NT, bool(even), bool(split), epilogue_fn, vector_fn)
    # Unsigned shared-memory indices: no negative-index wraparound code in the hot loop.
    U = np.uint64
    UBK, ULDA, ULDB, UA_STRIDE, UB_STRIDE = U(BK), U(LDA), U(LDB), U(TY * VM), U(TX * VN)
    UA_SIZE, UB_SIZE, UB_AT = U(A_SIZE), U(B_SIZE), U(B_AT)
    UTM, UTN, UVM, UVN = U(TM), U(TN), U(VM), U(VN)
    # Whole strips of 4 at 16-byte aligned offsets (LDA, LDB, buffer sizes and strip
    # strides are multiples of 4 words) are read with vector loads.
    VECTOR = VM == 4 and VN == 4
    U1, U2, U3 = U(1), U(2), U(3)
    load4, _ = vector4()

    def kernel(out, a, b, c, partial, meta, offs, alpha, beta, splits, kchunk, operands):
        smem = cuda.shared.array(0, float32)  # A buffers, B buffers; later the output tile
        acc = cuda.local.array(TMN, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        ga = cuda.local.array(A_LOADS, float32)
        gb = cuda.local.array(B_LOADS, float32)
        m, n, k = meta[M_], meta[N_], meta[K_]
        sam, sak, sbk, sbn = meta[SAM], meta[SAK], meta[SBK], meta[SBN]
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        n0 = cuda.blockIdx.x * BN
        m0 = cuda.blockIdx.y * BM
        bz = cuda.blockIdx.z
        bi = bz // splits
        z = bz - bi * splits
        k_begin = z * kchunk
        k_end = min(k, k_begin + kchunk)
        ao, bo = offs[bi * OFFS_W], offs[bi * OFFS_W + 1]
        for i in range(TMN):
            acc[i] = float32(0)

        fetch_a(a, ao, sam, sak, m0, k_begin, m, k_end, tid, ga)
        fetch_b(b, bo, sbn, sbk, n0, k_begin, n, k_end, tid, gb)
        stash_a(ga, smem, 0, tid)
        stash_b(gb, smem, B_AT, tid)
        cuda.syncthreads()
        ktiles = (k_end - k_begin + BK - 1) // BK
        a_thread = U(ty * VM)
        b_thread = U(tx * VN)
        for t in range(ktiles):
            cur = U(t & 1)
            more = t + 1 < ktiles
            if more:  # the next tile's global loads overlap this tile's math
                k_next = k_begin + (t + 1) * BK
                fetch_a(a, ao, sam, sak, m0, k_next, m, k_end, tid, ga)
                fetch_b(b, bo, sbn, sbk, n0, k_next, n, k_end, tid, gb)
            a_base = cur * UA_SIZE + a_thread
            b_base = UB_AT + cur * UB_SIZE + b_thread
            for kk in range(UBK):
                a_row = a_base + kk * ULDA
                b_row = b_base + kk * ULDB
                if VECTOR:  # strips of 4 words, 16-byte aligned: one ld.shared.v4 each
                    for s in range(UTM // UVM):
                        ra[UVM * s], ra[UVM * s + U1], ra[UVM * s + U2], ra[UVM * s + U3] = load4(
                            smem, a_row + s * UA_STRIDE)
                    for s in range(UTN // UVN):
                        rb[UVN * s], rb[UVN * s + U1], rb[UVN * s + U2], rb[UVN * s + U3] = load4(
                            smem, b_row + s * UB_STRIDE)
                else:
                    for i in range(UTM):
                        ra[i] = smem[a_row + (i // UVM) * UA_STRIDE + i % UVM]
                    for j in range(UTN):
                        rb[j] = smem[b_row + (j // UVN) * UB_STRIDE + j % UVN]
                for i in range(UTM):
                    for j in range(UTN):
                        acc[i * UTN + j] += ra[i] * rb[j]
            if more:
                other = int64(1 - (t & 1))
                stash_a(ga, smem, other * A_SIZE, tid)
                stash_b(gb, smem, B_AT + other * B_SIZE, tid)
            cuda.syncthreads()

        for i in range(TM):  # unrolled: constant accumulator indices
            row = (i // VM) * (TY * VM) + ty * VM + (i % VM)
            for j in range(TN):
                smem[row * BN + (j // VN) * (TX * VN) + tx * VN + (j % VN)] = acc[i * TN + j]
        cuda.syncthreads()
        store_tile(smem, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid)

    kernel.__name__ = f"sgemm_{config.name}_{'even' if even else 'guarded'}{'_splitk' if split else ''}"
    return jit(kernel, launch_bounds=launch_bounds(NT, config.occupancy))


# --------------------------------------------------------------------------- tactics


def is_float32(*dtypes) -> bool:
    return all(np.dtype(d) == np.float32 for d in dtypes)


def fits(meta: np.ndarray, bm: int, bn: int) -> bool:
    """Whether a ``bm x bn`` block tile suits the product: it fills at least half a tile
    along M and N (smaller products waste most of it: the tiled and direct tactics serve
    them) and the grid fits CUDA's limits."""
    nb, m, n, k = (int(meta[s]) for s in (NB, M_, N_, K_))
    return (k > 0 and 2 * m >= bm and 2 * n >= bn and -(-m // bm) <= MAX_GRID_YZ and nb <= MAX_GRID_YZ)


def grid_fits(meta: np.ndarray, bm: int) -> bool:
    """Whether a product of any size fits CUDA's grid limits with ``bm``-row tiles (what a
    ragged tactic, offered at every size, needs: :func:`fits` without its size preference)."""
    nb, m, k = (int(meta[s]) for s in (NB, M_, K_))
    return k > 0 and -(-m // bm) <= MAX_GRID_YZ and nb <= MAX_GRID_YZ


def is_even(meta: np.ndarray, bm: int, bn: int, bk: int) -> bool:
    return int(meta[M_]) % bm == 0 and int(meta[N_]) % bn == 0 and int(meta[K_]) % bk == 0


def choose_splits(meta: np.ndarray, bm: int, bn: int, bk: int) -> int:
    """K splits for a product whose output tiles cannot fill the GPU (1: no split)."""
    nb, m, n, k = (int(meta[s]) for s in (NB, M_, N_, K_))
    tiles = nb * -(-m // bm) * -(-n // bn)
    ktiles = -(-k // bk)
    if tiles == 0 or tiles >= SMS:
        return 1
    return max(1, min(-(-2 * SMS // tiles), ktiles // MIN_KTILES_PER_SPLIT, MAX_GRID_YZ // max(nb, 1)))


#: The name suffix of a tile's ragged twins: bounds-checked at every size, offered at every
#: size, the kernels a dynamic profile's other shapes run (:mod:`plugrt.engine.generic`).
#: Each tile has two: whole (``NAME_ragged``) and split-K (``NAME_splitk_ragged``: always
#: the split kernel and its reduction, K split as the size asks, one split included), the
#: twin of the tile's split tactics, which few output tiles (small batches, short
#: sequences) need to fill the GPU.
RAGGED = "_ragged"
SPLIT_RAGGED = "_splitk" + RAGGED


def twin_name(base: str, splits: int, ragged: bool, split_twin: bool) -> str:
    """A GEMM tactic's name: ``base``, its split count, or its twin's suffix (:data:`RAGGED`)."""
    if ragged:
        return base + (SPLIT_RAGGED if split_twin else RAGGED)
    return base + (f"_splitk{splits}" if splits > 1 else "")


def twin_splits(meta: np.ndarray, config, bk: int) -> int:
    """The K splits of a split twin at this size: the split tactics' choice, at least one."""
    return choose_splits(meta, config.bm, config.bn, bk)


def simt_tactic(config: SimtConfig, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue, alpha: float = 1.0,
                beta: float = 0.0, c_index: int | None = None, splits: int = 1) -> Tactic:
    """One SIMT SGEMM tactic for a planned float32 product (see the module doc)."""
    config.check()
    even = is_even(meta, config.bm, config.bn, config.bk)
    a_kc, b_kc = int(meta[SAK]) == 1, int(meta[SBK]) == 1

    def kernel_for(split, vector):
        return simt_kernel(config, a_kc, b_kc, even, split, epilogue.fn, epilogue.vector if vector else None)

    mainloop = 2 * config.bk * (config.bm + 4 + config.bn + 4)
    launches, workspace_bytes, splits = gemm_launches(
        kernel_for, meta, offs, config.bm, config.bn, config.bk, config.threads,
        staging_bytes(config.bm, config.bn, mainloop), splits, epilogue, alpha, beta, c_index)
    name = config.name + (f"_splitk{splits}" if splits > 1 else "")
    return Tactic(name, launches, {**config.params(), "splits": splits}, workspace_bytes)


def simt_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                 alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None) -> list[Tactic]:
    """The SIMT SGEMM tactics valid for a planned product, best first: split-K variants
    first when the output tiles alone cannot fill the GPU. Empty unless all float32."""
    if not is_float32(a_dtype, b_dtype, out_dtype):
        return []
    whole, split = [], []
    for config in SIMT_CONFIGS:
        if not fits(meta, config.bm, config.bn):
            continue
        kw = dict(epilogue=epilogue, alpha=alpha, beta=beta, c_index=c_index)
        whole.append(simt_tactic(config, meta, offs, **kw))
        splits = choose_splits(meta, config.bm, config.bn, config.bk)
        if splits > 1:
            split.append(simt_tactic(config, meta, offs, splits=splits, **kw))
    return split + whole

