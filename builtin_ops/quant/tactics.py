"""The tactics of the family's integer anchors, chosen and ordered.

:func:`conv_integer_tactics`: ConvInteger's implicit GEMM (:mod:`.conv_integer`, one per
tile configuration, ``dp4a`` on the GPU) for 1-D/2-D nodes and the direct kernel for any
rank. On a GPU the GEMM tiles come first (the tuner times them all) unless a group has
fewer than :data:`GEMM_MIN_CHANNELS` output channels (depthwise: the column tile would be
mostly empty); in the simulator, where the first tactic wins untimed, the direct kernel
leads.
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import Epilogue, aligned, flat, grid_1d, simulated, to_device
from plugrt.plugin import Launch, Tactic

from .conv_integer import (G_K, MAX_RANK, TileConfig, direct_kernel, direct_table, gemm_kernel, gemm_table, gemm_taps,
                           tap_table)

#: Tiles offered on a GPU (tests swap in tiny ones): 256 threads each.
TILE_CONFIGS: tuple[TileConfig, ...] = (
    TileConfig(64, 64, 32, 4, 4),
    TileConfig(128, 64, 32, 8, 4),
    TileConfig(32, 32, 16, 2, 2),
)
#: Output channels per group from which the implicit GEMM is the first guess on a GPU.
GEMM_MIN_CHANNELS = 8
#: Blocks a tiled launch is capped at in the simulator.
SIM_BLOCKS = 2
#: Grid cap of the tiled kernels on a GPU (they loop over tiles).
MAX_BLOCKS = 1 << 20


def _zero_points(own, x_dtype, w_dtype, w_per_channel: bool):
    """``(x_zp, w_zp, wz_step)`` kernel arguments: omitted zero points as one zero."""
    x_zp = flat(own[2]) if len(own) > 2 and own[2] is not None else to_device(np.zeros(1, x_dtype))
    w_zp = flat(own[3]) if len(own) > 3 and own[3] is not None else to_device(np.zeros(1, w_dtype))
    return x_zp, w_zp, np.int64(1 if w_per_channel else 0)


def conv_integer_tactics(geo, x_dtype, w_dtype, zero_points: tuple[bool, bool], w_per_channel: bool,
                         epilogue: Epilogue) -> list[Tactic]:
    """Every tactic of a ConvInteger node at concrete shapes, best first, each storing
    ``epilogue.fn(int32 accumulator, index, operands)``. ``zero_points``: whether x's and
    w's may be nonzero (omitted or known zeros need no correction in the GEMM)."""
    x_dtype, w_dtype = np.dtype(x_dtype), np.dtype(w_dtype)
    n_out = geo.out_size
    found = []
    if geo.rank <= 2:
        table, taps = gemm_table(geo), gemm_taps(geo)
        rows, groups, mg = int(table[-1]), geo.group, geo.out_channels // geo.group
        words = int(table[G_K]) % 4 == 0
        for config in TILE_CONFIGS:
            signs = (config, x_dtype.kind == "i", w_dtype.kind == "i", *zero_points, epilogue.fn)
            kernel = gemm_kernel(*signs)
            word_kernel = gemm_kernel(*signs, w_words=True) if words else None
            tiles = groups * -(-rows // config.bm) * -(-mg // config.bn)
            grid = max(1, min(tiles, SIM_BLOCKS if simulated() else MAX_BLOCKS))
            found.append(Tactic(config.name, _launches(kernel, grid, config.threads, table, taps, x_dtype, w_dtype,
                                                       w_per_channel, n_out, epilogue, word_kernel=word_kernel),
                                config.params()))
    if geo.rank <= MAX_RANK:
        blocks, threads = grid_1d(n_out)
        direct = Tactic("direct", _launches(direct_kernel(epilogue.fn), blocks, threads, direct_table(geo),
                                            tap_table(geo), x_dtype, w_dtype, w_per_channel, n_out, epilogue,
                                            direct=True), {"rank": geo.rank})
        lead = simulated() or geo.out_channels // geo.group < GEMM_MIN_CHANNELS
        found.insert(0 if lead else len(found), direct)
    return found


def _launches(kernel, grid, block, table, taps, x_dtype, w_dtype, w_per_channel, n_out, epilogue, direct=False,
              word_kernel=None):
    """``word_kernel`` (K a multiple of 4) reads the weights as uint32 words where their
    data is 4-byte aligned (always for the engine's weights and arena); else ``kernel``."""

    def launches(ins, outs, workspace):
        if n_out == 0:
            return []
        own = ins[:epilogue.first]
        x_zp, w_zp, wz_step = _zero_points(own, x_dtype, w_dtype, w_per_channel)
        w, run = flat(own[1]), kernel
        if word_kernel is not None and aligned(w, 4):
            w, run = w.view(np.uint32), word_kernel
        head = (flat(outs[0]), flat(own[0]), w, x_zp, w_zp, wz_step)
        if direct:
            head += (np.int64(n_out),)
        return [Launch(run, grid, block, head + (to_device(table), to_device(taps.reshape(-1)),
                                                 epilogue.arguments(ins)))]

    return launches
