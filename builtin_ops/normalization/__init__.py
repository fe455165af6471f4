"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, MeanVarianceNormalization and LRN.

- :mod:`.ops`: the op plugins;
- kernels: :mod:`.row_norm` (row statistics over any axes: LayerNorm, InstanceNorm,
  GroupNorm, MVN, BatchNorm training) and :mod:`.channel_norm` (BatchNorm's per-channel
  affine and running statistics, LRN).
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
