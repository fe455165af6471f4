"""Data movement and selection: Reshape, Flatten, Squeeze/Unsqueeze, Identity, Dropout,
Transpose, Concat, Split, Slice, Gather, GatherElements, Expand, Tile (the generators,
Shape, Constant, Range, ... are in :mod:`generators`; the CUDA kernels in :mod:`shape_kernels`).

Shape-like inputs (Reshape's shape, Slice's starts, Unsqueeze's axes, ...) are read from
``TensorInfo.value`` when known, giving exact output shapes; when unknown the output keeps
the right rank with fresh symbolic dims named ``{node}_d{axis}``.

Attribute-to-input moves: Reshape's shape (input from 5), Slice's starts/ends/axes (10),
Split's split and Squeeze/Unsqueeze's axes (13). The older forms are implemented too.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt import hookimpl
from plugrt.errors import ModelError, ShapeError
from plugrt.ir import dims
from plugrt.ir.dims import format_shape
from plugrt.kernels import broadcast_strides, c_strides
from plugrt.plugin import FLOAT_DTYPES, SHAPE, VARIADIC, Attr, OpPlugin, TensorInfo, optional

from . import shape_kernels, transpose_kernels

INT64 = np.dtype("int64")
BOOL = np.dtype(bool)
_INDEX_DTYPES = frozenset({np.dtype("int32"), INT64})
_MOVES = frozenset({SHAPE})
#: A Slice end at or past this is "to the end" for a symbolic dim.
_TO_END = 2**31 - 1


def _fresh(node, axis: int, tag: str = "") -> str:
    return f"{node.name}{tag}_d{axis}"


def _ints(array) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _value(info):
    """The known value of an optional shape-like input as a list of ints (None if unknown)."""
    return None if info is None or info.value is None else _ints(info.value)


def _axis(node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{node.describe()}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes(node, axes, rank: int) -> list[int]:
    out = [_axis(node, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{node.describe()}: axes {list(axes)} repeat an axis")
    return out


def _length(op, node, info, what: str) -> int:
    """The static element count of a 1-D shape-like input (its value may be unknown)."""
    if info.rank > 1 or not info.is_static:
        raise op.unsupported(node, f"a {what} input of shape {format_shape(info.shape)}",
                             "its length must be known to infer the output's rank")
    return int(np.prod(info.shape, dtype=np.int64))


def _require_int(op, node, inputs, which, allowed=frozenset({INT64})):
    op.require_dtypes(node, inputs, allowed, which)


def _unify(dim_list):
    """One dim standing for several that must be equal: a concrete one if any."""
    for d in dim_list:
        if isinstance(d, int):
            return d
    return dim_list[0]


def concrete_shapes(tactics):
    """Wrap an op's ``tactics`` to refuse shapes still symbolic at build time, which is
    how an output shape that depends on a runtime input's values (a Squeeze's axes, a
    Tile's repeats fed as graph inputs) reaches it."""

    @functools.wraps(tactics)
    def checked(self, node, inputs, outputs):
        for info in [*inputs, *outputs]:
            if info is not None and not info.is_static:
                raise self.unsupported(node, f"a tensor of shape {format_shape(info.shape)} not known at build time",
                                       "make the shape operands constants or shape-tensor inputs")
        return tactics(self, node, inputs, outputs)

    return checked


class MoveOp(OpPlugin):
    groups = _MOVES


def same_shape(op, node, inputs) -> int | None:
    """``forwards`` of an op that only reshapes: input 0 when the output's inferred shape is
    the input's (a symbolic dim matches only the same symbol), else ``None``."""
    return 0 if tuple(op.infer(node, list(inputs))[0].shape) == tuple(inputs[0].shape) else None


class CopyOp(MoveOp):
    """An op whose output holds the input's elements in the same order (a new shape)."""

    def forwards(self, node, inputs):
        return same_shape(self, node, inputs)

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [shape_kernels.copy_tactic()]


# ---------------------------------------------------------------------------------- reshaping


class Flatten(CopyOp):
    op_type = "Flatten"
    attributes = (Attr("axis", "int", 1),)

    def infer(self, node, inputs):
        x = inputs[0]
        axis = node.attrs["axis"]
        if not -x.rank <= axis <= x.rank:
            raise ShapeError(f"{node.describe()}: axis {axis} is out of range for rank {x.rank}")
        axis = axis + x.rank if axis < 0 else axis
        return [TensorInfo(x.dtype, (dims.prod(x.shape[:axis]), dims.prod(x.shape[axis:])))]

    def reference(self, node, inputs):
        x = inputs[0]
        axis = node.attrs["axis"]
        axis = axis + x.ndim if axis < 0 else axis
        return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


def _quotient(node, numer, denom, index):
    """prod(numer) / prod(denom) over possibly symbolic dims, cancelling common factors."""
    numer = list(numer)
    rest = []
    for d in denom:
        if d in numer and not (isinstance(d, int) and d == 0):
            numer.remove(d)
        else:
            rest.append(d)
    num_int = math.prod(d for d in numer if isinstance(d, int))
    den_int = math.prod(d for d in rest if isinstance(d, int))
    symbols = [d for d in numer if isinstance(d, str)]
    if any(isinstance(d, str) for d in rest):
        return _fresh(node, index)
    if den_int == 0:
        raise ShapeError(f"{node.describe()}: cannot infer the -1 dim next to a 0 dim")
    if num_int % den_int:
        if symbols:
            return _fresh(node, index)
        raise ShapeError(f"{node.describe()}: {num_int} elements do not divide into blocks of {den_int}")
    return dims.mul(dims.prod(symbols), num_int // den_int)


def reshape_dims(node, in_shape, target) -> tuple:
    """Reshape's output dims for ``target`` (with 0 and -1 entries) of an input shape."""
    allowzero = node.attrs["allowzero"]
    out, infer_at = [], None
    for i, t in enumerate(target):
        if t == -1:
            if infer_at is not None:
                raise ShapeError(f"{node.describe()}: shape {target} has more than one -1")
            infer_at = i
            out.append(None)
        elif t == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeError(f"{node.describe()}: shape {target} copies dim {i} of a rank-{len(in_shape)} input")
            out.append(in_shape[i])
        elif t < 0:
            raise ShapeError(f"{node.describe()}: invalid shape entry {t} in {target}")
        else:
            out.append(t)
    if infer_at is not None:
        if allowzero and 0 in target:
            raise ShapeError(f"{node.describe()}: allowzero=1 shape {target} has both 0 and -1")
        out[infer_at] = _quotient(node, in_shape, [d for d in out if d is not None], infer_at)
    elif dims.is_static(in_shape) and dims.is_static(out) and math.prod(in_shape) != math.prod(out):
        raise ShapeError(f"{node.describe()}: cannot reshape {format_shape(in_shape)} to {target}")
    return tuple(out)


class Reshape(CopyOp):
    op_type = "Reshape"
    attributes = (Attr("shape", "ints", None), Attr("consumed_inputs", "ints", None), Attr("allowzero", "int", 0))
    inputs = (1, 2)

    def check(self, node, inputs):
        if node.opset >= 5:
            if optional(inputs, 1) is None:
                raise ModelError(f"{node.describe()}: the shape input is required from opset 5")
            _require_int(self, node, inputs, [1])
        elif node.attrs["shape"] is None:
            raise ModelError(f"{node.describe()}: the shape attribute is required before opset 5")

    def infer(self, node, inputs):
        x = inputs[0]
        target = node.attrs["shape"] if node.opset < 5 else _value(inputs[1])
        if target is None:
            rank = _length(self, node, inputs[1], "Reshape shape")
            return [TensorInfo(x.dtype, tuple(_fresh(node, i) for i in range(rank)))]
        return [TensorInfo(x.dtype, reshape_dims(node, x.shape, target))]

    def reference(self, node, inputs):
        x = inputs[0]
        target = node.attrs["shape"] if node.opset < 5 else _ints(inputs[1])
        return [x.reshape(reshape_dims(node, x.shape, target))]


class Transpose(MoveOp):
    op_type = "Transpose"
    attributes = (Attr("perm", "ints", None),)

    def _perm(self, node, rank):
        perm = node.attrs["perm"]
        if perm is None:
            return list(range(rank))[::-1]
        perm = [int(p) for p in perm]
        if sorted(_axes(node, perm, rank)) != list(range(rank)) or len(perm) != rank:
            raise ShapeError(f"{node.describe()}: perm {perm} is not a permutation of {rank} axes")
        return [_axis(node, p, rank) for p in perm]

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, tuple(x.shape[p] for p in self._perm(node, x.rank)))]

    def forwards(self, node, inputs):
        return 0 if self._perm(node, inputs[0].rank) == list(range(inputs[0].rank)) else None

    def reference(self, node, inputs):
        x = inputs[0]
        return [np.transpose(x, self._perm(node, x.ndim))]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        strides = c_strides(x.shape)[self._perm(node, x.rank)]
        tiled = transpose_kernels.tiled_transpose_tactic(outputs[0].shape, strides, x.dtype.itemsize)
        strided = shape_kernels.strided_tactic(outputs[0].shape, strides)
        return [strided] if tiled is None else [tiled, strided]


class Concat(MoveOp):
    op_type = "Concat"
    attributes = (Attr("axis", "int", None),)
    inputs = (1, VARIADIC)

    def _axis_of(self, node, rank):
        axis = node.attrs["axis"]
        if axis is None:
            if node.opset >= 4:
                raise ModelError(f"{node.describe()}: the axis attribute is required from opset 4")
            axis = 1
        return _axis(node, axis, rank)

    def check(self, node, inputs):
        if any(i is None for i in inputs):
            raise ModelError(f"{node.describe()}: inputs cannot be omitted")
        if len({i.dtype for i in inputs}) > 1:
            raise ModelError(f"{node.describe()}: inputs must share one dtype")

    def infer(self, node, inputs):
        rank = inputs[0].rank
        if any(i.rank != rank for i in inputs):
            raise ShapeError(f"{node.describe()}: inputs of different ranks: "
                             + ", ".join(format_shape(i.shape) for i in inputs))
        axis = self._axis_of(node, rank)
        out = []
        for a in range(rank):
            column = [i.shape[a] for i in inputs]
            if a == axis:
                total = 0
                for d in column:
                    total = dims.add(total, d)
                out.append(total)
            else:
                known = {d for d in column if isinstance(d, int)}
                if len(known) > 1:
                    raise ShapeError(f"{node.describe()}: inputs differ at axis {a}: {column}")
                out.append(_unify(column))
        return [TensorInfo(inputs[0].dtype, tuple(out))]

    def reference(self, node, inputs):
        return [np.concatenate(inputs, axis=self._axis_of(node, inputs[0].ndim))]

    def forwards(self, node, inputs):
        return 0 if len(inputs) == 1 else None

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        axis = self._axis_of(node, inputs[0].rank)
        return [shape_kernels.concat_tactic([i.shape for i in inputs], axis, outputs[0].shape)]


class Split(MoveOp):
    op_type = "Split"
    attributes = (Attr("axis", "int", 0), Attr("split", "ints", None), Attr("num_outputs", "int", None))
    inputs = (1, 2)
    outputs = (1, VARIADIC)

    def check(self, node, inputs):
        _require_int(self, node, inputs, [1])
        if node.opset >= 18 and node.attrs["num_outputs"] is not None:
            if optional(inputs, 1) is not None:
                raise ModelError(f"{node.describe()}: give either the split input or num_outputs, not both")
            if node.attrs["num_outputs"] != len(node.outputs):
                raise ModelError(f"{node.describe()}: num_outputs={node.attrs['num_outputs']} "
                                 f"but the node has {len(node.outputs)} outputs")

    def _split_arg(self, node, second):
        """The split sizes as given (list), None when absent, or ``...`` when unknown."""
        if node.opset < 13 and node.attrs["split"] is not None:
            return list(node.attrs["split"])
        if second is None:
            return None
        return second if isinstance(second, list) else ...

    def sizes(self, node, dim, split):
        count = len(node.outputs)
        if split is not None:
            if len(split) != count or any(s < 0 for s in split):
                raise ShapeError(f"{node.describe()}: split {split} does not fit {count} outputs")
            if isinstance(dim, int) and sum(split) != dim:
                raise ShapeError(f"{node.describe()}: split {split} does not sum to dim {dim}")
            return list(split)
        if not isinstance(dim, int):
            return None
        chunk = -(-dim // count)
        uneven = node.opset >= 18 and node.attrs["num_outputs"] is not None
        if dim % count and (not uneven or chunk * (count - 1) >= dim):
            raise ShapeError(f"{node.describe()}: dim {dim} does not split into {count} outputs")
        return [chunk] * (count - 1) + [dim - chunk * (count - 1)]

    def forwards(self, node, inputs):
        return 0 if len(node.outputs) == 1 else None  # the one part is the whole (sizes are checked)

    def infer(self, node, inputs):
        x = inputs[0]
        axis = _axis(node, node.attrs["axis"], x.rank)
        second = optional(inputs, 1)
        known = None if second is None or second.value is None else _value(second)
        split = self._split_arg(node, ... if second is not None and known is None else known)
        sizes = None if split is ... else self.sizes(node, x.shape[axis], split)
        outs = []
        for k in range(len(node.outputs)):
            d = sizes[k] if sizes is not None else (x.shape[axis] if len(node.outputs) == 1 else _fresh(node, axis, f"_o{k}"))
            outs.append(TensorInfo(x.dtype, x.shape[:axis] + (d,) + x.shape[axis + 1:]))
        return outs

    def reference(self, node, inputs):
        x = inputs[0]
        axis = _axis(node, node.attrs["axis"], x.ndim)
        second = optional(inputs, 1)
        split = self._split_arg(node, None if second is None else _ints(second))
        bounds = np.cumsum(self.sizes(node, x.shape[axis], split))[:-1]
        return list(np.split(x, bounds, axis=axis))

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        axis = _axis(node, node.attrs["axis"], x.rank)
        sizes = [o.shape[axis] for o in outputs]
        return [shape_kernels.split_tactic(x.shape, axis, sizes)]


def onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """The Python slice for one ONNX Slice axis. ONNX clamps differently from Python: a
    start below the axis clamps to 0 (Python, stepping backwards, makes it empty)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


class Slice(MoveOp):
    op_type = "Slice"
    attributes = (Attr("starts", "ints", None), Attr("ends", "ints", None), Attr("axes", "ints", None))
    inputs = (1, 5)

    def check(self, node, inputs):
        if node.opset >= 10:
            if optional(inputs, 1) is None or optional(inputs, 2) is None:
                raise ModelError(f"{node.describe()}: the starts and ends inputs are required from opset 10")
            _require_int(self, node, inputs, [1, 2, 3, 4], _INDEX_DTYPES)
        elif node.attrs["starts"] is None or node.attrs["ends"] is None:
            raise ModelError(f"{node.describe()}: the starts and ends attributes are required before opset 10")

    def _params(self, node, values):
        """(starts, ends, axes, steps) lists; entries are None when unknown; axes/steps may be None."""
        if node.opset < 10:
            a = node.attrs
            return a["starts"], a["ends"], a["axes"] or None, None
        return tuple(values[i] if i < len(values) else None for i in range(4))

    @staticmethod
    def _axis_slices(node, rank, starts, ends, axes, steps):
        if len(starts) != len(ends) or (axes is not None and len(axes) != len(starts)) or \
                (steps is not None and len(steps) != len(starts)):
            raise ShapeError(f"{node.describe()}: starts, ends, axes and steps differ in length")
        axes = _axes(node, axes if axes is not None else range(len(starts)), rank)
        steps = steps if steps is not None else [1] * len(starts)
        if 0 in steps:
            raise ShapeError(f"{node.describe()}: a step of 0")
        return {a: (s, e, st) for a, s, e, st in zip(axes, starts, ends, steps)}

    def infer(self, node, inputs):
        x = inputs[0]
        if node.opset < 10:
            values = None
        else:
            values = [_value(optional(inputs, i)) for i in range(1, 5)]
        starts, ends, axes, steps = self._params(node, values)
        n = None
        if node.opset >= 10:
            n = _length(self, node, inputs[1], "Slice starts")
            if optional(inputs, 3) is not None and axes is None:
                return [TensorInfo(x.dtype, tuple(_fresh(node, i) for i in range(x.rank)))]
            if optional(inputs, 4) is not None and steps is None:
                steps = [None] * n
            starts = starts if starts is not None else [None] * n
            ends = ends if ends is not None else [None] * n
        per_axis = self._axis_slices(node, x.rank, starts, ends, axes, steps)
        out = list(x.shape)
        for a, (s, e, st) in per_axis.items():
            d = x.shape[a]
            if None in (s, e, st):
                out[a] = _fresh(node, a)
            elif isinstance(d, int):
                out[a] = len(range(*onnx_slice(s, e, st, d).indices(d)))
            elif st == 1 and s >= 0 and e >= _TO_END:
                out[a] = d if s == 0 else f"({d}-{s})"
            else:
                out[a] = _fresh(node, a)
        return [TensorInfo(x.dtype, tuple(out))]

    def forwards(self, node, inputs):
        """Input 0 when the slice keeps every element: the same shape with positive steps
        (a positive step can only keep a dim whole by taking all of it, in order)."""
        values = None if node.opset < 10 else [_value(optional(inputs, i)) for i in range(1, 5)]
        steps = self._params(node, values)[3]
        if node.opset >= 10 and optional(inputs, 4) is not None and steps is None:
            return None
        if steps is not None and any(step <= 0 for step in steps):
            return None
        return same_shape(self, node, inputs)

    def reference(self, node, inputs):
        x = inputs[0]
        values = [None if v is None else _ints(v) for v in inputs[1:]]
        per_axis = self._axis_slices(node, x.ndim, *self._params(node, values))
        index = tuple(onnx_slice(*per_axis[a], x.shape[a]) if a in per_axis else slice(None) for a in range(x.ndim))
        return [x[index]]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        values = [None if i is None else _value(i) for i in inputs[1:]]
        if any(i is not None and v is None for i, v in zip(inputs[1:], values)):
            raise self.unsupported(node, "starts, ends, axes or steps computed at run time",
                                   "make them initializers or constant-foldable shape computations")
        per_axis = self._axis_slices(node, x.rank, *self._params(node, values))
        strides = c_strides(x.shape)
        base, steps = 0, []
        for a, d in enumerate(x.shape):
            start, step = 0, 1
            if a in per_axis:
                start, _, step = onnx_slice(*per_axis[a], d).indices(d)
            base += start * int(strides[a])
            steps.append(step * int(strides[a]))
        return [shape_kernels.strided_tactic(outputs[0].shape, steps, base)]


class Squeeze(CopyOp):
    op_type = "Squeeze"
    attributes = (Attr("axes", "ints", None),)
    inputs = (1, 2)

    def check(self, node, inputs):
        _require_int(self, node, inputs, [1])

    def _kept(self, node, shape, axes):
        """Indices of the dims kept; without axes, symbolic dims are assumed not to be 1."""
        if axes is None:
            return [i for i, d in enumerate(shape) if d != 1]
        axes = _axes(node, axes, len(shape))
        for a in axes:
            if isinstance(shape[a], int) and shape[a] != 1:
                raise ShapeError(f"{node.describe()}: cannot squeeze axis {a} of size {shape[a]}")
        return [i for i in range(len(shape)) if i not in axes]

    def infer(self, node, inputs):
        x = inputs[0]
        if node.opset < 13:
            axes = node.attrs["axes"] or None
        else:
            second = optional(inputs, 1)
            axes = _value(second) if second is not None else None
            if second is not None and axes is None:
                rank = x.rank - _length(self, node, second, "Squeeze axes")
                return [TensorInfo(x.dtype, tuple(_fresh(node, i) for i in range(rank)))]
        return [TensorInfo(x.dtype, tuple(x.shape[i] for i in self._kept(node, x.shape, axes)))]

    def forwards(self, node, inputs):
        given = node.attrs["axes"] if node.opset < 13 else optional(inputs, 1)
        if not given and not inputs[0].is_static:
            return None  # without axes, a symbolic dim of 1 at run time would be squeezed
        return same_shape(self, node, inputs)

    def reference(self, node, inputs):
        x = inputs[0]
        if node.opset < 13:
            axes = node.attrs["axes"] or None
        else:
            axes = None if optional(inputs, 1) is None else _ints(inputs[1])
        return [x.reshape(tuple(x.shape[i] for i in self._kept(node, x.shape, axes)))]


class Unsqueeze(CopyOp):
    op_type = "Unsqueeze"
    attributes = (Attr("axes", "ints", None),)
    inputs = (1, 2)

    def check(self, node, inputs):
        if node.opset >= 13:
            if optional(inputs, 1) is None:
                raise ModelError(f"{node.describe()}: the axes input is required from opset 13")
            _require_int(self, node, inputs, [1])
        elif node.attrs["axes"] is None:
            raise ModelError(f"{node.describe()}: the axes attribute is required before opset 13")

    @staticmethod
    def shape(node, shape, axes):
        rank = len(shape) + len(axes)
        axes = set(_axes(node, axes, rank))
        rest = iter(shape)
        return tuple(1 if i in axes else next(rest) for i in range(rank))

    def infer(self, node, inputs):
        x = inputs[0]
        axes = node.attrs["axes"] if node.opset < 13 else _value(inputs[1])
        if axes is None:
            rank = x.rank + _length(self, node, inputs[1], "Unsqueeze axes")
            return [TensorInfo(x.dtype, tuple(_fresh(node, i) for i in range(rank)))]
        return [TensorInfo(x.dtype, self.shape(node, x.shape, axes))]

    def reference(self, node, inputs):
        x = inputs[0]
        axes = node.attrs["axes"] if node.opset < 13 else _ints(inputs[1])
        return [x.reshape(self.shape(node, x.shape, axes))]


# ---------------------------------------------------------------------------------- selection


def _wrap(indices: np.ndarray, dim: int) -> np.ndarray:
    indices = indices.astype(np.int64)
    if np.any((indices < -dim) | (indices >= dim)):
        raise IndexError(f"indices out of range [-{dim}, {dim - 1}]")
    return np.where(indices < 0, indices + dim, indices)


class Gather(MoveOp):
    op_type = "Gather"
    attributes = (Attr("axis", "int", 0),)
    inputs = (2, 2)

    def check(self, node, inputs):
        _require_int(self, node, inputs, [1], _INDEX_DTYPES)

    def infer(self, node, inputs):
        x, idx = inputs
        axis = _axis(node, node.attrs["axis"], x.rank)
        return [TensorInfo(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]

    def reference(self, node, inputs):
        x, idx = inputs
        axis = _axis(node, node.attrs["axis"], x.ndim)
        return [np.take(x, _wrap(idx, x.shape[axis]), axis=axis)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x, idx = inputs
        axis = _axis(node, node.attrs["axis"], x.rank)
        return [shape_kernels.gather_tactic(x.shape, axis, math.prod(idx.shape))]


class GatherElements(MoveOp):
    op_type = "GatherElements"
    since_opset = 11
    attributes = (Attr("axis", "int", 0),)
    inputs = (2, 2)

    def check(self, node, inputs):
        _require_int(self, node, inputs, [1], _INDEX_DTYPES)
        if inputs[0].rank != inputs[1].rank:
            raise ShapeError(f"{node.describe()}: data and indices ranks differ")

    def infer(self, node, inputs):
        _axis(node, node.attrs["axis"], inputs[0].rank)
        return [TensorInfo(inputs[0].dtype, inputs[1].shape)]

    def reference(self, node, inputs):
        x, idx = inputs
        axis = _axis(node, node.attrs["axis"], x.ndim)
        # Indices may be smaller than the data on every axis (no broadcasting), so index
        # explicitly: out[i0..in] = x[i0.., idx[i0..in], ..in].
        grid = list(np.indices(idx.shape, sparse=True))
        grid[axis] = _wrap(idx, x.shape[axis])
        return [x[tuple(grid)]]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x, idx = inputs
        axis = _axis(node, node.attrs["axis"], x.rank)
        return [shape_kernels.gather_elements_tactic(x.shape, idx.shape, axis)]


class Expand(MoveOp):
    op_type = "Expand"
    since_opset = 8
    inputs = (2, 2)

    def check(self, node, inputs):
        _require_int(self, node, inputs, [1])

    def infer(self, node, inputs):
        x, shape = inputs
        target = _value(shape)
        if target is None:
            rank = max(x.rank, _length(self, node, shape, "Expand shape"))
            lead = rank - x.rank
            out = tuple(x.shape[i - lead] if i >= lead and isinstance(x.shape[i - lead], int)
                        and x.shape[i - lead] != 1 else _fresh(node, i) for i in range(rank))
            return [TensorInfo(x.dtype, out)]
        try:
            return [TensorInfo(x.dtype, dims.broadcast([x.shape, tuple(target)]))]
        except ValueError as exc:
            raise ShapeError(f"{node.describe()}: cannot expand {format_shape(x.shape)} to {target} ({exc})") from None

    def reference(self, node, inputs):
        x, shape = inputs
        return [np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(_ints(shape)))))]

    def forwards(self, node, inputs):
        return same_shape(self, node, inputs)

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        out_shape = outputs[0].shape
        return [shape_kernels.strided_tactic(out_shape, broadcast_strides(inputs[0].shape, out_shape))]


class Tile(MoveOp):
    op_type = "Tile"
    since_opset = 6
    inputs = (2, 2)

    def check(self, node, inputs):
        _require_int(self, node, inputs, [1])
        if _length(self, node, inputs[1], "Tile repeats") != inputs[0].rank:
            raise ShapeError(f"{node.describe()}: repeats must have one entry per input axis")

    def infer(self, node, inputs):
        x, repeats = inputs
        reps = _value(repeats)
        if reps is None:
            return [TensorInfo(x.dtype, tuple(_fresh(node, i) for i in range(x.rank)))]
        if any(r < 0 for r in reps):
            raise ShapeError(f"{node.describe()}: negative repeats {reps}")
        return [TensorInfo(x.dtype, tuple(dims.mul(d, r) for d, r in zip(x.shape, reps)))]

    def reference(self, node, inputs):
        return [np.tile(inputs[0], _ints(inputs[1]))]

    def forwards(self, node, inputs):
        reps = _value(inputs[1])
        return 0 if reps is not None and all(r == 1 for r in reps) else None

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [shape_kernels.tile_tactic(inputs[0].shape, outputs[0].shape)]


class Identity(CopyOp):
    op_type = "Identity"

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape, x.value)]

    def reference(self, node, inputs):
        return [inputs[0].copy()]

    def forwards(self, node, inputs):
        return 0


class Dropout(OpPlugin):
    """Inference-mode Dropout: the output is the input, the optional mask all True (ones of
    the input dtype before opset 10). Training mode with a nonzero ratio is refused."""

    op_type = "Dropout"
    attributes = (
        Attr("is_test", "int", 0), Attr("consumed_inputs", "ints", None),
        Attr("ratio", "float", 0.5), Attr("seed", "int", None),
    )
    inputs = (1, 3)
    outputs = (1, 2)
    dtypes = FLOAT_DTYPES | {BOOL}

    def _training(self, node, ratio, training) -> bool:
        """Whether this run drops anything; ratio/training are arrays, or None when absent."""
        if node.opset < 7:
            return not node.attrs["is_test"] and node.attrs["ratio"] != 0
        if node.opset < 12:
            return False
        ratio = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        return training is not None and bool(np.asarray(training).reshape(-1)[0]) and ratio != 0

    def _refuse(self, node):
        return self.unsupported(node, "training mode (random dropping)",
                                "export the model for inference (training_mode=False / is_test=1)")

    def check(self, node, inputs):
        self.require_dtypes(node, inputs, FLOAT_DTYPES, [0, 1])
        self.require_dtypes(node, inputs, {BOOL}, [2])
        ratio, training = optional(inputs, 1), optional(inputs, 2)
        if ratio is not None and ratio.value is None:
            return
        if training is not None and training.value is None:
            return
        if self._training(node, None if ratio is None else ratio.value,
                          None if training is None else training.value):
            raise self._refuse(node)

    def forwards(self, node, inputs):
        """Input 0 when this run drops nothing: inference mode (no training_mode input, or a
        constant false one) or a constant ratio of 0. The core checks the mask is unused."""
        ratio, training = optional(inputs, 1), optional(inputs, 2)
        if node.opset < 12:
            ratio = training = None  # ignored before opset 12
        if training is not None and training.value is None:
            return None
        if training is not None and ratio is not None and ratio.value is None and bool(np.any(training.value)):
            return None
        dropping = self._training(node, None if ratio is None else ratio.value,
                                  None if training is None else training.value)
        return None if dropping else 0

    def infer(self, node, inputs):
        x = inputs[0]
        mask = BOOL if node.opset >= 10 else x.dtype
        return [TensorInfo(x.dtype, x.shape), TensorInfo(mask, x.shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        if self._training(node, optional(inputs, 1), optional(inputs, 2)):
            raise self._refuse(node)
        mask = np.ones(x.shape, dtype=BOOL if node.opset >= 10 else x.dtype)
        return [x.copy(), mask]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        training = optional(inputs, 2) if node.opset >= 12 else None
        ratio = optional(inputs, 1) if node.opset >= 12 else None
        return [shape_kernels.dropout_tactic(inputs[0].dtype, training, ratio)]


OPS = (
    Flatten, Reshape, Transpose, Concat, Split, Slice, Squeeze, Unsqueeze, Gather, GatherElements,
    Expand, Tile, Identity, Dropout,
)


#: The plugrt plugin API versions this module is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [Op() for Op in OPS]
