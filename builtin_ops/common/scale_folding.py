"""What the anchors that fold a per-channel scale into their weights (Conv, MatMul, Gemm;
see ``OpPlugin.fold_scale``) share: reading that scale as one vector along an axis."""

from __future__ import annotations

import numpy as np


def vector_along(values: np.ndarray, shape: tuple, axis: int) -> np.ndarray | None:
    """``values``, which broadcast against ``shape``, as a float64 vector along ``axis``.

    Returns ``None`` when the values vary along another axis, or would enlarge ``shape``
    (a longer rank, or a dim that is not 1 and not the output's). Used by anchors folding a
    per-channel scale into their weights: ``shape[axis]`` must be a concrete int.
    """
    array = np.asarray(values, dtype=np.float64)
    rank, size = len(shape), shape[axis]
    if array.ndim > rank or not isinstance(size, int):
        return None
    array = array.reshape((1,) * (rank - array.ndim) + array.shape)
    axis %= rank
    for i, dim in enumerate(array.shape):
        if dim == 1:
            continue
        if dim != shape[i]:
            return None
        if i != axis:
            first = array.take([0], axis=i)
            if not np.array_equal(array, np.broadcast_to(first, array.shape), equal_nan=True):
                return None
            array = first
    return np.broadcast_to(array.reshape(-1), (size,)).copy()
