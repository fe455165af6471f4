"""The data-movement ops that move elements to new places: Transpose, Concat, Split, Slice,
Gather, GatherElements, Expand and Tile (the ops that keep the elements' order are in
:mod:`.ops`; their kernels in :mod:`.copies` and :mod:`.transpose`).
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.kernels import broadcast_strides, c_strides
from plugrt.plugin import VARIADIC, Attr, TensorInfo, dims, optional

from . import copies, transpose
from .ops import (
    INT64, MoveOp, as_ints, concrete_shapes, fresh_dim, known_ints, normalize_axes, normalize_axis, require_int,
    same_shape, static_length,
)

_INDEX_DTYPES = frozenset({np.dtype("int32"), INT64})

#: A Slice end at or past this is "to the end" for a symbolic dim.
_TO_END = 2**31 - 1


def _unify(dim_list):
    """One dim standing for several that must be equal: a concrete one if any."""
    for d in dim_list:
        if isinstance(d, int):
            return d
    return dim_list[0]


class Transpose(MoveOp):
    op_type = "Transpose"
    attributes = (Attr("perm", "ints", None),)

    def _perm(self, node, rank):
        perm = node.attrs["perm"]
        if perm is None:
            return list(range(rank))[::-1]
        perm = [int(p) for p in perm]
        if sorted(normalize_axes(node, perm, rank)) != list(range(rank)) or len(perm) != rank:
            raise ShapeError(f"{node.describe()}: perm {perm} is not a permutation of {rank} axes")
        return [normalize_axis(node, p, rank) for p in perm]

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, tuple(x.shape[p] for p in self._perm(node, x.rank)))]

    def forwards(self, node, inputs):
        return 0 if self._perm(node, inputs[0].rank) == list(range(inputs[0].rank)) else None

    def aliases(self, node, inputs):
        """Input 0 where the permutation moves only axes of size 1 relative to the others
        (``[N, 1, 1, C] -> [N, C, 1, 1]`` after a channels-last global pooling): the same
        elements in the same order. Decided at the profile's largest shapes, where a dim
        of 1 is 0 or 1 at every smaller shape too."""
        x = inputs[0]
        moved = [axis for axis in self._perm(node, x.rank) if x.shape[axis] != 1]
        return 0 if moved == sorted(moved) else None

    def reference(self, node, inputs):
        x = inputs[0]
        return [np.transpose(x, self._perm(node, x.ndim))]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        strides = c_strides(x.shape)[self._perm(node, x.rank)]
        narrow = transpose.narrow_transpose_tactic(outputs[0].shape, strides, x.dtype.itemsize)
        tiled = transpose.tiled_transpose_tactic(outputs[0].shape, strides, x.dtype.itemsize)
        wide = transpose.wide_strided_tactic(outputs[0].shape, strides, x.dtype.itemsize, math.prod(x.shape))
        strided = copies.strided_tactic(outputs[0].shape, strides)
        any_rank = copies.generic_strided_tactic(outputs[0].shape, strides)
        return [t for t in (narrow, tiled, wide, strided, any_rank) if t is not None]


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
        return normalize_axis(node, axis, rank)

    def check(self, node, inputs):
        if any(i is None for i in inputs):
            raise ModelError(f"{node.describe()}: inputs cannot be omitted")
        if len({i.dtype for i in inputs}) > 1:
            raise ModelError(f"{node.describe()}: inputs must share one dtype")

    def infer(self, node, inputs):
        rank = inputs[0].rank
        if any(i.rank != rank for i in inputs):
            raise ShapeError(f"{node.describe()}: inputs of different ranks: "
                             + ", ".join(dims.format_shape(i.shape) for i in inputs))
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
        return [copies.concat_tactic([i.shape for i in inputs], axis, outputs[0].shape)]


class Split(MoveOp):
    op_type = "Split"
    attributes = (Attr("axis", "int", 0), Attr("split", "ints", None), Attr("num_outputs", "int", None))
    inputs = (1, 2)
    outputs = (1, VARIADIC)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])
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
        axis = normalize_axis(node, node.attrs["axis"], x.rank)
        second = optional(inputs, 1)
        known = None if second is None or second.value is None else known_ints(second)
        split = self._split_arg(node, ... if second is not None and known is None else known)
        sizes = None if split is ... else self.sizes(node, x.shape[axis], split)
        outs = []
        for k in range(len(node.outputs)):
            d = sizes[k] if sizes is not None else (x.shape[axis] if len(node.outputs) == 1 else fresh_dim(node, axis, f"_o{k}"))
            outs.append(TensorInfo(x.dtype, x.shape[:axis] + (d,) + x.shape[axis + 1:]))
        return outs

    def reference(self, node, inputs):
        x = inputs[0]
        axis = normalize_axis(node, node.attrs["axis"], x.ndim)
        second = optional(inputs, 1)
        split = self._split_arg(node, None if second is None else as_ints(second))
        bounds = np.cumsum(self.sizes(node, x.shape[axis], split))[:-1]
        return list(np.split(x, bounds, axis=axis))

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        axis = normalize_axis(node, node.attrs["axis"], x.rank)
        sizes = [o.shape[axis] for o in outputs]
        return [copies.split_tactic(x.shape, axis, sizes)]


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
            require_int(self, node, inputs, [1, 2, 3, 4], _INDEX_DTYPES)
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
        axes = normalize_axes(node, axes if axes is not None else range(len(starts)), rank)
        steps = steps if steps is not None else [1] * len(starts)
        if 0 in steps:
            raise ShapeError(f"{node.describe()}: a step of 0")
        return {a: (s, e, st) for a, s, e, st in zip(axes, starts, ends, steps)}

    def infer(self, node, inputs):
        x = inputs[0]
        if node.opset < 10:
            values = None
        else:
            values = [known_ints(optional(inputs, i)) for i in range(1, 5)]
        starts, ends, axes, steps = self._params(node, values)
        n = None
        if node.opset >= 10:
            n = static_length(self, node, inputs[1], "Slice starts")
            if optional(inputs, 3) is not None and axes is None:
                return [TensorInfo(x.dtype, tuple(fresh_dim(node, i) for i in range(x.rank)))]
            if optional(inputs, 4) is not None and steps is None:
                steps = [None] * n
            starts = starts if starts is not None else [None] * n
            ends = ends if ends is not None else [None] * n
        per_axis = self._axis_slices(node, x.rank, starts, ends, axes, steps)
        out = list(x.shape)
        for a, (s, e, st) in per_axis.items():
            d = x.shape[a]
            if None in (s, e, st):
                out[a] = fresh_dim(node, a)
            elif isinstance(d, int):
                out[a] = len(range(*onnx_slice(s, e, st, d).indices(d)))
            elif st == 1 and s >= 0 and e >= _TO_END:
                out[a] = d if s == 0 else f"({d}-{s})"
            else:
                out[a] = fresh_dim(node, a)
        return [TensorInfo(x.dtype, tuple(out))]

    def forwards(self, node, inputs):
        """Input 0 when the slice keeps every element: the same shape with positive steps
        (a positive step can only keep a dim whole by taking all of it, in order)."""
        values = None if node.opset < 10 else [known_ints(optional(inputs, i)) for i in range(1, 5)]
        steps = self._params(node, values)[3]
        if node.opset >= 10 and optional(inputs, 4) is not None and steps is None:
            return None
        if steps is not None and any(step <= 0 for step in steps):
            return None
        return same_shape(self, node, inputs)

    def reference(self, node, inputs):
        x = inputs[0]
        values = [None if v is None else as_ints(v) for v in inputs[1:]]
        per_axis = self._axis_slices(node, x.ndim, *self._params(node, values))
        index = tuple(onnx_slice(*per_axis[a], x.shape[a]) if a in per_axis else slice(None) for a in range(x.ndim))
        return [x[index]]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        values = [None if i is None else known_ints(i) for i in inputs[1:]]
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
        return [copies.strided_tactic(outputs[0].shape, steps, base),
                copies.generic_strided_tactic(outputs[0].shape, steps, base)]


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
        require_int(self, node, inputs, [1], _INDEX_DTYPES)

    def infer(self, node, inputs):
        x, idx = inputs
        axis = normalize_axis(node, node.attrs["axis"], x.rank)
        return [TensorInfo(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]

    def reference(self, node, inputs):
        x, idx = inputs
        axis = normalize_axis(node, node.attrs["axis"], x.ndim)
        return [np.take(x, _wrap(idx, x.shape[axis]), axis=axis)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x, idx = inputs
        axis = normalize_axis(node, node.attrs["axis"], x.rank)
        return [copies.gather_tactic(x.shape, axis, math.prod(idx.shape))]


class GatherElements(MoveOp):
    op_type = "GatherElements"
    since_opset = 11
    attributes = (Attr("axis", "int", 0),)
    inputs = (2, 2)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1], _INDEX_DTYPES)
        if inputs[0].rank != inputs[1].rank:
            raise ShapeError(f"{node.describe()}: data and indices ranks differ")

    def infer(self, node, inputs):
        normalize_axis(node, node.attrs["axis"], inputs[0].rank)
        return [TensorInfo(inputs[0].dtype, inputs[1].shape)]

    def reference(self, node, inputs):
        x, idx = inputs
        axis = normalize_axis(node, node.attrs["axis"], x.ndim)
        # Indices may be smaller than the data on every axis (no broadcasting), so index
        # explicitly: out[i0..in] = x[i0.., idx[i0..in], ..in].
        grid = list(np.indices(idx.shape, sparse=True))
        grid[axis] = _wrap(idx, x.shape[axis])
        return [x[tuple(grid)]]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        x, idx = inputs
        axis = normalize_axis(node, node.attrs["axis"], x.rank)
        return [copies.gather_elements_tactic(x.shape, idx.shape, axis)]


class Expand(MoveOp):
    op_type = "Expand"
    since_opset = 8
    inputs = (2, 2)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])

    def infer(self, node, inputs):
        x, shape = inputs
        target = known_ints(shape)
        if target is None:
            rank = max(x.rank, static_length(self, node, shape, "Expand shape"))
            lead = rank - x.rank
            out = tuple(x.shape[i - lead] if i >= lead and isinstance(x.shape[i - lead], int)
                        and x.shape[i - lead] != 1 else fresh_dim(node, i) for i in range(rank))
            return [TensorInfo(x.dtype, out)]
        try:
            return [TensorInfo(x.dtype, dims.broadcast([x.shape, tuple(target)]))]
        except ValueError as exc:
            raise ShapeError(f"{node.describe()}: cannot expand {dims.format_shape(x.shape)} to {target} ({exc})") from None

    def reference(self, node, inputs):
        x, shape = inputs
        return [np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(as_ints(shape)))))]

    def forwards(self, node, inputs):
        return same_shape(self, node, inputs)

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        out_shape = outputs[0].shape
        strides = broadcast_strides(inputs[0].shape, out_shape)
        return [copies.strided_tactic(out_shape, strides), copies.generic_strided_tactic(out_shape, strides)]


class Tile(MoveOp):
    op_type = "Tile"
    since_opset = 6
    inputs = (2, 2)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])
        if static_length(self, node, inputs[1], "Tile repeats") != inputs[0].rank:
            raise ShapeError(f"{node.describe()}: repeats must have one entry per input axis")

    def infer(self, node, inputs):
        x, repeats = inputs
        reps = known_ints(repeats)
        if reps is None:
            return [TensorInfo(x.dtype, tuple(fresh_dim(node, i) for i in range(x.rank)))]
        if any(r < 0 for r in reps):
            raise ShapeError(f"{node.describe()}: negative repeats {reps}")
        return [TensorInfo(x.dtype, tuple(dims.mul(d, r) for d, r in zip(x.shape, reps)))]

    def reference(self, node, inputs):
        return [np.tile(inputs[0], as_ints(inputs[1]))]

    def forwards(self, node, inputs):
        reps = known_ints(inputs[1])
        return 0 if reps is not None and all(r == 1 for r in reps) else None

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [copies.tile_tactic(inputs[0].shape, outputs[0].shape)]


OPS = (Transpose, Concat, Split, Slice, Gather, GatherElements, Expand, Tile)
