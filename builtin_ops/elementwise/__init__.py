"""Elementwise ops with NumPy-style broadcasting, and Cast/CastLike.

- :mod:`.ops`: arithmetic (Add, Sub, Mul, Div, Pow, Mod, BitShift), bitwise (BitwiseAnd,
  BitwiseOr, BitwiseXor, BitwiseNot), variadic (Max, Min, Sum, Mean) and Where, and the
  base the other op modules share;
- :mod:`.predicate_ops`: the ops with bool outputs (comparisons, logic, IsNaN, IsInf);
- :mod:`.cast_ops`: Cast and CastLike;
- :mod:`.rotary_ops`: RotaryEmbedding (``plugrt.elementwise``), rotary position embeddings,
  with its kernel :mod:`.rotary` and :mod:`.fuse_rotary`, the pass recognizing the
  exported ``x * cos + rotate_half(x) * sin``, and :mod:`.rotary_layout`, the pass moving
  the head-swap Transpose before it below it (so that attention takes the swap in);
- :mod:`.device_functions`: the scalar device functions of all of them, for the toolkit's
  pointwise kernel.
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import cast_ops, fuse_rotary, ops, predicate_ops, rotary_layout, rotary_ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + predicate_ops.OPS + cast_ops.OPS + rotary_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: Runs before the contrib plugins' fusion passes (priority 100): attention may read its result.
PASS_PRIORITY = 20
#: After fuse_rotary, still before the attention fusion: it then sees the head swap next to it.
ROTARY_LAYOUT_PRIORITY = 30


@hookimpl
def plugrt_passes():
    return [GraphPass("fuse_rotary", fuse_rotary.run, priority=PASS_PRIORITY,
                      description="x * cos + rotate_half(x) * sin (Slice/Neg/Concat) -> RotaryEmbedding"),
            GraphPass(rotary_layout.NAME, rotary_layout.run, priority=ROTARY_LAYOUT_PRIORITY,
                      description="head-swap Transposes moved below the RotaryEmbedding reading them")]
