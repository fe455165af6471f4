"""The tactics of MatMul, Gemm and MatMulInteger, chosen and ordered.

:func:`product_tactics` ranks the tiled tactics (:mod:`.tiled`; those that fill the GPU
first) and places the direct one (first for matrix-vector products, else last); float
products also get the float32 GEMM tactics of :func:`gemm_tactics`, ahead of those on a
GPU (their ragged twins after the tiled ones where N or K is short too:
:data:`TWIN_MIN_K`). :func:`gemm_tactics` orders the GEMM kernels for big products: TF32 tensor cores
first (Hopper's ``wgmma``, :mod:`.wgmma`, then ``mma.sync``, :mod:`.tf32`), then the SIMT
SGEMM (:mod:`.simt`). MatMulInteger's 8-bit products get Hopper's INT8 ``wgmma``
(:mod:`.wgmma_int8`) after the first tiled tactic, the plain one the tuner verifies
them against. This is the one module that imports those kernel modules for the op
plugins.
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import Epilogue, flat, grid_1d, simulated, to_device
from plugrt.plugin import Launch, Tactic

from . import gemv
from .plan import K_, M_, N_, NB, USE_C, scaling_type
from .simt import RAGGED, simt_tactics
from .tf32 import tf32_tactics
from .tiled import direct_kernel, tiled_kernel
from . import wgmma
from .wgmma import wgmma_tactics
from .wgmma_f16 import HALF_BK, wgmma_half_tactics
from .wgmma_int8 import wgmma_int8_tactics

#: Tiled configurations offered on a GPU: (BM, BN, BK, TM, TN). Tests may swap in tiny ones.
TILE_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    (64, 64, 16, 4, 4),
    (128, 128, 8, 8, 8),
    (32, 32, 16, 2, 2),
)
_DEFAULT_TILE_CONFIGS = TILE_CONFIGS
#: Blocks a tiled launch is capped at in the simulator (each block is a set of Python threads).
SIM_BLOCKS = 2
#: Grid cap for tiled kernels on a GPU (they loop over tiles with a stride of gridDim.x).
MAX_TILE_BLOCKS = 1 << 20
#: How the tensor-core and SIMT GEMM tactics' names begin (:func:`gemm_tactics`, INT8 ``wgmma``).
FAST_PREFIXES = ("wgmma_", "tf32_", "simt")
#: Block count under which a GPU is not filled (132 SMs on an H200).
FILL_BLOCKS = 132
#: Where N and K are at least these, a product short only in M keeps the tensor-core tiles'
#: ragged and split-K twins ahead of the tiled kernels (a classifier's Gemm at batch 32, a
#: decoder's step); smaller ones lead with the tiled kernels (a 3x5 product on a 128x256 tile).
TWIN_MIN_N, TWIN_MIN_K = 64, 256


def _present(ins, index):
    return ins[index] if index < len(ins) else None


def product_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                    alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None,
                    zero_points: bool = False, symmetric: bool = True, b_value=None, wanted=None) -> list[Tactic]:
    """The tiled tactics and the direct one for a planned product, best first, each
    applying ``epilogue`` at its store.

    ``c_index``: the input holding Gemm's C (read when ``meta[USE_C]``). With
    ``zero_points`` inputs 2 and 3 are A's and B's zero points (omitted ones read as 0).
    The node's own inputs are ``ins[:epilogue.first]``; the epilogue's tensors follow.
    ``symmetric``: both zero points are absent or known zeros (INT8 tensor-core tactics
    then need no correction). ``b_value``: B when it is a known constant (FP16 and INT8
    tensor-core tactics may hold it transposed). ``wanted``: a tactic's identity; the
    tensor-core families whose names cannot match are then not made
    (:meth:`plugrt.registry.Registry.tactics`).
    """
    key = (np.dtype(a_dtype), np.dtype(b_dtype), np.dtype(out_dtype), bool(zero_points))
    nb, m, n = int(meta[NB]), int(meta[M_]), int(meta[N_])
    total = nb * m * n
    ep = scaling_type(out_dtype)

    def arguments(ins, outs):
        own = ins[:epilogue.first]
        out, a, b = flat(outs[0]), flat(own[0]), flat(own[1])
        c = flat(own[c_index]) if meta[USE_C] else out
        azp, bzp = a, b
        if zero_points:
            given = [_present(own, 2), _present(own, 3)]
            azp, bzp = (flat(z) if z is not None else to_device(np.zeros(1, dt)) for z, dt in zip(given, key[:2]))
        return (out, a, b, c, azp, bzp, to_device(meta), to_device(offs), ep(alpha), ep(beta),
                epilogue.arguments(ins))

    def make(name, params, kernel, geometry):
        def launches(ins, outs, workspace):
            if total == 0:
                return []
            grid, block = geometry()
            return [Launch(kernel, grid, block, arguments(ins, outs))]
        return Tactic(name, launches, params)

    ranked = []
    for bm, bn, bk, tm, tn in TILE_CONFIGS:
        blocks = nb * -(-m // bm) * -(-n // bn)
        fills = blocks >= FILL_BLOCKS
        grid = max(1, min(blocks, SIM_BLOCKS if simulated() else MAX_TILE_BLOCKS))
        block = (bm // tm) * (bn // tn)
        kernel = tiled_kernel(*key, bm, bn, bk, tm, tn, epilogue.fn)
        params = {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}
        tactic = make(f"tiled{bm}x{bn}x{bk}_{tm}x{tn}", params, kernel, lambda g=grid, t=block: (g, t))
        ranked.append(((not fills, -bm * bn if fills else -blocks), tactic))
    tactics = [t for _, t in sorted(ranked, key=lambda pair: pair[0])]
    direct = make("direct", {}, direct_kernel(*key, epilogue.fn), lambda: grid_1d(total))
    tactics.insert(0 if (m == 1 or n == 1) else len(tactics), direct)
    vector = not zero_points and gemv.suits(meta)
    if vector:  # matrix-vector: a block shares each output's K loop
        cap = SIM_BLOCKS if simulated() else MAX_TILE_BLOCKS
        tactics[:0] = [make(f"gemv_{kind}", {"kind": kind}, gemv.gemv_kernel(*key[:3], kind == "columns", epilogue.fn),
                            lambda c=(kind == "columns"): (gemv.gemv_grid(meta, c, cap), gemv.THREADS))
                       for kind in ("kdot", "columns")]
    name = None if wanted is None else str(wanted["name"])
    if name is not None and not name.startswith(FAST_PREFIXES):
        fast, lead = [], 0  # (a tiled, direct or gemv tactic is looked for)
    elif zero_points:  # MatMulInteger: the plain tiled tactic first, the tuner's reference
        fast = wgmma_int8_tactics(a_dtype, b_dtype, meta, offs, epilogue=epilogue, symmetric=symmetric,
                                  b_value=b_value, fallback=tactics[0])
        lead = 1
    else:
        fast = gemm_tactics(a_dtype, b_dtype, out_dtype, meta, offs, epilogue=epilogue, alpha=alpha, beta=beta,
                            c_index=c_index, b_value=b_value, fallback=tactics[0], wanted=name)
        lead = 0
    cut = len(tactics) - 1 if tactics[-1] is direct else len(tactics)
    if not simulated():
        if n >= TWIN_MIN_N and int(meta[K_]) >= TWIN_MIN_K and m > 1 and not vector:
            return tactics[:lead] + fast + tactics[lead:]
        # A matrix-vector product, or one short in N or K as well as M: the matrix-vector or
        # tiled kernels lead, the tensor-core tiles' ragged twins (offered at every size for
        # a dynamic profile's other shapes) after them: the heuristic choice (level 0) and
        # the ones a level times.
        ragged = [t for t in fast if t.name.endswith(RAGGED)]
        regular = [t for t in fast if not t.name.endswith(RAGGED)]
        return tactics[:lead] + regular + tactics[lead:cut] + ragged + tactics[cut:]
    # In the simulator the first tactic wins untimed: keep the exact, cheap ones first
    # there (the direct tactic stays last when it is).
    return tactics[:cut] + fast + tactics[cut:]


def gemm_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                 alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None, b_value=None,
                 fallback: Tactic | None = None, wanted: str | None = None) -> list[Tactic]:
    """The GEMM family for big products, best first: FP16 on Hopper's ``wgmma`` (FP16
    operands), TF32 tensor cores (float32; ``math="tf32"``, dropped by the tuner when TF32
    is off; ``wgmma`` first, then ``mma.sync``), then SIMT SGEMM; each only where its tile
    suits the product (see :func:`.simt.fits`); last the ``wgmma`` tiles' ragged twins
    (:data:`.simt.RAGGED`), offered at every size for a dynamic profile's other shapes.
    ``wanted``: a tactic name; only the family that names its tactics so is made."""
    kw = dict(epilogue=epilogue, alpha=alpha, beta=beta, c_index=c_index)
    half_tiles = _tiles_named(wanted, lambda c: f"wgmma_f16_{c.tile(HALF_BK)}")
    families = (("wgmma_f16_", lambda: wgmma_half_tactics(a_dtype, b_dtype, out_dtype, meta, offs, b_value=b_value,
                                                          fallback=fallback, configs=half_tiles, **kw)),
                ("wgmma_", lambda: wgmma_tactics(a_dtype, b_dtype, out_dtype, meta, offs,
                                                 configs=_tiles_named(wanted, lambda c: c.name), **kw)),
                ("tf32_", lambda: tf32_tactics(a_dtype, b_dtype, out_dtype, meta, offs, **kw)),
                ("simt", lambda: simt_tactics(a_dtype, b_dtype, out_dtype, meta, offs, **kw)))
    if wanted is not None:
        prefix = next((p for p, _ in families if wanted.startswith(p)), None)
        families = tuple(f for f in families if f[0] == prefix)
    found = [t for _, make in families for t in make()]
    return [t for t in found if not t.name.endswith(RAGGED)] + [t for t in found if t.name.endswith(RAGGED)]


def _tiles_named(wanted: str | None, spell) -> tuple | None:
    """The ``wgmma`` tiles whose tactics a ``wanted`` name can be (``spell(tile)``, then
    split-K and ragged suffixes); ``None`` (every tile) without one."""
    if wanted is None:
        return None
    return tuple(c for c in wgmma.WGMMA_CONFIGS if wanted == spell(c) or wanted.startswith(spell(c) + "_"))
