"""The Hopper TF32 tactic of MatMul and Gemm: warpgroup MMA (``wgmma.mma_async``, sm_90a).

``mma.sync`` (:mod:`.tf32`) stalls near a quarter of cuBLAS TF32 on the H200: every
warp loads its fragments from shared memory into registers before each MMA. ``wgmma``
reads both operands straight from shared memory through 64-bit matrix descriptors, four
warps (a warpgroup) at a time, asynchronously, with 64 x ``bn`` x 8 per instruction.

A block is ``wgs`` warpgroups stacked along M (``bm = 64 * wgs``) over a ``bn``-column
tile; each warpgroup owns 64 rows, ``bn / 2`` float32 accumulators per thread. Operand
tiles of K 32 are copied with ``cp.async`` into a ring of ``stages`` shared buffers in the
layout ``wgmma`` reads with the 128-byte swizzle: K-major (TF32 ``wgmma`` reads both
operands K-major), a row's 32 floats in one 128-byte line, its 16-byte chunk ``c`` stored
at chunk ``c ^ (row % 8)``; eight rows make one 1024-byte atom. K-contiguous operands copy
16-byte chunks (consecutive threads along a row: coalesced, and conflict-free thanks to
the swizzle); row-contiguous ones (B of a plain MatMul is ``[K, N]``) copy 4-byte
elements, a warp taking 8 rows x 4 k, transposing on the way in. Out-of-range chunks
are zero-filled (``cp.async``'s source size 0), so any M, N and K (K a multiple of 4
for 16-byte chunks) run with no special edge kernels.

Per K tile ``t``: wait for tile ``t``'s copies, ``fence.proxy.async`` (the copies were
generic-proxy writes; ``wgmma`` reads through the async proxy), barrier; issue four
``wgmma`` (K 8 each) and commit; start the copies of tile ``t + stages - 2`` into the
buffer of tile ``t - 2``; wait until only this tile's MMAs are in flight (so tile
``t - 2``'s buffer was free: every warpgroup had finished its MMAs before the barrier).
The tensor cores always have the next group queued. The output tile then goes through
shared memory to the fused epilogue (:func:`.simt.tile_store`), as the other GEMMs do.

FP16 (:mod:`.wgmma_f16`) and INT8 (:mod:`.wgmma_int8`) operands travel as float32 word
views (2 halves or 4 bytes of K a word), so the copies, ring and descriptors serve them
unchanged; INT8 accumulates in int32 registers and stores through :mod:`.integer_store`.

Operands are not rounded: the tensor cores read TF32 from the float32 bits (the low 13
mantissa bits dropped). In the simulator :func:`.wgmma_intrinsics.emulated_ops` computes
each thread's accumulators by scalar FMAs on the same swizzled tiles, operands truncated
the same way: the copies, layout and epilogue are tested there, the descriptors on a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import float32, int32, int64, uint32

from plugrt.kernels import Epilogue, aligned, cuda, jit, simulated
from plugrt.plugin import Tactic

from . import simt
from .plan import K_, M_, N_, OFFS_W, SAK, SAM, SBK, SBN
from .integer_store import Int8Operands, integer_tile_store
from .simt import choose_splits, fits, grid_fits, is_even, is_float32, twin_name, twin_splits
from .store import gemm_launches, staging_bytes, tile_store
from .wgmma_intrinsics import BK, block_copier, copy_ops, ops_for

#: Shared memory the ring is aligned to (the 128-byte swizzle's 1024-byte atom), in floats.
ATOM_FLOATS = 256


@dataclass(frozen=True)
class WgmmaConfig:
    """``wgs`` warpgroups of 64 rows each over ``bn`` columns (8 to 256, a multiple of 8),
    ``stages`` shared buffers of K 32: ``stages - 2`` tiles copied ahead while one is
    multiplied and the previous one may still be read by MMAs in flight; registers held to
    what ``min_blocks`` resident blocks an SM leave (``launch_bounds``)."""

    wgs: int
    bn: int
    stages: int
    min_blocks: int = 1

    @property
    def bm(self) -> int:
        return 64 * self.wgs

    @property
    def bk(self) -> int:
        return BK

    @property
    def threads(self) -> int:
        return 128 * self.wgs

    @property
    def ld(self) -> int:
        """Row stride (floats) of the staged output tile: 4 past ``bn`` spreads a warp's
        accumulator pairs and the store's 16-byte reads over the banks."""
        return self.bn + 4

    @property
    def accumulators(self) -> int:
        return self.bn // 2

    def check(self) -> None:
        if self.wgs < 1 or self.bn % 8 or not 8 <= self.bn <= 256 or self.stages < 3 or self.min_blocks < 1:
            raise ValueError(f"wgmma GEMM: tile {self} is not 1+ warpgroups over 8..256 columns with 3+ stages")

    def tile(self, bk: int) -> str:
        """``BMxBNxBK_sS`` (K in elements), ``_bB`` for ``min_blocks`` blocks an SM."""
        return f"{self.bm}x{self.bn}x{bk}_s{self.stages}" + (f"_b{self.min_blocks}" if self.min_blocks > 1 else "")

    def params(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": BK, "wgs": self.wgs, "stages": self.stages,
                **({"min_blocks": self.min_blocks} if self.min_blocks > 1 else {})}

    @property
    def name(self) -> str:
        return f"wgmma_{self.tile(BK)}"

    def ring_floats(self) -> int:
        """Shared floats of the ring, plus the slack to align it to an atom."""
        return self.stages * (self.bm + self.bn) * BK + ATOM_FLOATS


#: Configurations offered, best first.
WGMMA_CONFIGS: tuple[WgmmaConfig, ...] = (WgmmaConfig(2, 256, 4), WgmmaConfig(2, 128, 5))


# --------------------------------------------------------------------------- copies


@functools.lru_cache(maxsize=None)
def tile_copier(rows: int, k_contiguous: bool, threads: int, even: bool, emulated: bool):
    """``copy(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid)``: start this
    thread's copies of the operand's ``rows x 32`` tile at ``(row0, k0)`` (element
    ``(r, k)`` at ``src[base + r * srow + k * sk]``) into the swizzled shared tile at
    ``smem[tile]``; elements outside ``nrows x k_end`` become zeros (unless ``even``: whole
    tiles only, no bounds checks).

    K-contiguous (``sk == 1``): thread ``tid`` copies 16-byte chunk ``tid % 8`` of rows
    ``tid // 8 + c * threads / 8``. Row-contiguous (``srow == 1``): warp ``w`` copies
    8 rows x 4 k per step, step ``c`` taking block ``q = w + warps * c`` (k block ``q % 8``,
    row block ``q // 8``); a lane's row is ``lane % 8``, its k ``lane // 8``: 32-byte global
    segments per k, and the swizzle spreads the 32 stores over the 32 banks. Per thread
    everything but ``row0``, ``k0`` and ``c`` is fixed, so the addresses are a few adds.
    """
    copy16, copy4 = copy_ops(emulated)
    if k_contiguous:
        chunks = rows * (BK // 4)
        per_thread = -(-chunks // threads)
        ragged = chunks % threads != 0
        step = threads // 8
        if even and not ragged:
            block = block_copier(per_thread, 16, step * BK, None, emulated)

            @jit(device=True)
            def copy_whole(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
                r_t = tid >> 3
                chunk = (((tid & 7) ^ (r_t & 7)) << 2)
                block(smem, tile + r_t * BK + chunk, src, base + (row0 + r_t) * srow + k0 + ((tid & 7) << 2),
                      step * srow)

            return copy_whole

        @jit(device=True)
        def copy(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
            r_t = tid >> 3
            kc = (tid & 7) << 2
            chunk = (((tid & 7) ^ (r_t & 7)) << 2)  # the swizzled chunk: step is a multiple of 8
            at = base + (row0 + r_t) * srow + k0 + kc
            for c in range(per_thread):
                r = r_t + c * step
                if not ragged or r < rows:
                    ok = even or (row0 + r < nrows and k0 + kc < k_end)
                    copy16(smem, tile + r * BK + chunk, src, at + c * step * srow if ok else base, ok)

        return copy

    warps = threads // 32
    per_thread = -(-rows // warps)
    ragged = rows % warps != 0
    if even and not ragged and warps % 8 == 0:
        # Then a warp's k block is fixed (w % 8) and copy c is c * warps rows further.
        block = block_copier(per_thread, 4, warps * BK, warps, emulated)

        @jit(device=True)
        def copy_rows_whole(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
            lane8 = tid & 7
            kin = (tid >> 3) & 3
            w = tid >> 5
            r = ((w >> 3) << 3) + lane8
            block(smem, tile + r * BK + (((((w & 7) ^ lane8)) << 2) | kin), src,
                  base + row0 + r + (k0 + ((w & 7) << 2) + kin) * sk, 0)

        return copy_rows_whole

    @jit(device=True)
    def copy_rows(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
        lane8 = tid & 7
        kin = (tid >> 3) & 3
        w = tid >> 5
        at = base + row0 + lane8 + (k0 + kin) * sk
        for c in range(per_thread):
            q = w + warps * c
            if not ragged or q < rows:
                kb4 = (q & 7) << 2
                r = ((q >> 3) << 3) + lane8
                ok = even or (row0 + r < nrows and k0 + kb4 + kin < k_end)
                dst = tile + r * BK + ((((q & 7) ^ lane8) << 2) | kin)
                copy4(smem, dst, src, at + (r - lane8) + kb4 * sk if ok else base, ok)

    return copy_rows


# --------------------------------------------------------------------------- kernel


@functools.lru_cache(maxsize=None)
def strided_rows(rows: int, k_contiguous: bool, threads: int, even: bool, emulated: bool):
    """A's copies as :func:`wgmma_kernel` calls them, for an operand read through strides
    (:func:`tile_copier`): ``(setup, copy, slots)`` with ``setup(meta, row0, nrows,
    state, tid)`` once per block (nothing to do here) and ``copy(src, base, srow, sk, row0,
    nrows, k0, k_end, smem, tile, tid, meta, state)``; ``state`` is a local int64 array of
    ``slots`` the setup may fill (a gathering copier's per-row decode)."""
    tile = tile_copier(rows, k_contiguous, threads, even, emulated)

    @jit(device=True)
    def setup(meta, row0, nrows, state, tid):
        state[0] = 0

    @jit(device=True)
    def copy(src, base, srow, sk, row0, nrows, k0, k_end, smem, at, tid, meta, state):
        tile(src, base, srow, sk, row0, nrows, k0, k_end, smem, at, tid)

    return setup, copy, 1


@functools.lru_cache(maxsize=None)
def wgmma_kernel(config: WgmmaConfig, a_k_contiguous: bool, b_k_contiguous: bool, even: bool, split: bool,
                 epilogue_fn, emulated: bool | None = None, half: bool = False, gather=None, vector_fn=None,
                 int8: Int8Operands | None = None):
    """The wgmma GEMM kernel; arguments, grid and split-K as
    :func:`.simt.simt_kernel`, ``config.threads`` threads.

    ``half``: FP16 operands, both K-contiguous, passed as float32 views (a word holds two
    K-neighbours): every copy, swizzle and descriptor works in 4-byte words as for TF32,
    ``meta``'s element counts and strides along K are halved in the kernel, and each
    ``wgmma`` is k16 (8 words, as TF32's k8).

    ``int8``: 8-bit operands, both K-contiguous, as float32 views (four K-neighbours a
    word), each ``wgmma`` k32 (8 words) of ``int8.types`` into int32 accumulators, staged
    as int32 and stored by :func:`.integer_tile_store` (``c``: the zero-point arrays it
    reads; ``partial`` int32).

    ``gather(rows, threads, emulated) -> (setup, copy, slots)`` (hashable; the signatures
    of :func:`strided_rows`) replaces A's strided copies: an implicit GEMM's im2col
    (:mod:`plugrt_builtin_ops.conv.wgmma_nhwc`) gathers A's rows from ``meta``'s own slots."""
    config.check()
    if (half or int8 is not None) and not (a_k_contiguous and b_k_contiguous):
        raise ValueError("wgmma FP16/INT8 GEMM: both operands must be K-contiguous")
    emulated = simulated() if emulated is None else bool(emulated)
    HALF, INT8 = bool(half), int8 is not None
    SHIFT = 2 if INT8 else 1 if HALF else 0  # log2 of the elements of K a 32-bit word holds
    ACC_T = int32 if INT8 else float32
    BM, BN, S, NT, ACC = config.bm, config.bn, config.stages, config.threads, config.accumulators
    A_STAGE, B_STAGE = BM * BK, BN * BK
    B_RING = S * A_STAGE
    WG_ROWS = 64 * BK  # floats of one warpgroup's 64 rows of A
    mma, wait, fence, commit, commit_copies, wait_copies, fence_async, shared_address = ops_for(
        BN, emulated, HALF, int8.types if INT8 else None)
    if gather is None:
        setup_a, copy_a, SLOTS = strided_rows(BM, bool(a_k_contiguous), NT, bool(even), emulated)
    else:
        setup_a, copy_a, SLOTS = gather(BM, NT, emulated)
    copy_b = tile_copier(BN, bool(b_k_contiguous), NT, bool(even), emulated)
    LD = config.ld
    if INT8:
        store_tile = integer_tile_store(BM, BN, NT, bool(even), bool(split), epilogue_fn, LD, int8.corrected)
    else:
        store_tile = tile_store(BM, BN, NT, bool(even), bool(split), epilogue_fn, vector_fn, LD)
    AHEAD = S - 2  # tiles copied ahead: one buffer is multiplied, one still read by MMAs in flight
    PENDING = AHEAD - 1

    def kernel(out, a, b, c, partial, meta, offs, alpha, beta, splits, kchunk, operands):
        smem = cuda.shared.array(0, float32)
        acc = cuda.local.array(ACC, ACC_T)
        state = cuda.local.array(SLOTS, int64)
        m, n, k = meta[M_], meta[N_], meta[K_]
        sam, sak, sbk, sbn = meta[SAM], meta[SAK], meta[SBK], meta[SBN]
        tid = cuda.threadIdx.x
        n0 = cuda.blockIdx.x * BN
        m0 = cuda.blockIdx.y * BM
        bz = cuda.blockIdx.z
        bi = bz // splits
        z = bz - bi * splits
        ao, bo = offs[bi * OFFS_W], offs[bi * OFFS_W + 1]
        kc = kchunk
        if SHIFT:  # in words of two halves or four bytes (each divides: see the FP16 and INT8 tactics)
            k, sam, sbn, ao, bo, kc = k >> SHIFT, sam >> SHIFT, sbn >> SHIFT, ao >> SHIFT, bo >> SHIFT, kchunk >> SHIFT
        k_begin = z * kc
        k_end = min(k, k_begin + kc)
        ring = ((ATOM_FLOATS * 4 - (shared_address(smem) & uint32(ATOM_FLOATS * 4 - 1))) & uint32(ATOM_FLOATS * 4 - 1)) >> 2
        a_ring = ring + (tid >> 7) * WG_ROWS
        b_ring = ring + B_RING
        for i in range(ACC):
            acc[i] = ACC_T(0)
        setup_a(meta, m0, m, state, tid)

        ktiles = int32((k_end - k_begin + BK - 1) // BK)  # (32-bit loop counters: a few instructions a tile)
        for s in range(AHEAD):
            if s < ktiles:
                kt = k_begin + s * BK
                copy_a(a, ao, sam, sak, m0, m, kt, k_end, smem, ring + s * A_STAGE, tid, meta, state)
                copy_b(b, bo, sbn, sbk, n0, n, kt, k_end, smem, b_ring + s * B_STAGE, tid)
            commit_copies()
        slot = int32(0)  # t % S and (t + AHEAD) % S, counted (a division a tile otherwise)
        free = int32(AHEAD)
        for t in range(ktiles):
            wait_copies(PENDING)  # this thread's copies of tile t have landed ...
            fence_async()  # ... are visible to the async proxy ...
            cuda.syncthreads()  # ... everyone's; and everyone's MMAs of tile t - 2 are done
            a_at = a_ring + slot * A_STAGE
            b_at = b_ring + slot * B_STAGE
            fence()
            mma(acc, smem, a_at, b_at)  # K 32 = four K 8 steps, written out: straight-line
            mma(acc, smem, a_at + 8, b_at + 8)  # code keeps the accumulators in place
            mma(acc, smem, a_at + 16, b_at + 16)
            mma(acc, smem, a_at + 24, b_at + 24)
            commit()
            ahead = int32(t + AHEAD)
            if ahead < ktiles:  # into tile t - 2's buffer
                kt = k_begin + ahead * BK
                copy_a(a, ao, sam, sak, m0, m, kt, k_end, smem, ring + free * A_STAGE, tid, meta, state)
                copy_b(b, bo, sbn, sbk, n0, n, kt, k_end, smem, b_ring + free * B_STAGE, tid)
            commit_copies()
            slot = int32(0) if slot == S - 1 else int32(slot + 1)
            free = int32(0) if free == S - 1 else int32(free + 1)
            wait(acc, 1)  # tile t - 1's MMAs are done; tile t's stay in flight
        wait(acc, 0)
        wait_copies(0)
        cuda.syncthreads()

        if INT8:  # int32 sums staged as int32 in the same shared bytes (a float32 store would round them)
            stage = cuda.shared.array(0, int32)
        else:
            stage = smem
        lane = tid & 31
        row = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2)
        col = 2 * (lane & 3)
        for j in range(BN // 8):  # unrolled: constant accumulator indices
            stage[row * LD + col + 8 * j] = acc[4 * j]
            stage[row * LD + col + 8 * j + 1] = acc[4 * j + 1]
            stage[(row + 8) * LD + col + 8 * j] = acc[4 * j + 2]
            stage[(row + 8) * LD + col + 8 * j + 1] = acc[4 * j + 3]
        cuda.syncthreads()
        store_tile(stage, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid)

    kind = "_f16" if HALF else f"_{int8.label}" if INT8 else ""
    kernel.__name__ = (f"{'conv' if gather is not None else 'gemm'}_{config.name}{kind}_"
                       f"{'even' if even else 'guarded'}"
                       f"{'_splitk' if split else ''}")
    return jit(kernel, launch_bounds=(NT, config.min_blocks))


# --------------------------------------------------------------------------- tactics


def operand_layouts(meta: np.ndarray, offs: np.ndarray) -> tuple[bool, bool] | None:
    """``(a_k_contiguous, b_k_contiguous)`` for the copies, or None where the product does
    not suit them: each operand K-contiguous in 16-byte chunks (row stride, batch offsets
    and K multiples of 4) or row-contiguous (4-byte copies)."""
    sam, sak, sbk, sbn, k = (int(meta[i]) for i in (SAM, SAK, SBK, SBN, K_))
    offsets = np.asarray(offs).reshape(-1, OFFS_W)

    def layout(row_stride, k_stride, column):
        if k_stride == 1 and row_stride % 4 == 0 and k % 4 == 0 and not np.any(offsets[:, column] % 4):
            return True
        if row_stride == 1:
            return False
        return None

    a, b = layout(sam, sak, 0), layout(sbn, sbk, 1)
    return None if a is None or b is None else (a, b)


def hopper() -> bool:
    """Whether ``wgmma`` runs here: the simulator (emulated) or a GPU of compute capability 9.0."""
    if simulated():
        return True
    return tuple(cuda.get_current_device().compute_capability) == (9, 0)


def wgmma_tactic(config: WgmmaConfig, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                 alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None, splits: int = 1,
                 emulated: bool | None = None, fallback: Tactic | None = None, ragged: bool = False,
                 split_twin: bool = False) -> Tactic:
    """One wgmma tactic for a planned float32 product (``math="tf32"``); the layouts must
    suit it (:func:`operand_layouts`). A K-contiguous operand array that is not 16-byte
    aligned at launch runs ``fallback`` instead (another tactic of the same product).
    ``ragged``: bounds-checked even where the tiles divide the product (``NAME_ragged``:
    the same kernel at every size, :mod:`plugrt.engine.generic`); with ``split_twin`` too,
    the split kernel and its reduction at every size (:data:`.simt.SPLIT_RAGGED`), ``splits`` as
    :func:`twin_splits` gives them when not given."""
    config.check()
    layouts = operand_layouts(meta, offs)
    if layouts is None:
        raise ValueError(f"wgmma GEMM: operands of strides {meta[[SAM, SAK, SBK, SBN]].tolist()} do not suit {config.name}")
    a_kc, b_kc = layouts
    even = not ragged and is_even(meta, config.bm, config.bn, BK)
    split_twin = ragged and split_twin

    def kernel_for(split, vector):
        return wgmma_kernel(config, a_kc, b_kc, even, split, epilogue.fn, emulated,
                            vector_fn=epilogue.vector if vector else None)

    launches, workspace_bytes, splits = gemm_launches(
        kernel_for, meta, offs, config.bm, config.bn, BK, config.threads,
        staging_bytes(config.bm, config.bn, config.ring_floats(), config.ld), splits, epilogue, alpha, beta, c_index,
        always_split=split_twin)
    if (a_kc or b_kc) and fallback is not None:
        direct = launches

        def launches(ins, outs, workspace):
            if (not a_kc or aligned(ins[0])) and (not b_kc or aligned(ins[1])):
                return direct(ins, outs, workspace)
            return fallback.launches(ins, outs, workspace)

        workspace_bytes = max(workspace_bytes, fallback.workspace_bytes)
    name = twin_name(config.name, splits, ragged, split_twin)
    params = {**config.params(), "splits": "any" if split_twin else splits, "even": even}
    return Tactic(name, launches, params, workspace_bytes, math="tf32")


def wgmma_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                  alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None, configs=None) -> list[Tactic]:
    """The wgmma tactics valid for a planned float32 product on a Hopper GPU (or the
    simulator), split-K first when the output tiles alone cannot fill the GPU; last, each
    tile's ragged twin, offered at every size (the kernels of a dynamic profile's other
    shapes). ``configs``: the tiles, best first (``None``: :data:`WGMMA_CONFIGS`)."""
    if not is_float32(a_dtype, b_dtype, out_dtype) or operand_layouts(meta, offs) is None or not hopper():
        return []
    whole, split, configs = [], [], WGMMA_CONFIGS if configs is None else tuple(configs)
    kw = dict(epilogue=epilogue, alpha=alpha, beta=beta, c_index=c_index)
    for config in configs:
        if not fits(meta, config.bm, config.bn):
            continue
        splits = choose_splits(meta, config.bm, config.bn, BK)
        for s in ((splits, 1) if splits > 1 else (1,)):
            fallback = simt.simt_tactic(simt.SIMT_CONFIGS[0], meta, offs, splits=s, **kw)
            (split if s > 1 else whole).append(wgmma_tactic(config, meta, offs, splits=s, fallback=fallback, **kw))
    fallback = simt.simt_tactic(simt.SIMT_CONFIGS[0], meta, offs, splits=1, **kw)
    # (On a GPU: in the simulator, where the MMAs are emulated, the tiled kernels serve every size.)
    twins = [wgmma_tactic(config, meta, offs, fallback=fallback, ragged=True, split_twin=split_twin,
                          splits=twin_splits(meta, config, BK) if split_twin else 1, **kw)
             for split_twin in (False, True) for config in configs
             if grid_fits(meta, config.bm) and not simulated()]
    return split + whole + twins
