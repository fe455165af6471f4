"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
RMSNormalization, GroupNormalization, MeanVarianceNormalization, LRN and LpNormalization.

- :mod:`.ops`: the op plugins (:mod:`.lp_norm_ops`: LpNormalization);
- :mod:`.fuse_layernorm`, :mod:`.fuse_rmsnorm`: the graph passes recognizing layer and RMS
  normalization written in primitive ops;
- kernels: :mod:`.row_norm` (row statistics over any axes: LayerNorm, RMSNorm, InstanceNorm,
  GroupNorm, MVN, BatchNorm training), :mod:`.row_norm_vector` (the same over trailing axes,
  rows held in registers and moved in 16-byte vectors; offered first where it applies),
  :mod:`.channel_norm` (BatchNorm's per-channel affine and running statistics, LRN) and
  :mod:`.lp_norm` (LpNormalization).
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import fuse_layernorm, fuse_rmsnorm, lp_norm_ops, ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + lp_norm_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: Runs before the contrib plugins' fusion passes (priority 100), which may match its result.
PASS_PRIORITY = 10
#: After the LayerNorm recognizer: a LayerNorm's ``d / sqrt(mean(d^2) + eps)`` is an RMSNorm of ``d``.
RMS_PASS_PRIORITY = 11


@hookimpl
def plugrt_passes():
    return [GraphPass("fuse_layernorm", fuse_layernorm.run, priority=PASS_PRIORITY,
                      description="layer normalization written in primitive ops -> LayerNormalization"),
            GraphPass("fuse_rmsnorm", fuse_rmsnorm.run, priority=RMS_PASS_PRIORITY,
                      description="RMS normalization written in primitive ops (Cast upcasts included) -> "
                                  "RMSNormalization")]
