"""Generator ops: tensors made rather than moved. Shape and Size report dims, Constant and
ConstantOfShape hold values, Range, OneHot and Trilu compute from their inputs, EyeLike
from its input's shape, NonZero lists the indices of its input's nonzero elements.

The engine folds every node whose output value is known at build time; the CUDA tactics
(:mod:`.generators`) serve the rest (a Shape of a runtime tensor still writes its known
dims, Range may take runtime start and delta, OneHot runtime indices, Trilu a runtime k).
NonZero's output size is its input's data: it runs on the host, and only where that input's
values are known when the engine is specialized (see :class:`NonZero`).
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import ALL_DTYPES, FLOAT_DTYPES, NUMERIC_DTYPES, Attr, Example, OpPlugin, TensorInfo, dims, optional

from plugrt_builtin_ops.common.dtypes import ONNX_DTYPES, dtype_name

from . import generators
from .ops import (
    INT64, as_ints, concrete_shapes, fresh_dim, known_ints, normalize_axis, require_int, static_length,
)

class Trilu(OpPlugin):
    op_type = "Trilu"
    since_opset = 14
    attributes = (Attr("upper", "int", 1),)
    inputs = (1, 2)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])
        if inputs[0].rank < 2:
            raise ShapeError(f"{node.describe()}: the input must have rank 2 or more")

    def infer(self, node, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        k = 0 if optional(inputs, 1) is None else as_ints(inputs[1])[0]
        return [np.triu(x, k) if node.attrs["upper"] else np.tril(x, k)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [generators.trilu_tactic(inputs[0].shape, bool(node.attrs["upper"]), optional(inputs, 1))]


class EyeLike(OpPlugin):
    """A 2-D tensor of the input's shape with ones on diagonal ``k`` (``k > 0`` above the main
    one, ``k < 0`` below) and zeros elsewhere, of dtype ``dtype`` (a TensorProto code;
    default: the input's). Only the input's shape is read."""

    op_type = "EyeLike"
    since_opset = 9
    attributes = (Attr("dtype", "int", None), Attr("k", "int", 0))

    def _dtype(self, node, x):
        code = node.attrs["dtype"]
        return x.dtype if code is None else ONNX_DTYPES[code]

    def check(self, node, inputs):
        code = node.attrs["dtype"]
        if code is not None and code not in ONNX_DTYPES:
            names = ", ".join(dtype_name(c) for c in sorted(ONNX_DTYPES))
            raise self.unsupported(node, f"dtype={dtype_name(code)}", f"supported: {names}")
        if inputs[0].rank != 2:
            raise ShapeError(f"{node.describe()}: the input must have rank 2, got shape "
                             f"{dims.format_shape(inputs[0].shape)}")

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(self._dtype(node, x), x.shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        return [np.eye(x.shape[0], x.shape[1], k=node.attrs["k"], dtype=self._dtype(node, x))]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [generators.eye_tactic(outputs[0].shape, node.attrs["k"], outputs[0].dtype)]

    def examples(self):
        f32, i32 = np.dtype("float32"), np.dtype("int32")
        return [Example((TensorInfo(f32, (4, 6)),), {"k": -1}, name="float32 below"),
                Example((TensorInfo(i32, (5, 3)),), {"dtype": 10, "k": 2}, name="int32 to float16 above")]


# ---------------------------------------------------------------------------------- shape info


class Shape(OpPlugin):
    op_type = "Shape"
    attributes = (Attr("start", "int", 0), Attr("end", "int", None))

    @staticmethod
    def _range(node, rank):
        if node.opset < 15:
            return 0, rank
        start, end = node.attrs["start"], node.attrs["end"]
        end = rank if end is None else end
        start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
        return start, max(start, end)

    def infer(self, node, inputs):
        start, end = self._range(node, inputs[0].rank)
        selected = inputs[0].shape[start:end]
        value = np.array(selected, dtype=np.int64) if dims.is_static(selected) else None
        return [TensorInfo(INT64, (end - start,), value)]

    def reference(self, node, inputs):
        start, end = self._range(node, inputs[0].ndim)
        return [np.array(inputs[0].shape[start:end], dtype=np.int64)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        start, end = self._range(node, inputs[0].rank)
        return [generators.table_tactic(np.array(inputs[0].shape[start:end], dtype=np.int64))]


class Size(OpPlugin):
    op_type = "Size"

    def infer(self, node, inputs):
        x = inputs[0]
        value = np.array(math.prod(x.shape), dtype=np.int64) if x.is_static else None
        return [TensorInfo(INT64, (), value)]

    def reference(self, node, inputs):
        return [np.array(inputs[0].size, dtype=np.int64)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [generators.table_tactic(np.array(math.prod(inputs[0].shape), dtype=np.int64))]


# ---------------------------------------------------------------------------------- generators


def _unsupported_dtype(op, node, array, what):
    if array.dtype not in ALL_DTYPES:
        raise op.unsupported(node, f"{what} of dtype {array.dtype}",
                             "use a numeric or bool dtype (bfloat16, float8, int4 and strings are not handled)")


class ConstantOfShape(OpPlugin):
    op_type = "ConstantOfShape"
    since_opset = 9
    attributes = (Attr("value", "tensor", None),)
    dtypes = frozenset({INT64})

    def _fill(self, node):
        value = node.attrs["value"]
        return np.zeros(1, np.float32) if value is None else np.asarray(value)

    def check(self, node, inputs):
        fill = self._fill(node)
        if fill.size != 1:
            raise ModelError(f"{node.describe()}: the value attribute must hold one element, got {fill.size}")
        _unsupported_dtype(self, node, fill, "a value attribute")

    def infer(self, node, inputs):
        shape = known_ints(inputs[0])
        if shape is None:
            shape = tuple(fresh_dim(node, i) for i in range(static_length(self, node, inputs[0], "ConstantOfShape shape")))
        elif any(d < 0 for d in shape):
            raise ShapeError(f"{node.describe()}: negative dims in shape {shape}")
        return [TensorInfo(self._fill(node).dtype, tuple(shape))]

    def reference(self, node, inputs):
        fill = self._fill(node)
        return [np.full(tuple(as_ints(inputs[0])), fill.reshape(-1)[0], dtype=fill.dtype)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [generators.fill_tactic(self._fill(node))]


class Constant(OpPlugin):
    """Constant; ``sparse_value`` cannot even be declared (the core has no sparse attribute
    kind), so import refuses it as an unknown attribute."""

    op_type = "Constant"
    attributes = (
        Attr("value", "tensor", None), Attr("value_float", "float", None), Attr("value_floats", "floats", None),
        Attr("value_int", "int", None), Attr("value_ints", "ints", None),
        Attr("value_string", "string", None), Attr("value_strings", "strings", None),
    )
    inputs = (0, 0)

    def _array(self, node):
        a = node.attrs
        given = [k for k, v in a.items() if v is not None]
        if len(given) != 1:
            raise ModelError(f"{node.describe()}: exactly one value attribute must be set, got {given or 'none'}")
        if given[0] in ("value_string", "value_strings"):
            raise self.unsupported(node, f"string constant ({given[0]})", "strings are not handled")
        if a["value"] is not None:
            array = np.asarray(a["value"])
            _unsupported_dtype(self, node, array, "a value tensor")
            return array
        if a["value_float"] is not None:
            return np.array(a["value_float"], dtype=np.float32)
        if a["value_floats"] is not None:
            return np.array(a["value_floats"], dtype=np.float32).reshape(-1)
        if a["value_int"] is not None:
            return np.array(a["value_int"], dtype=np.int64)
        return np.array(a["value_ints"], dtype=np.int64).reshape(-1)

    def check(self, node, inputs):
        self._array(node)

    def infer(self, node, inputs):
        return [TensorInfo.of(self._array(node))]

    def reference(self, node, inputs):
        return [self._array(node).copy()]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [generators.table_tactic(self._array(node))]


_RANGE_DTYPES = FLOAT_DTYPES | {np.dtype(t) for t in ("int16", "int32", "int64")}
_STASH = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


class Range(OpPlugin):
    op_type = "Range"
    since_opset = 11
    attributes = (Attr("stash_type", "int", 1),)
    inputs = (3, 3)
    dtypes = _RANGE_DTYPES

    def check(self, node, inputs):
        if len({i.dtype for i in inputs}) > 1 or any(i.rank > 1 or i.shape not in ((), (1,)) for i in inputs):
            raise ModelError(f"{node.describe()}: start, limit and delta must be scalars of one dtype")
        if node.opset >= 27 and node.attrs["stash_type"] not in _STASH:
            raise self.unsupported(node, f"stash_type={node.attrs['stash_type']}", "use 1 (float) or 11 (double)")

    @staticmethod
    def _count(start, limit, delta) -> int:
        if delta == 0:
            raise ValueError("delta is 0")
        if isinstance(start, int):
            return max(-((start - limit) // delta), 0)
        return max(math.ceil((limit - start) / delta), 0)

    def _scalars(self, values):
        return [v.reshape(-1)[0].item() for v in values]

    def infer(self, node, inputs):
        dtype = inputs[0].dtype
        if any(i.value is None for i in inputs):
            return [TensorInfo(dtype, (fresh_dim(node, 0),))]
        return [TensorInfo(dtype, (self._count(*self._scalars([i.value for i in inputs])),))]

    def reference(self, node, inputs):
        dtype = inputs[0].dtype
        start, limit, delta = self._scalars(inputs)
        n = self._count(start, limit, delta)
        if dtype.kind == "i":
            return [(start + np.arange(n, dtype=np.int64) * delta).astype(dtype)]
        compute = _STASH[node.attrs["stash_type"]] if node.opset >= 27 and dtype == np.float16 else np.dtype(np.float64)
        out = np.arange(compute.type(start), float(limit), float(delta), dtype=compute)[:n]
        return [out.astype(dtype)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        stash32 = node.opset >= 27 and inputs[0].dtype == np.float16 and node.attrs["stash_type"] == 1
        return [generators.range_tactic(inputs[0].dtype, stash32, inputs[0], inputs[2])]


class OneHot(OpPlugin):
    op_type = "OneHot"
    since_opset = 9
    attributes = (Attr("axis", "int", -1),)
    inputs = (3, 3)

    def check(self, node, inputs):
        self.require_dtypes(node, inputs, NUMERIC_DTYPES, [0, 1])
        if inputs[1].shape not in ((), (1,)) or inputs[2].shape != (2,):
            raise ModelError(f"{node.describe()}: depth must be a scalar and values a 2-element tensor")

    def infer(self, node, inputs):
        indices, depth, values = inputs
        axis = normalize_axis(node, node.attrs["axis"], indices.rank + 1)
        d = fresh_dim(node, axis) if depth.value is None else int(depth.value.reshape(-1)[0])
        return [TensorInfo(values.dtype, indices.shape[:axis] + (d,) + indices.shape[axis:])]

    def reference(self, node, inputs):
        indices, depth, values = inputs
        axis = normalize_axis(node, node.attrs["axis"], indices.ndim + 1)
        depth = int(depth.reshape(-1)[0])
        idx = indices.astype(np.int64)
        if node.opset >= 11:
            idx = np.where(idx < 0, idx + depth, idx)
        classes = np.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis))
        hit = np.expand_dims(idx, axis) == classes
        return [np.where(hit, values[1], values[0]).astype(values.dtype)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        indices, _, values = inputs
        axis = normalize_axis(node, node.attrs["axis"], indices.rank + 1)
        depth = int(outputs[0].shape[axis])
        return [generators.one_hot_tactic(indices, values, axis, depth, node.opset >= 11)]


class NonZero(OpPlugin):
    """The indices (rank, count) of X's nonzero elements, in row-major order (a 0-D X
    gives shape (0, count), as ONNX's reference does).

    The count is X's data. Where X's values are known when the engine is specialized (a
    constant, a computation of constants or shapes, a shape-tensor input) the node runs on
    the host, like a shape computation; X computed on the device runs the scan tactic
    (:func:`.generators.nonzero_tactic`) as a data-dependent layer: its output is sized for
    every element nonzero (:meth:`output_bounds`), and the engine reads the count after it.
    """

    op_type = "NonZero"
    since_opset = 9

    def infer(self, node, inputs):
        x = inputs[0]
        if x.value is not None:
            return [TensorInfo.of(self.reference(node, [x.value])[0])]
        if x.is_static and math.prod(x.shape) == 0:
            return [TensorInfo.of(np.zeros((x.rank, 0), np.int64))]
        return [TensorInfo(INT64, (x.rank, fresh_dim(node, 1)))]

    def output_bounds(self, node, inputs):
        return [(inputs[0].rank, math.prod(inputs[0].shape))]

    def reference(self, node, inputs):
        x = inputs[0]
        if x.ndim == 0:
            return [np.zeros((0, int(np.count_nonzero(x))), np.int64)]
        return [np.ascontiguousarray(np.vstack(np.nonzero(x)).astype(np.int64))]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [generators.nonzero_tactic(inputs[0].shape, inputs[0].dtype)]


OPS = (Trilu, EyeLike, Shape, Size, ConstantOfShape, Constant, Range, OneHot, NonZero)
