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

from plugrt.kernels import no_epilogue
from plugrt.plugin import Example, TensorInfo, dims, optional
from plugrt_builtin_ops.common.layout import channels_first, channels_last

from .integer_ops import ConvInteger, known_zero
from .nhwc_integer import MAX_RANK, nhwc_integer_tactics

DOMAIN = "plugrt.quant"


def _size(shape) -> int | None:
    """Elements of a static shape, ``None`` for a symbolic one."""
    size = dims.prod(shape)
    return size if isinstance(size, int) else None


class ConvIntegerNHWC(ConvInteger):
    """``y = conv(x - x_zero_point, w - w_zero_point)`` in int32 with the channel axis
    last: x (N, D1..Dn, C), w (M, k1..kn, C/group), y (N, O1..On, M)."""

    domain = DOMAIN
    op_type = "ConvIntegerNHWC"
    since_opset = 1

    def check(self, node, inputs):
        super().check(node, [channels_first(i) for i in inputs[:2]] + list(inputs[2:]))

    def infer(self, node, inputs):
        return [channels_last(super().infer(node, [channels_first(i) for i in inputs[:2]] + list(inputs[2:]))[0])]

    def reference(self, node, inputs):
        x, w = (np.moveaxis(np.asarray(a), -1, 1) for a in inputs[:2])
        y = super().reference(node, [x, w, *inputs[2:]])[0]
        return [np.ascontiguousarray(np.moveaxis(y, 1, -1))]

    def tactics(self, node, inputs, outputs, epilogue=None):
        """:func:`.nhwc_integer.nhwc_integer_tactics`; the epilogue receives the int32 accumulator."""
        geo = self._kernel_geometry(node, [channels_first(i) for i in inputs[:2]], [channels_first(outputs[0])])
        if geo.rank > MAX_RANK:
            raise self.unsupported(node, f"{geo.rank} spatial dims on the GPU", f"the CUDA kernels take up to {MAX_RANK}")
        x_zp, w_zp = optional(inputs, 2), optional(inputs, 3)
        per_channel = w_zp is not None and _size(w_zp.shape) not in (1, None)
        return nhwc_integer_tactics(geo, inputs[0].dtype, inputs[1].dtype, (not known_zero(x_zp), not known_zero(w_zp)),
                                    per_channel, epilogue or no_epilogue(len(node.inputs)))

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
