"""Activations and other unary pointwise ops: Relu, Sigmoid, Swish, Gelu, Exp, Abs, Clip, PRelu,
Shrink, Tan, Asinh, ...

- :mod:`.ops`: the op plugins;
- :mod:`.trig_ops`: the trigonometric and hyperbolic op plugins beyond Sin and Cos;
- :mod:`.fuse_gelu`, :mod:`.fuse_swish`: the graph passes recognizing GELU and SiLU/Swish
  written in primitive ops;
- :mod:`.device_functions`: their scalar device functions, for the toolkit's pointwise
  kernel;
- :mod:`.trigonometric`: the scalar device functions of the ops of :mod:`.trig_ops`.
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import fuse_gelu, fuse_swish, ops, trig_ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + trig_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: Runs before the contrib plugins' fusion passes (priority 100), which may match its result.
PASS_PRIORITY = 30


@hookimpl
def plugrt_passes():
    return [GraphPass("fuse_gelu", fuse_gelu.run, priority=PASS_PRIORITY,
                      description="GELU written in primitive ops (Erf or Tanh form) -> Gelu"),
            GraphPass("fuse_swish", fuse_swish.run, priority=PASS_PRIORITY,
                      description="x * Sigmoid(alpha * x) (SiLU, QuickGELU) -> Swish")]
