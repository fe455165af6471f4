"""The Hopper FP16 tactic of MatMul and Gemm: the ``wgmma`` GEMM (:mod:`.wgmma`) on FP16
operands, float32 accumulation, FP16 or float32 out.

FP16 operands travel as float32 views, a 32-bit word holding two K-neighbours, so the
kernel's copies, 128-byte swizzle and descriptors are TF32's word for word (a swizzle line
is 64 halves) and each ``wgmma`` is m64nNk16 (the same 32 bytes of K as TF32's k8). Both
operands must be K-contiguous in 16-byte chunks: ``wgmma`` reads FP16 K-major here, and
2-byte elements cannot be transposed by ``cp.async``. A MatMul weight ``[K, N]`` (a
constant B) is held transposed by the tactic, ``[N, K]``, so weight products qualify.
"""

from __future__ import annotations

import numpy as np
from plugrt.kernels import Epilogue, aligned, simulated
from plugrt.plugin import Tactic

from .plan import K_, N_, OFFS_W, SAK, SAM, SBK, SBN
from .simt import choose_splits, fits, grid_fits, is_even, twin_name, twin_splits
from .store import gemm_launches, held_operand, staging_bytes
from .wgmma import BK, WgmmaConfig, hopper, wgmma_kernel

#: K (in halves) of one 128-byte swizzle line of FP16.
HALF_BK = 2 * BK


def _half_chunks(row_stride: int, k_stride: int, k: int, offsets: np.ndarray) -> bool:
    """A K-contiguous FP16 operand in whole 16-byte chunks (8 halves)."""
    return k_stride == 1 and row_stride % 8 == 0 and k % 8 == 0 and not np.any(offsets % 8)


def wgmma_half_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                       alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None, b_value=None,
                       fallback: Tactic | None = None, emulated: bool | None = None,
                       configs=None) -> list[Tactic]:
    """The FP16 wgmma tactics (float32 accumulation, FP16 or float32 out) of a planned
    product on a Hopper GPU (or the simulator): A K-contiguous in 16-byte chunks; B too, or
    a constant ``[K, N]`` (``b_value``, a MatMul's weight), which the tactic holds
    transposed, ``[N, K]``. An operand not 16-byte aligned at launch runs ``fallback``.
    ``configs``: the tiles, best first (``None``: :data:`.wgmma.WGMMA_CONFIGS`)."""
    half = np.dtype(np.float16)
    if np.dtype(a_dtype) != half or np.dtype(b_dtype) != half or np.dtype(out_dtype) not in (half, np.float32):
        return []
    if not hopper():
        return []
    meta, table = meta.copy(), np.asarray(offs).reshape(-1, OFFS_W).copy()
    k, n = int(meta[K_]), int(meta[N_])
    held = None
    if int(meta[SBK]) != 1:
        if b_value is None or np.asarray(b_value).size != k * n or table[:, 1].any() or int(meta[SBN]) != 1:
            return []
        held = held_operand(b_value, half, k, n)
        meta[SBK], meta[SBN] = 1, k
    if not (_half_chunks(int(meta[SAM]), int(meta[SAK]), k, table[:, 0])
            and _half_chunks(int(meta[SBN]), int(meta[SBK]), k, table[:, 1])):
        return []
    offs = np.ascontiguousarray(table.reshape(-1))

    def operands(a, b):
        if held is not None:
            b = held.device()
        return a.view(np.float32), b.view(np.float32)

    from . import wgmma

    found, configs = [], wgmma.WGMMA_CONFIGS if configs is None else tuple(configs)
    for config in configs:
        if not fits(meta, config.bm, config.bn):
            continue
        splits = choose_splits(meta, config.bm, config.bn, HALF_BK)
        for s in ((splits, 1) if splits > 1 else (1,)):
            found.append(_half_tactic(config, meta, offs, operands, held is not None, s, epilogue, alpha, beta,
                                      c_index, fallback, emulated))
    # Last, each tile's ragged twin, offered at every size (a dynamic profile's other shapes).
    # (Whole and split-K twins: simt.RAGGED.)
    return found + [_half_tactic(config, meta, offs, operands, held is not None,
                                 twin_splits(meta, config, HALF_BK) if split_twin else 1, epilogue, alpha, beta,
                                 c_index, fallback, emulated, ragged=True, split_twin=split_twin)
                    for split_twin in (False, True) for config in configs
                    if grid_fits(meta, config.bm) and not simulated()]


def _half_tactic(config: WgmmaConfig, meta, offs, operands, holds_b: bool, splits: int, epilogue: Epilogue,
                 alpha: float, beta: float, c_index, fallback: Tactic | None, emulated, ragged: bool = False,
                 split_twin: bool = False) -> Tactic:
    even = not ragged and is_even(meta, config.bm, config.bn, HALF_BK)
    split_twin = ragged and split_twin

    def kernel_for(split, vector):
        return wgmma_kernel(config, True, True, even, split, epilogue.fn, emulated, True,
                            vector_fn=epilogue.vector if vector else None)

    direct, workspace_bytes, splits = gemm_launches(
        kernel_for, meta, offs, config.bm, config.bn, HALF_BK, config.threads,
        staging_bytes(config.bm, config.bn, config.ring_floats(), config.ld), splits, epilogue, alpha, beta, c_index, operands,
        always_split=split_twin)

    def launches(ins, outs, workspace):
        if aligned(ins[0]) and (holds_b or aligned(ins[1])):
            return direct(ins, outs, workspace)
        if fallback is None:
            raise ValueError("wgmma FP16 GEMM: an operand is not 16-byte aligned and there is no fallback")
        return fallback.launches(ins, outs, workspace)

    if fallback is not None:
        workspace_bytes = max(workspace_bytes, fallback.workspace_bytes)
    name = twin_name(f"wgmma_f16_{config.tile(HALF_BK)}", splits, ragged, split_twin)
    params = {**config.params(), "bk": HALF_BK, "splits": "any" if split_twin else splits, "held_b": holds_b,
              "even": even}
    return Tactic(name, launches, params, workspace_bytes)
