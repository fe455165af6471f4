"""The tactics of Conv and ConvTranspose, chosen and ordered: which kernel modules serve a
node, and in which order the tuner sees them (best guess first).

- :func:`conv_tactics`: the implicit GEMM (:mod:`.implicit_gemm`), depthwise
  (:mod:`.depthwise`) and direct (:mod:`.direct`) tactics, then the TF32 tensor-core ones
  (:mod:`.tf32`);
- :func:`conv_transpose_tactics`: the direct kernels.
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import Epilogue
from plugrt.plugin import Tactic

from .depthwise import depthwise_tactics
from .direct import direct2d_tactic, direct_tactic
from .geometry import ConvGeometry
from .implicit_gemm import gemm_tactics
from .tf32 import conv_tf32_tactics

#: Output channels per group from which the implicit GEMM beats the direct 2-D kernel.
GEMM_MIN_CHANNELS = 8


def conv_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue) -> list[Tactic]:
    """Every tactic that fits a Conv node, best guess first; each applies ``epilogue`` at
    its final store.

    1-D/2-D float32/float16 nodes get the GEMM tactics (the plain GEMM for 1x1 kernels
    without padding, else the implicit GEMM; one per tile, with and without a K split,
    in :func:`.implicit_gemm.gemm_tactics`' estimated order); float32 ones also the
    TF32 tensor-core tactics (:mod:`.tf32`), last. Depthwise nodes (one
    input channel per group) get the depthwise tactics, any 1-D/2-D node the direct 2-D
    kernel. With few output channels per group the GEMM's channel tile would be mostly
    empty, so the depthwise and direct 2-D kernels lead there. The N-d direct kernel
    comes after those, then the TF32 ``mma.sync`` ones. (On Hopper the tensor-core path
    is the channels-last ConvNHWC, :mod:`.wgmma_nhwc`.)"""
    found = []
    if geo.rank <= 2:
        gemm = gemm_tactics(geo, dtype, epilogue) if dtype != np.float64 else []
        depthwise = depthwise_tactics(geo, dtype, epilogue)
        direct2d = [direct2d_tactic(geo, dtype, epilogue)]
        if geo.out_channels // geo.group >= GEMM_MIN_CHANNELS:
            found += gemm + depthwise + direct2d
        else:
            found += depthwise + direct2d + gemm
    found.append(direct_tactic(geo, dtype, epilogue))
    # TF32 tensor cores last, so only the tuner's highest level (which times every tactic,
    # after verifying it) considers them.
    return found + conv_tf32_tactics(geo, dtype, epilogue)


def conv_transpose_tactics(geo: ConvGeometry, dtype, epilogue: Epilogue) -> list[Tactic]:
    """The direct 2-D kernel for 1-D/2-D nodes, then the N-d direct kernel; both apply
    ``epilogue`` at their store."""
    found = [direct2d_tactic(geo, dtype, epilogue)] if geo.rank <= 2 else []
    return found + [direct_tactic(geo, dtype, epilogue)]
