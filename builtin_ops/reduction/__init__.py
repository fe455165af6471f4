"""Reductions (ReduceSum, ..., ReduceLogSumExp, ArgMax, ArgMin) and the softmax family
(Softmax, LogSoftmax, Hardmax).

- :mod:`.ops`: the op plugins;
- :mod:`.fuse_softmax`: the graph pass recognizing softmax written in primitive ops;
- kernels: :mod:`.reduce` (the Reduce* ops, and the axes view every reduction kernel
  reads), :mod:`.softmax` (Softmax, LogSoftmax, ReduceLogSumExp) and :mod:`.argmax`
  (ArgMax, ArgMin, Hardmax).
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import fuse_softmax, ops

#: Every op of the family, in the order they register.
OPS = ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: Runs before the contrib plugins' fusion passes (priority 100), which may match its result.
PASS_PRIORITY = 20


@hookimpl
def plugrt_passes():
    return [GraphPass("fuse_softmax", fuse_softmax.run, priority=PASS_PRIORITY,
                      description="softmax written in primitive ops -> Softmax")]
