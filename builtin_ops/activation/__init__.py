"""Activations and other unary pointwise ops: Relu, Sigmoid, Gelu, Exp, Abs, Clip, PRelu, ...

- :mod:`.ops`: the op plugins;
- :mod:`.device_functions`: their scalar device functions, for the toolkit's pointwise
  kernel.
"""

from plugrt import hookimpl

from . import ops

#: Every op of the family, in the order they register.
OPS = ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
