"""CUDA kernels and tactics of ConvIntegerNHWC: int8/uint8 convolutions over channels-last
tensors, accumulating in int32.

- ``direct_nhwc``: one output per thread, any spatial rank (up to :data:`MAX_RANK`), group
  and zero points; zero points subtracted on load, padding contributes nothing.
  Consecutive threads take consecutive output channels of one pixel, reading the same
  input channels. The plainly-correct tactic, first in the simulator.
- ``wgmma_nhwc_s8s8``...: the Hopper implicit GEMM on ``wgmma``'s 8-bit tensor cores:
  the matmul family's kernel (:func:`plugrt_builtin_ops.matmul.wgmma.wgmma_kernel`) in
  its INT8 form (a 32-bit word holds four K-neighbours; each ``wgmma`` is k32 into int32
  accumulators) with the conv family's NHWC gather
  (:func:`plugrt_builtin_ops.conv.wgmma_nhwc.nhwc_gather`) copying A's rows: Y ``[P, M]``
  = X_col ``[P, K]`` by W ``[M, K]``, ``K = (kh, kw, c)``, so Y comes out NHWC. 1-D or
  2-D, one group, C a multiple of 16 (the gather's 16-byte chunks must not straddle a
  tap), where the operands are symmetric: both zero points absent or known zeros. A
  nonzero x zero point would be wrong here, not just slower: the gather's ``cp.async``
  zero-fills the chunks outside the image, where the padding must read as the zero
  point. Split K as MatMulInteger's INT8 tactic (int32 partial sums, one reduction).
- ``gemm_1x1_wgmma_s8s8``...: a pointwise layer (1x1, unit strides, no padding) is X
  ``[N*H*W, C]`` by W ``[M, C]``, so the matmul family's own INT8 wgmma GEMM serves it
  too (no gather), first on a GPU, as FP16's 1x1 convolutions.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import int32, int64

from plugrt.kernels import Epilogue, aligned, c_strides, cuda, flat, grid_1d, jit, simulated, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.conv import wgmma_nhwc
from plugrt_builtin_ops.matmul.integer_store import Int8Operands, integer_split_reduce_kernel
from plugrt_builtin_ops.matmul.plan import K_, M_, N_, OFFS_W
from plugrt_builtin_ops.matmul.simt import choose_splits, is_even
from plugrt_builtin_ops.matmul.store import split_chunk, staging_bytes
from plugrt_builtin_ops.matmul.wgmma import WgmmaConfig, hopper, wgmma_kernel
from plugrt_builtin_ops.matmul.wgmma_int8 import INT8_BK, PTX_TYPES, wgmma_int8_tactics
from plugrt_builtin_ops.matmul.wgmma_intrinsics import int8_columns_ok

from .conv_integer import MAX_RANK

#: Input channels the wgmma tactic needs: whole 16-byte chunks of int8.
WGMMA_CHANNELS = 16
#: What the tactics' ``params["format"]`` say of their tensors.
FORMAT = wgmma_nhwc.FORMAT

# The direct kernel's table: a header, then rows of ``rank`` values.
_N, _C, _M, _CG, _MG, _RANK, _TAPS, _IN_SIZE = range(8)
_HEADER = 8
_IN, _OUT, _STRIDE, _PAD, _IN_STRIDE = range(5)


def direct_table(geo) -> np.ndarray:
    """The direct kernel's int64 table: the header (``_TAPS``: kernel positions), then the
    input and output sizes, strides, begin pads and the input's pixel strides per axis."""
    taps = int(np.prod(geo.kernel, dtype=np.int64))
    head = [geo.batch, geo.in_channels, geo.out_channels, geo.in_channels // geo.group,
            geo.out_channels // geo.group, geo.rank, taps, int(np.prod(geo.in_spatial, dtype=np.int64))]
    rows = [geo.in_spatial, geo.out_spatial, geo.strides, geo.pads, c_strides(geo.in_spatial)]
    return np.concatenate([np.asarray(head, np.int64)] + [np.asarray(r, np.int64).reshape(geo.rank) for r in rows])


def tap_offsets(geo) -> np.ndarray:
    """Per kernel position (C order): its dilated offset along each spatial axis, flat
    (int64, ``taps x rank``)."""
    taps = np.indices(tuple(geo.kernel)).reshape(geo.rank, -1).T.astype(np.int64)
    return np.ascontiguousarray((taps * np.asarray(geo.dilations, np.int64)).reshape(-1))


@functools.lru_cache(maxsize=None)
def direct_kernel(epilogue_fn):
    """``y[n, o..., m] = epilogue(sum over (tap, c) (x[n, i..., g*cg + c] - x_zp) *
    (w[m, tap, c] - w_zp[m]))``, one output per thread; ``wz_step`` is 1 for a
    per-channel weight zero point, 0 for a scalar one."""

    @jit
    def conv_integer_nhwc(y, x, w, x_zp, w_zp, wz_step, n_out, geo, taps, operands):
        rank, cin, cout, cg, mg = geo[_RANK], geo[_C], geo[_M], geo[_CG], geo[_MG]
        n_taps, in_size = geo[_TAPS], geo[_IN_SIZE]
        xz = int32(x_zp[0])
        origin = cuda.local.array(MAX_RANK, int64)
        for i in range(int64(cuda.grid(1)), n_out, int64(cuda.gridsize(1))):
            m = i % cout
            rest = i // cout
            for d in range(rank - 1, -1, -1):
                size = geo[_HEADER + _OUT * rank + d]
                origin[d] = (rest % size) * geo[_HEADER + _STRIDE * rank + d] - geo[_HEADER + _PAD * rank + d]
                rest //= size
            wz = int32(w_zp[m * wz_step])
            x_base = rest * in_size * cin + (m // mg) * cg
            w_base = m * n_taps * cg
            total = int32(0)
            for t in range(n_taps):
                pixel = int64(0)
                inside = True
                for d in range(rank):
                    pos = origin[d] + taps[t * rank + d]
                    if pos < 0 or pos >= geo[_HEADER + _IN * rank + d]:
                        inside = False
                        break
                    pixel += pos * geo[_HEADER + _IN_STRIDE * rank + d]
                if inside:
                    x_at = x_base + pixel * cin
                    w_at = w_base + t * cg
                    for c in range(cg):
                        total = int32(total + (int32(x[x_at + c]) - xz) * (int32(w[w_at + c]) - wz))
            y[i] = epilogue_fn(total, i, operands)

    return conv_integer_nhwc


def _zero_points(own, x_dtype, w_dtype):
    """``(x_zp, w_zp)`` kernel arguments: omitted zero points as one zero."""
    x_zp = flat(own[2]) if len(own) > 2 and own[2] is not None else to_device(np.zeros(1, x_dtype))
    w_zp = flat(own[3]) if len(own) > 3 and own[3] is not None else to_device(np.zeros(1, w_dtype))
    return x_zp, w_zp


def direct_tactic(geo, x_dtype, w_dtype, w_per_channel: bool, epilogue: Epilogue) -> Tactic:
    """Any ConvIntegerNHWC of up to :data:`MAX_RANK` spatial dims (:func:`direct_kernel`)."""
    kernel = direct_kernel(epilogue.fn)
    table, taps, n_out = direct_table(geo), tap_offsets(geo), geo.out_size

    def launches(ins, outs, workspace):
        if n_out == 0:
            return []
        own = ins[:epilogue.first]
        x_zp, w_zp = _zero_points(own, x_dtype, w_dtype)
        blocks, threads = grid_1d(n_out)
        return [Launch(kernel, blocks, threads, (flat(outs[0]), flat(own[0]), flat(own[1]), x_zp, w_zp,
                                                 np.int64(1 if w_per_channel else 0), np.int64(n_out),
                                                 to_device(table), to_device(taps), epilogue.arguments(ins)))]

    return Tactic("direct_nhwc", launches, {"rank": geo.rank, "format": FORMAT})


# --------------------------------------------------------------------------- wgmma


def nhwc_integer_tactics(geo, x_dtype, w_dtype, zero_points: tuple[bool, bool], w_per_channel: bool,
                         epilogue: Epilogue) -> list[Tactic]:
    """Every tactic of a ConvIntegerNHWC node at concrete shapes, best guess first, each
    storing ``epilogue.fn(int32 accumulator, index, operands)``. ``zero_points``: whether
    x's and w's may be nonzero. On a Hopper GPU the wgmma implicit GEMM where it applies
    (see the module doc), its tiles in the conv family's order
    (:func:`plugrt_builtin_ops.conv.wgmma_nhwc.config_order`, K in tiles of 128 values;
    those ``wgmma`` has an s8 shape for), each with K split first where the output tiles
    cannot fill the GPU; then the direct tactic (first in the simulator, where the MMAs
    are emulated and the conv family offers no tiles unless a test swaps some in)."""
    x_dtype, w_dtype = np.dtype(x_dtype), np.dtype(w_dtype)
    direct = direct_tactic(geo, x_dtype, w_dtype, w_per_channel, epilogue)
    types = (PTX_TYPES.get(x_dtype), PTX_TYPES.get(w_dtype))
    if (geo.rank not in (1, 2) or geo.group != 1 or geo.in_channels % WGMMA_CHANNELS or any(zero_points)
            or None in types or not hopper()):
        return [direct]
    operands = Int8Operands(".".join(types), corrected=False)
    meta = wgmma_nhwc.gather_meta(geo, 1, False)
    gathered = []
    for config in wgmma_nhwc.config_order(geo.out_channels, -(-int(meta[K_]) // INT8_BK)):
        if not int8_columns_ok(config.bn):
            continue
        splits = choose_splits(meta, config.bm, config.bn, INT8_BK)
        for s in ((splits, 1) if splits > 1 else (1,)):
            gathered.append(wgmma_tactic(config, meta, operands, s, epilogue, direct))
    plain = []
    if wgmma_nhwc.is_pointwise(geo):  # also the matmul family's INT8 GEMM: X [N*H*W, C] by W [M, C]
        plain = [wgmma_nhwc.renamed(t, "gemm_1x1_", FORMAT) for t in wgmma_int8_tactics(
            x_dtype, w_dtype, wgmma_nhwc.pointwise_meta(geo, False), np.zeros(OFFS_W, np.int64), epilogue=epilogue,
            symmetric=True, fallback=direct)]
    return [direct] + gathered + plain if simulated() else plain + gathered + [direct]


def wgmma_tactic(config: WgmmaConfig, meta: np.ndarray, operands: Int8Operands, splits: int, epilogue: Epilogue,
                 fallback: Tactic, emulated: bool | None = None) -> Tactic:
    """One wgmma INT8 implicit-GEMM tactic of the symmetric operands ``operands``;
    ``meta`` is :func:`~plugrt_builtin_ops.conv.wgmma_nhwc.gather_meta`'s (int8: 1 byte an
    element). ``fallback`` runs where X or W is not 16-byte aligned at launch."""
    if operands.corrected:
        raise ValueError("wgmma NHWC INT8 convolution: zero points are not corrected here (the gather zero-fills "
                         "padding); use the direct tactic")
    m, n, k = (int(meta[s]) for s in (M_, N_, K_))
    total = m * n
    splits, kchunk = split_chunk(k, INT8_BK, splits)
    split = splits > 1
    kernel = wgmma_kernel(config, True, True, is_even(meta, config.bm, config.bn, INT8_BK), split, epilogue.fn,
                          emulated, gather=wgmma_nhwc.nhwc_gather, int8=operands)
    grid = (-(-n // config.bn), -(-m // config.bm), splits)
    shared = staging_bytes(config.bm, config.bn, config.ring_floats(), config.ld)
    offs = np.zeros(OFFS_W, np.int64)

    def launches(ins, outs, workspace):
        if total == 0:
            return []
        own = ins[:epilogue.first]
        if not (aligned(own[0]) and aligned(own[1])):
            return fallback.launches(ins, outs, workspace)
        meta_d, offs_d = to_device(meta), to_device(offs)
        none = to_device(np.zeros(1, np.int32))
        zp = (none, none, none, none, offs_d)
        partial = workspace[:4 * splits * total].view(np.int32) if split else none
        arguments = epilogue.arguments(ins)
        run = [Launch(kernel, grid, config.threads,
                      (flat(outs[0]), flat(own[0]).view(np.float32), flat(own[1]).view(np.float32), zp, partial,
                       meta_d, offs_d, np.float32(1), np.float32(0), np.int64(splits), np.int64(kchunk), arguments),
                      shared)]
        if split:
            run.append(Launch(integer_split_reduce_kernel(epilogue.fn, False), *grid_1d(total),
                              (flat(outs[0]), partial, zp, meta_d, np.int64(splits), arguments)))
        return run

    name = (f"wgmma_nhwc_{operands.label}_{config.tile(INT8_BK)}"
            + (f"_splitk{splits}" if split else ""))
    params = {**config.params(), "bk": INT8_BK, "splits": splits, "operands": operands.types, "format": FORMAT}
    return Tactic(name, launches, params, max(4 * splits * total if split else 0, fallback.workspace_bytes))
