"""Data movement steered by a runtime integer tensor: GatherND (index tuples into the
data's leading axes) and ReverseSequence (a length per batch entry). Their kernels are
in :mod:`.copies`.

The references refuse an index or a length out of range (a :class:`~plugrt.ModelError`
naming the node); the kernels, like Gather's, wrap negative indices and clamp what is
still out of range (a length into ``[0, max_time]``), so bad data reads a wrong element
of the input, never foreign memory.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import Attr, Example, TensorInfo, dims

from . import copies
from .ops import MoveOp, concrete_shapes, require_int


def _unify(a, b):
    """One dim for two that must be equal: the concrete one if either is."""
    return a if isinstance(a, int) else b


def _differ(a, b) -> bool:
    """Whether two dims are known to differ (both concrete)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


# ---------------------------------------------------------------------------------- GatherND


def _index_tuples(sizes: tuple):
    """An ``Example.ranges`` rule: GatherND index tuples (the last axis) into dims of
    ``sizes``, about half of them negative."""

    def draw(rng, dtype, shape):
        high = np.broadcast_to(np.array(sizes, np.int64), shape)
        picks = rng.integers(0, high)
        picks = np.where(rng.random(shape) < 0.5, picks - high, picks)
        return picks.astype(dtype)

    return draw


class GatherND(MoveOp):
    """``out[b..., t..., s...] = data[b..., indices[b..., t..., :], s...]``: each index tuple
    (the last axis of ``indices``, ``k`` entries) picks a slice of ``data`` after the
    ``batch_dims`` leading axes the two share (``batch_dims`` from opset 12). The output is
    ``indices.shape[:-1] + data.shape[batch_dims + k:]``; negative indices count from the
    end of their axis."""

    op_type = "GatherND"
    since_opset = 11
    attributes = (Attr("batch_dims", "int", 0),)
    inputs = (2, 2)

    def _batch_dims(self, node) -> int:
        batch_dims = node.attrs["batch_dims"]
        if node.opset < 12 and batch_dims != 0:
            raise ModelError(f"{node.describe()}: batch_dims={batch_dims} at opset {node.opset}; the attribute "
                             "exists from opset 12 (import the model at opset 12 or later)")
        return batch_dims

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])
        data, indices = inputs
        batch_dims = self._batch_dims(node)
        if data.rank < 1 or indices.rank < 1:
            raise ShapeError(f"{node.describe()}: data and indices must have rank 1 or more "
                             f"(got {data.rank} and {indices.rank})")
        if not 0 <= batch_dims < min(data.rank, indices.rank):
            raise ShapeError(f"{node.describe()}: batch_dims={batch_dims} must be in [0, {min(data.rank, indices.rank)}) "
                             f"for data of rank {data.rank} and indices of rank {indices.rank}")
        k = indices.shape[-1]
        if not isinstance(k, int):
            raise self.unsupported(node, f"indices of shape {dims.format_shape(indices.shape)} (a symbolic last dim)",
                                   "the index tuples' length (indices' last dim) decides the output's rank; "
                                   "make it static")
        if not 1 <= k <= data.rank - batch_dims:
            raise ShapeError(f"{node.describe()}: index tuples of {k} entries (indices' last dim) for data of rank "
                             f"{data.rank} with batch_dims={batch_dims}; the tuples must have 1 to "
                             f"{data.rank - batch_dims} entries")
        for axis in range(batch_dims):
            if _differ(data.shape[axis], indices.shape[axis]):
                raise ShapeError(f"{node.describe()}: data {dims.format_shape(data.shape)} and indices "
                                 f"{dims.format_shape(indices.shape)} differ at batch axis {axis}")

    def infer(self, node, inputs):
        data, indices = inputs
        b, k = self._batch_dims(node), indices.shape[-1]
        batch = tuple(_unify(d, i) for d, i in zip(data.shape[:b], indices.shape[:b]))
        return [TensorInfo(data.dtype, batch + tuple(indices.shape[b:-1]) + tuple(data.shape[b + k:]))]

    def reference(self, node, inputs):
        data, indices = inputs
        b, k = self._batch_dims(node), indices.shape[-1]
        batch = math.prod(data.shape[:b])
        count = math.prod(indices.shape[b:-1])
        blocks = data.reshape((batch,) + data.shape[b:])
        tuples = np.asarray(indices, dtype=np.int64).reshape(batch, count, k)
        picks = [np.arange(batch).reshape(batch, 1)]
        for j in range(k):
            dim = data.shape[b + j]
            column = tuples[:, :, j]
            bad = (column < -dim) | (column >= dim)
            if bad.any():
                raise ModelError(f"{node.describe()}: index {int(column[bad][0])} is out of range [-{dim}, {dim - 1}] "
                                 f"for axis {b + j} of size {dim}; indices must lie in range (negative ones count "
                                 "from the end)")
            picks.append(np.where(column < 0, column + dim, column))
        out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
        return [np.ascontiguousarray(blocks[tuple(picks)]).reshape(out_shape)]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        data, indices = inputs
        return [copies.gather_nd_tactic(data.shape, indices.shape, self._batch_dims(node))]

    def examples(self):
        f32, f16, i64 = (np.dtype(t) for t in ("float32", "float16", "int64"))
        return [
            Example((TensorInfo(f32, (4, 3, 2)), TensorInfo(i64, (3, 1))), ranges={1: _index_tuples((4,))},
                    name="float32 slices"),
            Example((TensorInfo(f16, (3, 5)), TensorInfo(i64, (2, 2, 2))), ranges={1: _index_tuples((3, 5))},
                    name="float16 elements"),
            Example((TensorInfo(i64, (2, 3, 4)), TensorInfo(i64, (2, 3, 1))), {"batch_dims": 1},
                    ranges={1: _index_tuples((3,))}, name="int64 batch_dims=1"),
            Example((TensorInfo(f32, (2, 3, 4, 2)), TensorInfo(i64, (2, 3, 5, 1))), {"batch_dims": 2},
                    ranges={1: _index_tuples((4,))}, name="float32 batch_dims=2"),
        ]



# ---------------------------------------------------------------------------------- ReverseSequence


class ReverseSequence(MoveOp):
    """For each index ``b`` of ``batch_axis``, the first ``sequence_lens[b]`` elements along
    ``time_axis`` in reverse order, the rest as they were. The two axes are 0 and 1 in
    either order; ``sequence_lens`` is int64 of shape ``[batch]``, each in ``[0, max_time]``."""

    op_type = "ReverseSequence"
    since_opset = 10
    attributes = (Attr("batch_axis", "int", 1), Attr("time_axis", "int", 0))
    inputs = (2, 2)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])
        x, lens = inputs
        batch_axis, time_axis = node.attrs["batch_axis"], node.attrs["time_axis"]
        if {batch_axis, time_axis} != {0, 1}:
            raise ShapeError(f"{node.describe()}: batch_axis={batch_axis} and time_axis={time_axis}; "
                             "they must be 0 and 1, in either order")
        if x.rank < 2:
            raise ShapeError(f"{node.describe()}: the input must have rank 2 or more, got {x.rank}")
        if lens.rank != 1 or _differ(lens.shape[0], x.shape[batch_axis]):
            raise ShapeError(f"{node.describe()}: sequence_lens of shape {dims.format_shape(lens.shape)} for an "
                             f"input of shape {dims.format_shape(x.shape)}; it needs one length per index of "
                             f"batch_axis {batch_axis}")

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def reference(self, node, inputs):
        x, lens = inputs
        batch_axis, time_axis = node.attrs["batch_axis"], node.attrs["time_axis"]
        max_time = x.shape[time_axis]
        bad = (lens < 0) | (lens > max_time)
        if bad.any():
            raise ModelError(f"{node.describe()}: sequence length {int(lens[bad][0])} is out of range "
                             f"[0, {max_time}] (the time axis' size); give each batch entry a length in range")
        out = np.array(x)
        for b, length in enumerate(lens.tolist()):
            at = [slice(None)] * x.ndim
            at[batch_axis], at[time_axis] = b, slice(0, length)
            out[tuple(at)] = np.flip(x[tuple(at)], axis=0)  # time is the first axis left once batch is taken
        return [out]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [copies.reverse_sequence_tactic(inputs[0].shape, node.attrs["batch_axis"])]

    def examples(self):
        f32, f16, i64 = (np.dtype(t) for t in ("float32", "float16", "int64"))
        return [
            Example((TensorInfo(f32, (5, 3)), TensorInfo(i64, (3,))), ranges={1: (0, 6)}, name="float32 time-major"),
            Example((TensorInfo(f16, (3, 4, 2)), TensorInfo(i64, (3,))), {"batch_axis": 0, "time_axis": 1},
                    ranges={1: (0, 5)}, name="float16 batch-major"),
            Example((TensorInfo(i64, (4, 2, 3, 2)), TensorInfo(i64, (2,))), ranges={1: (0, 5)},
                    name="int64 4-D time-major"),
        ]


OPS = (GatherND, ReverseSequence)
