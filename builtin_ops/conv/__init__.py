"""Convolutions: Conv, ConvTranspose and the channels-last ConvNHWC.

- :mod:`.ops`: the op plugins (references, shape inference, scale folding);
- :mod:`.nhwc_ops`: the channels-last ``plugrt.conv::ConvNHWC``, and when a Conv can be one;
- :mod:`.tactics`: which kernels serve a node, and in which order;
- :mod:`.geometry`: the node at concrete shapes, as every kernel takes it;
- kernels: :mod:`.implicit_gemm` (the implicit GEMM, and the plain GEMM of 1x1 kernels),
  :mod:`.depthwise`, :mod:`.direct` (one thread per output, any rank; ConvTranspose's),
  :mod:`.tf32` (the implicit GEMM on tensor cores, with the matmul family's warp step) and
  :mod:`.wgmma_nhwc` (ConvNHWC's: the matmul family's ``wgmma`` GEMM gathering its rows
  from NHWC, FP16 and TF32).
"""

from plugrt import hookimpl

from . import nhwc_ops, ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + nhwc_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
