"""The Hopper INT8 tactic of MatMulInteger: the ``wgmma`` GEMM (:mod:`.wgmma`) on 8-bit
operands, int32 accumulation.

int8/uint8 operands travel as float32 views, a 32-bit word holding four K-neighbours, so
the kernel's copies, 128-byte swizzle and descriptors are TF32's word for word (a swizzle
line is 128 values) and each ``wgmma`` is m64nNk32 ``.s32.s8.s8`` (``.u8.s8``,
``.s8.u8``, ``.u8.u8`` for uint8 operands: the same 32 bytes of K as TF32's k8). 8-bit
``wgmma`` reads both operands K-major only, so A must be K-contiguous in 16-byte chunks
(K, its row stride and batch offsets multiples of 16) and B too, or a constant ``[K, N]``
(MatMulInteger's weight) that the tactic holds transposed, ``[N, K]``.

Zero points: absent or known all-zero (the symmetric quantization of plugrt's INT8
builds), the sum is final. Otherwise (scalar, per row of A, per column of B, known or at
run time) the store corrects it (:mod:`.integer_store`) with A's row sums, added up by a
small kernel before the GEMM, and B's column sums, precomputed for a held B. Zero points
that vary along K (no ONNX model has them) get no tactic here: the SIMT tactics serve them.

Split-K as the FP16 tactic's: where the output tiles cannot fill the GPU each split writes
int32 partial sums to the workspace, and a final kernel adds them up (wrapping as one
sum would), corrects them and applies the epilogue once.
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import Epilogue, aligned, flat, grid_1d, to_device
from plugrt.plugin import Launch, Tactic

from . import wgmma
from .integer_store import Int8Operands, integer_split_reduce_kernel, row_sums_kernel
from .plan import K_, M_, N_, NB, OFFS_W, SAK, SAM, SBK, SBN, SZAK, SZBK
from .simt import choose_splits, fits, is_even
from .store import held_operand, split_chunk, staging_bytes
from .wgmma import BK, WgmmaConfig, hopper, wgmma_kernel
from .wgmma_intrinsics import int8_columns_ok

#: K (in values) of one 128-byte swizzle line of 8-bit values.
INT8_BK = 4 * BK
#: ``wgmma``'s name of each operand dtype.
PTX_TYPES = {np.dtype(np.int8): "s8", np.dtype(np.uint8): "u8"}
#: Workspace regions start on this many bytes.
REGION_ALIGN = 256


def _byte_chunks(row_stride: int, k_stride: int, k: int, offsets: np.ndarray) -> bool:
    """A K-contiguous 8-bit operand in whole 16-byte chunks (16 values)."""
    return k_stride == 1 and row_stride % 16 == 0 and k % 16 == 0 and not np.any(offsets % 16)


def wgmma_int8_tactics(a_dtype, b_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                       symmetric: bool, b_value=None, fallback: Tactic | None = None,
                       emulated: bool | None = None) -> list[Tactic]:
    """The INT8 wgmma tactics of a planned MatMulInteger product (int32 accumulation, the
    epilogue given the int32 value) on a Hopper GPU (or the simulator): A K-contiguous in
    16-byte chunks; B too, or a constant ``[K, N]`` (``b_value``) held transposed.
    ``symmetric``: both zero points absent or known zeros (no correction). ``fallback``
    runs where an operand is not 16-byte aligned at launch."""
    types = (PTX_TYPES.get(np.dtype(a_dtype)), PTX_TYPES.get(np.dtype(b_dtype)))
    if None in types or not hopper():
        return []
    if not symmetric and (int(meta[SZAK]) or int(meta[SZBK])):
        return []
    meta, table = meta.copy(), np.asarray(offs).reshape(-1, OFFS_W).copy()
    nb, k, n = int(meta[NB]), int(meta[K_]), int(meta[N_])
    held = None
    if int(meta[SBK]) != 1:
        if b_value is None or np.asarray(b_value).size != k * n or table[:, 1].any() or int(meta[SBN]) != 1:
            return []
        held = held_operand(b_value, b_dtype, k, n)
        meta[SBK], meta[SBN] = 1, k
    if not (_byte_chunks(int(meta[SAM]), int(meta[SAK]), k, table[:, 0])
            and _byte_chunks(int(meta[SBN]), int(meta[SBK]), k, table[:, 1])):
        return []
    operands = Int8Operands(".".join(types), corrected=not symmetric)
    col_sums = None
    if held is not None and operands.corrected:  # int64 sums wrapped to int32, as the kernel's would
        sums = held.derived("column_sums", lambda host: host.astype(np.int64).sum(axis=1).astype(np.int32))
        col_sums = np.tile(sums, nb)
    offs = np.ascontiguousarray(table.reshape(-1))
    found = []
    for config in wgmma.WGMMA_CONFIGS:
        if not int8_columns_ok(config.bn) or not fits(meta, config.bm, config.bn):
            continue
        splits = choose_splits(meta, config.bm, config.bn, INT8_BK)
        for s in ((splits, 1) if splits > 1 else (1,)):
            found.append(int8_tactic(config, meta, offs, operands, held, col_sums, s, epilogue, fallback, emulated))
    return found


def _regions(sizes: list[int]) -> list[int]:
    """Byte offsets of consecutive workspace regions of ``sizes`` bytes, and the total last."""
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at += -(-size // REGION_ALIGN) * REGION_ALIGN
    return starts + [at]


def int8_tactic(config: WgmmaConfig, meta: np.ndarray, offs: np.ndarray, operands: Int8Operands, held, col_sums,
                splits: int, epilogue: Epilogue, fallback: Tactic | None = None, emulated: bool | None = None) -> Tactic:
    """One INT8 wgmma tactic; ``meta``/``offs`` describe the product as the kernel reads it
    (B ``[N, K]``: ``held``, a :class:`~.store.HeldOperand`, when the tactic holds it, with its column sums ``col_sums``
    tiled over the batch where zero points are corrected)."""
    nb, m, n, k = (int(meta[s]) for s in (NB, M_, N_, K_))
    total = nb * m * n
    splits, kchunk = split_chunk(k, INT8_BK, splits)
    split = splits > 1
    corrected = operands.corrected
    # The workspace: int32 partial sums (split K), A's row sums, B's column sums (not held).
    starts = _regions([4 * splits * total if split else 0, 4 * nb * m if corrected else 0,
                       4 * nb * n if corrected and held is None else 0])
    kernel = wgmma_kernel(config, True, True, is_even(meta, config.bm, config.bn, INT8_BK), split, epilogue.fn,
                          emulated, int8=operands)
    grid = (-(-n // config.bn), -(-m // config.bm), nb * splits)
    shared = staging_bytes(config.bm, config.bn, config.ring_floats(), config.ld)

    def launches(ins, outs, workspace):
        if total == 0:
            return []
        own = ins[:epilogue.first]
        if not (aligned(own[0]) and (held is not None or aligned(own[1]))):
            if fallback is None:
                raise ValueError("wgmma INT8 GEMM: an operand is not 16-byte aligned and there is no fallback")
            return fallback.launches(ins, outs, workspace)
        out, a = flat(outs[0]), flat(own[0])
        b = held.device() if held is not None else flat(own[1])
        meta_d, offs_d = to_device(meta), to_device(offs)

        def region(index, count):
            return workspace[starts[index]:starts[index] + 4 * count].view(np.int32)

        run = []
        if corrected:
            azp, bzp = (flat(own[i]) if len(own) > i and own[i] is not None else to_device(np.zeros(1, x.dtype))
                        for i, x in ((2, a), (3, b)))
            rows, cols = region(1, nb * m), to_device(col_sums) if held is not None else region(2, nb * n)
            sums = [(rows, a, 0, meta[SAM], m)] + ([(cols, b, 1, meta[SBN], n)] if held is None else [])
            for target, src, column, stride, count in sums:
                run.append(Launch(row_sums_kernel(), *grid_1d(nb * count),
                                  (target, src, offs_d, np.int64(column), np.int64(stride), np.int64(count),
                                   np.int64(k), np.int64(nb))))
            zp = (azp, bzp, rows, cols, offs_d)
        else:
            none = to_device(np.zeros(1, np.int32))
            zp = (none, none, none, none, offs_d)
        partial = region(0, splits * total) if split else to_device(np.zeros(1, np.int32))
        arguments = epilogue.arguments(ins)
        run.append(Launch(kernel, grid, config.threads,
                          (out, a.view(np.float32), b.view(np.float32), zp, partial, meta_d, offs_d, np.float32(1),
                           np.float32(0), np.int64(splits), np.int64(kchunk), arguments), shared))
        if split:
            run.append(Launch(integer_split_reduce_kernel(epilogue.fn, corrected), *grid_1d(total),
                              (out, partial, zp, meta_d, np.int64(splits), arguments)))
        return run

    workspace_bytes = starts[-1]
    if fallback is not None:
        workspace_bytes = max(workspace_bytes, fallback.workspace_bytes)
    name = (f"wgmma_{operands.label}_{config.tile(INT8_BK)}"
            + (f"_splitk{splits}" if split else ""))
    params = {**config.params(), "bk": INT8_BK, "splits": splits, "held_b": held is not None,
              "operands": operands.types, "zero_points": "corrected" if corrected else "none"}
    return Tactic(name, launches, params, workspace_bytes)
