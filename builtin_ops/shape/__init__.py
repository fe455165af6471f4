"""Data movement and generators: Reshape, Transpose, Concat, Slice, Gather, ..., Shape,
Constant, Range, OneHot, Trilu.

- :mod:`.ops`: the ops that keep the elements' order (Reshape, Flatten, Squeeze, Unsqueeze,
  Identity, Dropout), and the helpers the other op modules share;
- :mod:`.movement_ops`: Transpose, Concat, Split, Slice, Gather, GatherElements, Expand,
  Tile;
- :mod:`.generator_ops`: Shape, Size, Constant, ConstantOfShape, Range, OneHot, Trilu;
- kernels: :mod:`.copies` (plain, strided, row-block and gathering copies),
  :mod:`.transpose` (the shared-memory tiled transpose) and :mod:`.generators`.
"""

from plugrt import hookimpl

from . import generator_ops, movement_ops, ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + movement_ops.OPS + generator_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
