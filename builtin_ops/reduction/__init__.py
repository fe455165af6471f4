"""Reductions (ReduceSum, ..., ReduceLogSumExp, ArgMax, ArgMin) and the softmax family
(Softmax, LogSoftmax, Hardmax).

- :mod:`.ops`: the op plugins;
- kernels: :mod:`.reduce` (the Reduce* ops, and the axes view every reduction kernel
  reads), :mod:`.softmax` (Softmax, LogSoftmax, ReduceLogSumExp) and :mod:`.argmax`
  (ArgMax, ArgMin, Hardmax).
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
