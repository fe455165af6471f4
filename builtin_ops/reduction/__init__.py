"""Reductions (ReduceSum, ..., ReduceLogSumExp, ArgMax, ArgMin), the softmax family
(Softmax, LogSoftmax, Hardmax), and the ops along one axis that keep or select elements
(CumSum, CumProd, TopK).

- :mod:`.ops`: the op plugins of the reductions and the softmax family;
- :mod:`.scan_ops`: the op plugins CumSum, CumProd and TopK;
- :mod:`.fuse_softmax`: the graph pass recognizing softmax written in primitive ops;
- kernels: :mod:`.reduce` (the Reduce* ops, and the axes view every reduction kernel
  reads), :mod:`.softmax` (Softmax, LogSoftmax, ReduceLogSumExp), :mod:`.argmax`
  (ArgMax, ArgMin, Hardmax), :mod:`.scan` (CumSum and CumProd, and the lines along one
  axis that TopK walks too) and :mod:`.topk` (TopK).
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import fuse_softmax, ops, scan_ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + scan_ops.OPS

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
