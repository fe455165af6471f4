"""Elementwise ops with NumPy-style broadcasting, and Cast/CastLike.

- :mod:`.ops`: arithmetic (Add, Sub, Mul, Div, Pow, Mod, BitShift), bitwise (BitwiseAnd,
  BitwiseOr, BitwiseXor, BitwiseNot), variadic (Max, Min, Sum, Mean) and Where, and the
  base the other op modules share;
- :mod:`.predicate_ops`: the ops with bool outputs (comparisons, logic, IsNaN, IsInf);
- :mod:`.cast_ops`: Cast and CastLike;
- :mod:`.device_functions`: the scalar device functions of all of them, for the toolkit's
  pointwise kernel.
"""

from plugrt import hookimpl

from . import cast_ops, ops, predicate_ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + predicate_ops.OPS + cast_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
