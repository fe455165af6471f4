"""Spatial data movement and resampling: Pad, DepthToSpace, SpaceToDepth, Resize, Upsample.

- :mod:`.ops`: Pad, DepthToSpace and SpaceToDepth;
- :mod:`.resize_ops`: Resize and Upsample;
- kernels: :mod:`.pad`, :mod:`.permute` (DepthToSpace/SpaceToDepth's permuting gather) and
  :mod:`.resize`.
"""

from plugrt import hookimpl

from . import ops, resize_ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + resize_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
