"""A Conv or ConvTranspose node at concrete shapes, as every kernel of the family takes it.

:class:`ConvGeometry` is the node; :func:`geometry_2d` its int64 scalar table for the 1-D
and 2-D kernels (direct 2-D, depthwise, implicit GEMM, TF32; a 1-D node gets a unit H
axis), read through the ``G2_*`` slots. :func:`compute_type` is the type the kernels
accumulate in; :func:`bias_or_dummy` the bias argument every kernel takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import float32, float64

from plugrt.kernels import flat, to_device


@dataclass(frozen=True)
class ConvGeometry:
    """One Conv or ConvTranspose node at concrete shapes.

    ``in_channels`` is X's C and ``out_channels`` Y's; ``pads`` are the begin pads of the
    effective padding (auto_pad and output_shape already applied; may be negative).
    """

    batch: int
    in_channels: int
    out_channels: int
    group: int
    in_spatial: tuple
    kernel: tuple
    out_spatial: tuple
    strides: tuple
    dilations: tuple
    pads: tuple
    transposed: bool = False

    @property
    def rank(self) -> int:
        return len(self.in_spatial)

    @property
    def out_size(self) -> int:
        return self.batch * self.out_channels * int(np.prod(self.out_spatial, dtype=np.int64))


def compute_type(dtype):
    """The numba type a kernel over ``dtype`` storage accumulates in."""
    return float64 if np.dtype(dtype) == np.float64 else float32


def bias_or_dummy(bias, dtype):
    """The bias device array, or a one-element stand-in when the node has none."""
    return flat(bias) if bias is not None else to_device(np.zeros(1, dtype))


# Scalar geometry of the 2-D kernels (1-D runs as H = 1).
(G2_N, G2_C, G2_H, G2_W, G2_M, G2_CG, G2_MG, G2_OH, G2_OW, G2_KH, G2_KW,
 G2_SH, G2_SW, G2_DH, G2_DW, G2_PH, G2_PW) = range(17)


def geometry_2d(geo: ConvGeometry) -> np.ndarray:
    """The int64 scalar table of the 2-D kernels; a 1-D node gets a unit H axis."""
    def pad2(values, fill):
        values = tuple(int(v) for v in values)
        return ((fill,) + values) if len(values) == 1 else values

    h, w = pad2(geo.in_spatial, 1)
    oh, ow = pad2(geo.out_spatial, 1)
    kh, kw = pad2(geo.kernel, 1)
    sh, sw = pad2(geo.strides, 1)
    dh, dw = pad2(geo.dilations, 1)
    ph, pw = pad2(geo.pads, 0)
    return np.asarray([geo.batch, geo.in_channels, h, w, geo.out_channels, geo.in_channels // geo.group,
                       geo.out_channels // geo.group, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw], np.int64)
