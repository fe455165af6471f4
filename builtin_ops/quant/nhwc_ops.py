"""The channels-last integer convolution ``plugrt.quant::ConvIntegerNHWC``.

ConvIntegerNHWC is ConvInteger with the channel axis last, as the conv family's
``plugrt.conv::ConvNHWC`` is Conv with it: X int8/uint8 ``[N, spatial..., C]``, W
``[M, k..., C/group]``, optional x_zero_point (a scalar) and w_zero_point (a scalar or one
per output channel), Y int32 ``[N, out_spatial..., M]``, ConvInteger's attributes. Checks,
shape inference and the reference are ConvInteger's on the arrays with their channel axis
moved back to 1. It is an ``ANCHOR`` like ConvInteger: the epilogue (Cast, rescale,
activation, QuantizeLinear) receives the int32 accumulator. The quant family's
``fuse_qdq`` makes it out of a ConvNHWC between Q/DQ (an INT8 build's channels-last
convolutions); its kernels are :mod:`.nhwc_integer`'s.
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import Example, TensorInfo
from plugrt_builtin_ops.conv.nhwc_ops import ChannelsLast

from .integer_ops import ConvInteger
from .nhwc_integer import nhwc_integer_tactics

DOMAIN = "plugrt.quant"


class ConvIntegerNHWC(ChannelsLast, ConvInteger):
    """``y = conv(x - x_zero_point, w - w_zero_point)`` in int32 with the channel axis
    last: x (N, D1..Dn, C), w (M, k1..kn, C/group), y (N, O1..On, M)."""

    domain = DOMAIN
    op_type = "ConvIntegerNHWC"
    since_opset = 1
    #: :func:`.nhwc_integer.nhwc_integer_tactics`; the epilogue receives the int32 accumulator.
    integer_tactics = staticmethod(nhwc_integer_tactics)

    def examples(self):
        u8, i8 = np.uint8, np.int8
        rng = np.random.default_rng(7)

        def ints(dtype, shape):
            info = np.iinfo(dtype)
            return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)

        return [
            Example((TensorInfo(u8, (1, 5, 5, 3)), ints(i8, (4, 3, 3, 3)), u8(128), None), attrs={"pads": [1, 1, 1, 1]},
                    name="uint8 x int8 w, padded 3x3"),
            Example((TensorInfo(i8, (1, 5, 5, 16)), ints(i8, (8, 3, 3, 16))), attrs={"pads": [1, 1, 1, 1],
                                                                                   "strides": [2, 2]},
                    name="symmetric int8, 16 channels, stride 2 (the wgmma tactic's case)"),
            Example((TensorInfo(i8, (2, 6, 4)), ints(u8, (6, 3, 2)), i8(-5), np.arange(6, dtype=u8) * 20),
                    attrs={"group": 2, "strides": [2], "dilations": [2]}, name="1-D grouped, per-channel w zero point"),
            Example((TensorInfo(u8, (1, 4, 4, 2)), TensorInfo(u8, (3, 2, 2, 2))), attrs={"auto_pad": "SAME_UPPER"},
                    name="no zero points, SAME_UPPER"),
            Example((TensorInfo(i8, (1, 3, 3, 3, 2)), ints(i8, (2, 2, 2, 2, 2)), i8(3), i8(-2)), name="3-D"),
        ]


OPS = (ConvIntegerNHWC,)
