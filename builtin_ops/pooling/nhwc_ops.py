"""The channels-last forms of the pools, in domain ``plugrt.pooling`` (opset 1):
MaxPoolNHWC, AveragePoolNHWC, GlobalAveragePoolNHWC and GlobalMaxPoolNHWC.

Each takes ``X`` of shape ``[N, spatial..., C]`` and gives ``[N, out_spatial..., C]``, with
the ONNX op's attributes and meaning: ``check``, ``infer`` and ``reference`` are the base
op's, run on the channels-first view (``np.moveaxis``), so the two cannot drift apart. A
layout pass turns ``Transpose(perm=[0, 3, 1, 2]) -> MaxPool`` into ``MaxPoolNHWC ->
Transpose``; :func:`channels_last_form` tells it which op and attributes to use.
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import Example, TensorInfo
from plugrt_builtin_ops.common.layout import channels_first, channels_last

from . import nhwc_pool
from .ops import AveragePool, GlobalAveragePool, GlobalMaxPool, MaxPool, PoolOp

DOMAIN = "plugrt.pooling"


class ChannelsLast:
    """The NHWC form of a pooling op (mixed in before it): the base op's ``check``,
    ``infer`` and ``reference`` on the channels-first view, its first output only."""

    domain = DOMAIN
    since_opset = 1

    def check(self, node, inputs):
        x = inputs[0]
        if x.rank < 3:
            raise self.unsupported(node, f"input of rank {x.rank}", "pooling needs [N, spatial..., C] (rank >= 3)")
        self.check_channels_first(node, [channels_first(x)])

    def check_channels_first(self, node, inputs):
        """The base op's check, on the channels-first view."""
        super().check(node, inputs)

    def infer(self, node, inputs):
        y = super().infer(node, [channels_first(inputs[0])])[0]
        return [channels_last(y)]

    def reference(self, node, inputs):
        x = np.moveaxis(inputs[0], -1, 1)
        y = super().reference(node, [x])[0]
        return [np.ascontiguousarray(np.moveaxis(y, 1, -1))]


_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
_F16_TOLERANCE = dict(rtol=1e-3, atol=1e-3)


class MaxPoolNHWC(ChannelsLast, MaxPool):
    """``plugrt.pooling::MaxPoolNHWC``: MaxPool on ``[N, spatial..., C]``, values only (no
    Indices, so no ``storage_order``)."""

    op_type = "MaxPoolNHWC"
    attributes = PoolOp.attributes
    outputs = (1, 1)

    def check_channels_first(self, node, inputs):
        PoolOp.check(self, node, inputs)  # MaxPool's own check is storage_order's

    def tactics(self, node, inputs, outputs):
        table = self.geometry(node, channels_first(inputs[0]), channels_first(outputs[0]))
        return nhwc_pool.window_pool_nhwc_tactics("max", inputs[0], outputs[0], table)

    def examples(self):
        return [Example((TensorInfo(_F32, (2, 5, 7, 3)),), {"kernel_shape": [3, 3], "strides": [2, 2],
                                                          "pads": [1, 1, 1, 1]}),
                Example((TensorInfo(_F32, (2, 5, 7, 3)),), {"kernel_shape": [2, 3], "strides": [2, 2],
                                                          "pads": [0, 1, 1, 0], "ceil_mode": 1}),
                Example((TensorInfo(_F16, (2, 5, 7, 3)),), {"kernel_shape": [3, 2], "strides": [1, 2],
                                                          "dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
                Example((TensorInfo(_F32, (2, 7, 3)),), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]})]


class AveragePoolNHWC(ChannelsLast, AveragePool):
    """``plugrt.pooling::AveragePoolNHWC``: AveragePool on ``[N, spatial..., C]``."""

    op_type = "AveragePoolNHWC"

    def tactics(self, node, inputs, outputs):
        table = self.geometry(node, channels_first(inputs[0]), channels_first(outputs[0]))
        include_pad = int(node.attrs["count_include_pad"] != 0)
        return nhwc_pool.window_pool_nhwc_tactics("avg", inputs[0], outputs[0], table, include_pad)

    def examples(self):
        return [Example((TensorInfo(_F32, (2, 5, 7, 3)),), {"kernel_shape": [3, 3], "strides": [2, 2],
                                                          "pads": [1, 1, 1, 1], "count_include_pad": 1}),
                Example((TensorInfo(_F32, (2, 5, 7, 3)),), {"kernel_shape": [3, 2], "strides": [2, 3],
                                                          "pads": [1, 0, 1, 1], "ceil_mode": 1}),
                Example((TensorInfo(_F16, (2, 5, 7, 3)),), {"kernel_shape": [2, 3], "strides": [2, 2],
                                                          "pads": [1, 1, 0, 1], "count_include_pad": 1},
                        **_F16_TOLERANCE),
                Example((TensorInfo(_F32, (2, 7, 3)),), {"kernel_shape": [3], "strides": [2], "dilations": [2],
                                                       "pads": [2, 1], "ceil_mode": 1})]


class GlobalAveragePoolNHWC(ChannelsLast, GlobalAveragePool):
    """``plugrt.pooling::GlobalAveragePoolNHWC``: ``[N, spatial..., C] -> [N, 1, ..., 1, C]``."""

    op_type = "GlobalAveragePoolNHWC"

    def tactics(self, node, inputs, outputs):
        return nhwc_pool.global_pool_nhwc_tactics("avg", inputs[0])

    def examples(self):
        return [Example((TensorInfo(_F32, (2, 5, 7, 3)),)),
                Example((TensorInfo(_F16, (2, 5, 7, 3)),), **_F16_TOLERANCE),
                Example((TensorInfo(_F32, (2, 7, 3)),))]


class GlobalMaxPoolNHWC(ChannelsLast, GlobalMaxPool):
    """``plugrt.pooling::GlobalMaxPoolNHWC``: ``[N, spatial..., C] -> [N, 1, ..., 1, C]``."""

    op_type = "GlobalMaxPoolNHWC"

    def tactics(self, node, inputs, outputs):
        return nhwc_pool.global_pool_nhwc_tactics("max", inputs[0])

    def examples(self):
        return [Example((TensorInfo(_F32, (2, 5, 7, 3)),)),
                Example((TensorInfo(_F16, (2, 5, 7, 3)),)),
                Example((TensorInfo(_F32, (2, 7, 3)),))]


OPS = (MaxPoolNHWC, AveragePoolNHWC, GlobalAveragePoolNHWC, GlobalMaxPoolNHWC)

#: ONNX op type (default domain) -> its channels-last form.
CHANNELS_LAST = {MaxPool.op_type: MaxPoolNHWC, AveragePool.op_type: AveragePoolNHWC,
                 GlobalAveragePool.op_type: GlobalAveragePoolNHWC, GlobalMaxPool.op_type: GlobalMaxPoolNHWC}


def _indices_used(node, graph) -> bool:
    """Whether MaxPool ``node``'s Indices output is named and read (or a graph output)."""
    if len(node.outputs) < 2 or not node.outputs[1]:
        return False
    indices = node.outputs[1]
    return indices in graph.outputs or bool(graph.consumers().get(indices))


def channels_last_form(node, graph) -> tuple[str, str, dict] | None:
    """(domain, op_type, attrs) of the channels-last op that computes ``node`` (an ONNX
    MaxPool, AveragePool, GlobalAveragePool or GlobalMaxPool, default domain) on an NHWC
    input, or None where it has none (another op, MaxPool's Indices output used, a rank
    the NHWC ops do not take, or an input whose rank is not known)."""
    op = CHANNELS_LAST.get(node.op_type)
    if op is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "MaxPool" and _indices_used(node, graph):
        return None
    x = graph.info(node.inputs[0])
    if x is None or x.rank < 3:
        return None
    taken = {attr.name for attr in op.attributes}
    attrs = {name: value for name, value in node.attrs.items() if name in taken}
    return op.domain, op.op_type, attrs
