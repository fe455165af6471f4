"""The scatter ops: ScatterElements, its deprecated form Scatter (opsets 9-10), and
ScatterND. Each copies ``data`` and writes ``updates`` into the copy at the places
``indices`` name, replacing (reduction "none") or combining (add and mul from opset 16,
max and min from 18). Their kernels are in :mod:`.scatter`.

The references apply the updates one by one in the order of ``indices`` (C order), as
ONNX's reference implementations do: with reduction "none" and duplicate indices the last
update wins (ONNX leaves that case unspecified; the one-thread-per-update kernels do not
promise it), and max and min propagate NaN (as ``np.maximum``). Negative indices count
from the end; an index out of range is a :class:`~plugrt.ModelError` naming the node.

These are not ``SHAPE``-group ops: with constant indices and updates they still write
values of their own, which the layout passes must not take for a movement of ``data``.
"""

from __future__ import annotations

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.kernels import c_strides
from plugrt.plugin import Attr, Example, OpPlugin, TensorInfo, dims

from . import scatter
from .ops import BOOL, INT64, concrete_shapes, normalize_axis, require_int

_INDEX_DTYPES = frozenset({np.dtype("int32"), INT64})

#: The reductions each opset allows, newest first: ``(since opset, reductions)``.
_REDUCTIONS = ((18, ("none", "add", "mul", "max", "min")), (16, ("none", "add", "mul")), (1, ("none",)))


def _wrapped(node, indices: np.ndarray, dim: int, what: str) -> np.ndarray:
    """``indices`` (int64) wrapped into ``[0, dim)``; out of ``[-dim, dim)`` is an error."""
    indices = np.asarray(indices).astype(np.int64)
    bad = (indices < -dim) | (indices >= dim)
    if bad.any():
        raise ModelError(f"{node.describe()}: index {int(indices[bad][0])} is out of range [-{dim}, {dim - 1}] "
                         f"for {what}; indices must lie in range (negative ones count from the end)")
    return np.where(indices < 0, indices + dim, indices)


def _apply(out: np.ndarray, targets: np.ndarray, values: np.ndarray, reduction: str) -> np.ndarray:
    """Apply ``values`` at flat offsets ``targets`` of ``out`` (C-contiguous), in order."""
    flat_out = out.reshape(-1)
    if reduction == "none":
        # The last of duplicate targets wins: keep each target's last occurrence.
        _, from_end = np.unique(targets[::-1], return_index=True)
        last = targets.size - 1 - from_end
        flat_out[targets[last]] = values[last]
    else:
        ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
        with np.errstate(over="ignore", invalid="ignore"):  # integers wrap, as on the GPU
            ufunc.at(flat_out, targets, values)
    return out


def _differ(a, b) -> bool:
    """Whether two dims are known to differ (both concrete)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


class ScatterOp(OpPlugin):
    """What the scatter ops share: three inputs, updates of data's dtype, the reduction."""

    inputs = (3, 3)

    def reduction(self, node) -> str:
        """The node's reduction, checked against its opset."""
        reduction = node.attrs.get("reduction", "none")
        allowed = next(names for since, names in _REDUCTIONS if node.opset >= since)
        if reduction not in allowed:
            raise ModelError(f"{node.describe()}: reduction {reduction!r} is not one of {list(allowed)} at opset "
                             f"{node.opset} (add and mul arrive in opset 16, max and min in 18)")
        return reduction

    def check(self, node, inputs):
        data, _, updates = inputs
        if updates.dtype != data.dtype:
            raise ModelError(f"{node.describe()}: updates of dtype {updates.dtype} for data of dtype {data.dtype}")
        if data.rank < 1 or inputs[1].rank < 1:
            raise ShapeError(f"{node.describe()}: data and indices must have rank 1 or more")
        if self.reduction(node) != "none" and data.dtype == BOOL:
            raise self.unsupported(node, f"reduction {node.attrs['reduction']!r} on bool",
                                   "use a numeric dtype, or reduction 'none'")


# ---------------------------------------------------------------------------------- ScatterElements


def _distinct_along(axis: int, dim: int):
    """An ``Example.ranges`` rule: indices into ``dim`` that differ along ``axis`` (so no two
    updates meet), half of them negative."""

    def draw(rng, dtype, shape):
        lines = np.moveaxis(np.empty(shape), axis, -1).shape
        picks = np.stack([rng.permutation(dim)[:lines[-1]] for _ in np.ndindex(lines[:-1])]).reshape(lines)
        picks = np.where(rng.random(lines) < 0.5, picks - dim, picks)
        return np.moveaxis(picks, -1, axis).astype(dtype)

    return draw


class ScatterElements(ScatterOp):
    op_type = "ScatterElements"
    since_opset = 11
    attributes = (Attr("axis", "int", 0), Attr("reduction", "string", "none"))

    def check(self, node, inputs):
        require_int(self, node, inputs, [1], _INDEX_DTYPES)
        super().check(node, inputs)
        data, indices, updates = inputs
        if not data.rank == indices.rank == updates.rank:
            raise ShapeError(f"{node.describe()}: data, indices and updates must have one rank "
                             f"(got {data.rank}, {indices.rank}, {updates.rank})")

    def infer(self, node, inputs):
        data, indices, updates = inputs
        axis = normalize_axis(node, node.attrs["axis"], data.rank)
        for d, (i, u, x) in enumerate(zip(indices.shape, updates.shape, data.shape)):
            if _differ(i, u):
                raise ShapeError(f"{node.describe()}: indices {dims.format_shape(indices.shape)} and updates "
                                 f"{dims.format_shape(updates.shape)} differ")
            if d != axis and isinstance(i, int) and isinstance(x, int) and i > x:
                raise ShapeError(f"{node.describe()}: indices {dims.format_shape(indices.shape)} exceed data "
                                 f"{dims.format_shape(data.shape)} at axis {d}")
        return [TensorInfo(data.dtype, data.shape)]

    def reference(self, node, inputs):
        data, indices, updates = inputs
        axis = normalize_axis(node, node.attrs["axis"], data.ndim)
        strides = c_strides(data.shape)
        grid = list(np.indices(indices.shape, sparse=True))
        grid[axis] = _wrapped(node, indices, data.shape[axis], f"axis {axis} of size {data.shape[axis]}")
        targets = sum(g.astype(np.int64) * s for g, s in zip(grid, strides))
        targets = np.broadcast_to(targets, indices.shape).reshape(-1)
        return [_apply(data.copy(), targets, np.asarray(updates).reshape(-1), self.reduction(node))]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        data, indices, _ = inputs
        axis = normalize_axis(node, node.attrs["axis"], data.rank)
        return [scatter.scatter_elements_tactic(data.shape, indices.shape, axis, self.reduction(node), data.dtype)]

    def examples(self):
        f32, f16, i32, i64 = (np.dtype(t) for t in ("float32", "float16", "int32", "int64"))
        return [
            Example((TensorInfo(f32, (3, 5)), TensorInfo(i64, (2, 5)), TensorInfo(f32, (2, 5))),
                    ranges={1: _distinct_along(0, 3)}, name="float32 2-D axis 0"),
            Example((TensorInfo(f32, (2, 3, 5)), TensorInfo(i32, (2, 2, 3)), TensorInfo(f32, (2, 2, 3))),
                    {"axis": 1, "reduction": "add"}, ranges={1: (-3, 3)}, name="float32 3-D add"),
            Example((TensorInfo(f16, (7,)), TensorInfo(i64, (5,)), TensorInfo(f16, (5,))),
                    {"reduction": "mul"}, ranges={1: (-7, 7)}, rtol=1e-3, atol=1e-3, name="float16 1-D mul"),
            Example((TensorInfo(f16, (4, 6)), TensorInfo(i64, (3, 4)), TensorInfo(f16, (3, 4))),
                    {"axis": -1}, ranges={1: _distinct_along(1, 6)}, name="float16 2-D axis -1"),
            Example((TensorInfo(i64, (3, 4)), TensorInfo(i64, (3, 5)), TensorInfo(i64, (3, 5))),
                    {"axis": -1, "reduction": "max"}, opset=18, ranges={1: (-4, 4)}, name="int64 max"),
            Example((TensorInfo(f32, (2, 3, 4)), TensorInfo(i64, (4, 2, 3)), TensorInfo(f32, (4, 2, 3))),
                    {"reduction": "min"}, opset=18, ranges={1: (-2, 2)}, name="float32 3-D min"),
        ]


class Scatter(ScatterElements):
    """The deprecated Scatter (opsets 9 and 10): ScatterElements without a reduction."""

    op_type = "Scatter"
    since_opset = 9
    until_opset = 10
    attributes = (Attr("axis", "int", 0),)

    def examples(self):
        f32, i64 = np.dtype("float32"), np.dtype("int64")
        return [Example((TensorInfo(f32, (3, 4)), TensorInfo(i64, (3, 2)), TensorInfo(f32, (3, 2))),
                        {"axis": 1}, opset=10, ranges={1: _distinct_along(1, 4)})]


# ---------------------------------------------------------------------------------- ScatterND


def _index_tuples(sizes: tuple, distinct: bool):
    """An ``Example.ranges`` rule: ScatterND index tuples into dims of ``sizes``, some
    negative; ``distinct``: no tuple twice (so no two updates meet)."""

    def draw(rng, dtype, shape):
        count = int(np.prod(shape[:-1], dtype=np.int64))
        size = int(np.prod(sizes, dtype=np.int64))
        flat = rng.permutation(size)[:count] if distinct else rng.integers(0, size, count)
        tuples = np.stack(np.unravel_index(flat, sizes), axis=-1).reshape(shape)
        tuples = np.where(rng.random(shape) < 0.5, tuples - np.array(sizes), tuples)
        return tuples.astype(dtype)

    return draw


class ScatterND(ScatterOp):
    op_type = "ScatterND"
    since_opset = 11
    attributes = (Attr("reduction", "string", "none"),)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])
        super().check(node, inputs)

    def infer(self, node, inputs):
        data, indices, updates = inputs
        k = indices.shape[-1]
        if isinstance(k, int):
            if k > data.rank:
                raise ShapeError(f"{node.describe()}: index tuples of {k} entries for data of rank {data.rank}")
            want = tuple(indices.shape[:-1]) + tuple(data.shape[k:])
            if updates.rank != len(want) or any(_differ(u, w) for u, w in zip(updates.shape, want)):
                raise ShapeError(f"{node.describe()}: updates of shape {dims.format_shape(updates.shape)}, expected "
                                 f"{dims.format_shape(want)} (indices.shape[:-1] + data.shape[k:])")
        return [TensorInfo(data.dtype, data.shape)]

    def reference(self, node, inputs):
        data, indices, updates = inputs
        k = indices.shape[-1]
        tuples = np.asarray(indices).reshape(int(np.prod(indices.shape[:-1], dtype=np.int64)), k)
        offsets = np.zeros(len(tuples), np.int64)
        strides = c_strides(data.shape)
        for j in range(k):
            what = f"axis {j} of size {data.shape[j]}"
            offsets += _wrapped(node, tuples[:, j], data.shape[j], what) * strides[j]
        slice_size = int(np.prod(data.shape[k:], dtype=np.int64))
        targets = (offsets[:, None] + np.arange(slice_size, dtype=np.int64)[None, :]).reshape(-1)
        return [_apply(data.copy(), targets, np.asarray(updates).reshape(-1), self.reduction(node))]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        data, indices, _ = inputs
        return [scatter.scatter_nd_tactic(data.shape, indices.shape, self.reduction(node), data.dtype)]

    def examples(self):
        f32, f16, i64 = (np.dtype(t) for t in ("float32", "float16", "int64"))
        return [
            Example((TensorInfo(f32, (4, 3, 2)), TensorInfo(i64, (3, 1)), TensorInfo(f32, (3, 3, 2))),
                    ranges={1: _index_tuples((4,), True)}, name="float32 3-D slices"),
            Example((TensorInfo(f32, (5,)), TensorInfo(i64, (4, 1)), TensorInfo(f32, (4,))),
                    {"reduction": "add"}, ranges={1: _index_tuples((5,), False)}, name="float32 1-D add"),
            Example((TensorInfo(f16, (3, 4)), TensorInfo(i64, (2, 3, 2)), TensorInfo(f16, (2, 3))),
                    {"reduction": "mul"}, ranges={1: _index_tuples((3, 4), False)}, rtol=1e-3, atol=1e-3,
                    name="float16 elements mul"),
            Example((TensorInfo(f16, (3, 5)), TensorInfo(i64, (2, 1)), TensorInfo(f16, (2, 5))),
                    ranges={1: _index_tuples((3,), True)}, name="float16 rows"),
            Example((TensorInfo(i64, (2, 3, 4)), TensorInfo(i64, (3, 2)), TensorInfo(i64, (3, 4))),
                    {"reduction": "max"}, opset=18, ranges={1: _index_tuples((2, 3), False)}, name="int64 3-D max"),
            Example((TensorInfo(f32, (3, 4)), TensorInfo(i64, (5, 2)), TensorInfo(f32, (5,))),
                    {"reduction": "min"}, opset=18, ranges={1: _index_tuples((3, 4), False)}, name="float32 min"),
        ]


OPS = (ScatterElements, Scatter, ScatterND)
