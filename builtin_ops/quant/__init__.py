"""Quantization: QuantizeLinear, DequantizeLinear and the integer anchors (being built)."""

from plugrt import hookimpl

from . import ops

#: Every op of the family, in the order they register.
OPS = ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
