"""Pooling: MaxPool, AveragePool, LpPool and their global forms, and the channels-last
(NHWC) forms of MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool.

- :mod:`.ops`: the op plugins;
- :mod:`.nhwc_ops`: the channels-last op plugins (domain ``plugrt.pooling``) and
  :func:`~.nhwc_ops.channels_last_form`, which a layout pass asks for them;
- kernels: :mod:`.window_pool` (one thread per output window), :mod:`.global_pool` (one
  block per (n, c) row) and :mod:`.nhwc_pool` (channels last: one thread per output
  element or per (n, c), channels fastest).
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
