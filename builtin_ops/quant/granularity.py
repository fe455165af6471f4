"""How a QuantizeLinear or DequantizeLinear node's scale applies to its input.

ONNX tells the three granularities apart by the scale's shape (the zero point has the
same shape): one element is per-tensor, a 1-D scale of ``x.shape[axis]`` values is
per-axis, and a scale of ``x``'s rank whose ``axis`` dim is ``ceil(x.shape[axis] /
block_size)`` is blocked. :func:`granularity` validates and names it; :func:`expand`
broadcasts a per-axis or blocked parameter to ``x``'s shape (the references), and
:func:`parameter_strides` gives the element strides the per-axis kernel reads it with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plugrt import ShapeError
from plugrt.plugin import dims

TENSOR, AXIS, BLOCKED = "tensor", "axis", "blocked"


@dataclass(frozen=True)
class Granularity:
    """``kind`` (:data:`TENSOR`, :data:`AXIS`, :data:`BLOCKED`), the normalized ``axis``
    (``None`` per tensor) and the ``block_size`` (blocked only)."""

    kind: str
    axis: int | None = None
    block_size: int = 0


def _size(shape) -> int | None:
    return int(np.prod(shape, dtype=np.int64)) if all(isinstance(d, int) for d in shape) else None


def granularity(node, x_shape, scale_shape, zero_point_shape=None) -> Granularity:
    """The node's granularity, or a :class:`ShapeError` naming what does not fit (a scale
    and zero point of one element each pass whatever their ranks, as exporters write them)."""
    block = int(node.attrs.get("block_size") or 0)
    rank = len(x_shape)
    one = _size(scale_shape) == 1 and zero_point_shape is not None and _size(zero_point_shape) == 1
    if zero_point_shape is not None and tuple(zero_point_shape) != tuple(scale_shape) and not one:
        raise ShapeError(f"{node.describe()}: the zero point's shape {dims.format_shape(zero_point_shape)} differs from "
                         f"the scale's {dims.format_shape(scale_shape)}; ONNX requires them equal")
    size = _size(scale_shape)
    if size is None:
        raise ShapeError(f"{node.describe()}: the scale's shape {dims.format_shape(scale_shape)} must be static")
    if block < 0:
        raise ShapeError(f"{node.describe()}: block_size must be >= 0, got {block}")
    if size == 1 and block == 0:
        return Granularity(TENSOR)
    axis = int(node.attrs.get("axis", 1))
    if not -rank <= axis < rank:
        raise ShapeError(f"{node.describe()}: axis={axis} is out of range for an input of rank {rank}")
    axis %= rank
    extent = x_shape[axis]
    if block == 0:
        if len(scale_shape) != 1:
            raise ShapeError(f"{node.describe()}: a scale of shape {dims.format_shape(scale_shape)} needs block_size "
                             "(blocked quantization); per-tensor scales have one element, per-axis ones are 1-D")
        if isinstance(extent, int) and extent != size:
            raise ShapeError(f"{node.describe()}: a per-axis scale of {size} values for axis {axis} of "
                             f"x{dims.format_shape(x_shape)} needs {extent}")
        return Granularity(AXIS, axis)
    if len(scale_shape) != rank:
        raise ShapeError(f"{node.describe()}: blocked quantization (block_size={block}) needs a scale of x's rank "
                         f"{rank}, got {dims.format_shape(scale_shape)}")
    for d, (x_dim, s_dim) in enumerate(zip(x_shape, scale_shape)):
        want = dims.derive(lambda n: -(-n // block), x_dim, label=f"ceildiv{block}") if d == axis else x_dim
        if isinstance(want, int) and want != s_dim:
            raise ShapeError(f"{node.describe()}: blocked quantization of x{dims.format_shape(x_shape)} along axis "
                             f"{axis} by blocks of {block} needs a scale of {want} along axis {d}, got "
                             f"{dims.format_shape(scale_shape)}")
    return Granularity(BLOCKED, axis, block)


def expand(value: np.ndarray, x_shape, g: Granularity) -> np.ndarray:
    """A per-tensor, per-axis or blocked parameter broadcastable to ``x_shape``."""
    value = np.asarray(value)
    if g.kind == TENSOR:
        return value.reshape(())
    if g.kind == AXIS:
        shape = [1] * len(x_shape)
        shape[g.axis] = value.size
        return value.reshape(shape)
    return np.repeat(value, g.block_size, axis=g.axis).take(range(x_shape[g.axis]), axis=g.axis)


def parameter_strides(x_shape, g: Granularity) -> np.ndarray:
    """``[n, dim, inner, block, outer stride, block stride, inner stride]`` (int64): the
    element ``i`` of ``x`` reads its parameter at ``(i // (dim * inner)) * outer stride +
    ((i // inner) % dim // block) * block stride + (i % inner) * inner stride``."""
    x_shape = tuple(int(d) for d in x_shape)
    n = _size(x_shape)
    if g.kind == TENSOR:
        return np.asarray([n, 1, 1, 1, 0, 0, 0], np.int64)
    dim = x_shape[g.axis]
    inner = _size(x_shape[g.axis + 1:])
    if g.kind == AXIS:
        return np.asarray([n, dim, inner, 1, 0, 1, 0], np.int64)
    blocks = -(-dim // g.block_size)
    return np.asarray([n, dim, inner, g.block_size, blocks * inner, inner, 1], np.int64)
