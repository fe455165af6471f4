"""Quantization: QuantizeLinear, DequantizeLinear and the integer anchors.

- :mod:`.ops`: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, with
  :mod:`.granularity` (per-tensor, per-axis and blocked scales);
- :mod:`.device_functions`: their scalar device functions (round half to even, saturate),
  which the per-tensor forms offer for fusion into chains and anchor epilogues;
- :mod:`.integer_ops`: the ``ANCHOR`` ops ConvInteger (its epilogue receives the int32
  accumulator; MatMulInteger is the matmul family's), QLinearConv and QLinearMatMul (those
  two's kernels with :mod:`.requantize`'s requantizing store), with :mod:`.tactics`
  ordering ConvInteger's kernels;
- :mod:`.nhwc_ops`: ``plugrt.quant::ConvIntegerNHWC``, ConvInteger with the channel axis
  last (an INT8 build's channels-last convolutions), with :mod:`.nhwc_integer`'s kernels
  (a direct one, and the Hopper ``wgmma`` s8 implicit GEMM over the conv family's NHWC
  gather);
- kernels: :mod:`.per_axis` (per-axis and blocked Q/DQ), :mod:`.dynamic`
  (DynamicQuantizeLinear's range reduction and quantization), :mod:`.conv_integer`
  (direct and implicit-GEMM integer convolutions) with :mod:`.dp4a` (the ``dp4a``
  byte dot product as inline PTX, and its plain sibling for the simulator);
- ``quantize`` passes: :mod:`.quantizable` (``place_qdq``: an INT8 build's calibrated
  ranges become Q/DQ pairs) and :mod:`.fuse_qdq` (Q/DQ around Conv, ConvNHWC, MatMul and
  Gemm become their integer forms, for placed and model-given Q/DQ alike).
"""

from plugrt import hookimpl

from . import integer_ops, nhwc_ops, ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + integer_ops.OPS + nhwc_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: Where the family's ``quantize`` passes run in that stage: placement, then fusion.
PLACE_PRIORITY = 10
FUSE_PRIORITY = 20


@hookimpl
def plugrt_passes():
    from plugrt.plugin import GraphPass

    from . import fuse_qdq, quantizable

    return [GraphPass(quantizable.NAME, quantizable.run, priority=PLACE_PRIORITY, stage="quantize",
                      description="an INT8 build's calibrated ranges -> Q/DQ pairs at the inputs of Conv, "
                                  "ConvNHWC, MatMul and Gemm (weights quantized per output channel)"),
            GraphPass(fuse_qdq.NAME, fuse_qdq.run, priority=FUSE_PRIORITY, stage="quantize",
                      description="DQ -> Conv/ConvNHWC/MatMul/Gemm -> ConvInteger/ConvIntegerNHWC/MatMulInteger "
                                  "+ rescale; DQ moved below MaxPool/Reshape/...; Q(DQ(q)) -> q; constant DQs folded")]
