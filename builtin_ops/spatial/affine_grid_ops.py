"""AffineGrid (opset 20): the sampling grid of an affine transform, what PyTorch's
``F.affine_grid`` exports to (spatial transformer networks, with ``GridSample`` after it).

``theta`` ``[N, 2, 3]`` (2-D) or ``[N, 3, 4]`` (3-D) maps each point of the base grid over
``size`` ``[N, C, H, W]`` (``[N, C, D, H, W]``), ``x`` along W, ``y`` along H (``z`` along
D), to ``grid[n, (d,) h, w] = theta[n] @ [x, y, (z,) 1]``. The base grid spans -1 to 1:
with ``align_corners`` its end points are the corners' centres (``-1 + 2 i / (W - 1)``, -1
for a size of 1), else the corners themselves (``(2 i + 1) / W - 1``). ``size`` must be
known where the engine is specialized (an initializer, a folded computation or a shape of
another tensor). ONNX defines the op as a function, whose body fails at batch 1 (a Squeeze
without axes); this plugin runs it as one kernel (:mod:`.affine_grid`).
"""

from __future__ import annotations

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import FLOAT_DTYPES, Attr, Example, OpPlugin, TensorInfo

_INT64 = np.dtype(np.int64)


def base_coordinates(size: int, align: int) -> np.ndarray:
    """The base grid's coordinates along an axis of ``size`` points, in float64."""
    i = np.arange(size, dtype=np.float64)
    if align:
        return -1.0 + 2.0 * i / (size - 1) if size > 1 else np.full(size, -1.0)
    return (2.0 * i + 1.0) / size - 1.0


class AffineGrid(OpPlugin):
    op_type = "AffineGrid"
    since_opset = 20
    attributes = (Attr("align_corners", "int", 0),)
    inputs = (2, 2)
    dtypes = FLOAT_DTYPES | {_INT64}

    def check(self, node, inputs):
        theta, size = inputs
        self.require_dtypes(node, inputs, FLOAT_DTYPES, which=[0])
        self.require_dtypes(node, inputs, {_INT64}, which=[1])
        if theta.rank != 3 or size.rank != 1:
            raise ModelError(f"{node.describe()}: theta is [N, 2, 3] or [N, 3, 4] and size 1-D; got ranks "
                             f"{theta.rank} and {size.rank}")
        rank = _rank(theta)
        if rank is None or (isinstance(size.shape[0], int) and size.shape[0] != rank + 2):
            raise ShapeError(f"{node.describe()}: theta of shape {list(theta.shape)} with size of {size.shape[0]} "
                             "values; give [N, 2, 3] with [N, C, H, W], or [N, 3, 4] with [N, C, D, H, W]")

    def infer(self, node, inputs):
        theta, size = inputs
        rank = _rank(theta)
        spatial = [f"{node.name}_d{1 + k}" for k in range(rank)]
        if size.value is not None:
            given = [int(v) for v in np.asarray(size.value).reshape(-1)]
            if min(given[2:], default=1) < 0 or (isinstance(theta.shape[0], int) and given[0] != theta.shape[0]):
                raise ShapeError(f"{node.describe()}: size {given} does not fit theta's batch {theta.shape[0]}")
            spatial = given[2:]
        return [TensorInfo(theta.dtype, (theta.shape[0], *spatial, rank))]

    def reference(self, node, inputs):
        theta, size = inputs
        rank = theta.shape[1]
        spatial = [int(v) for v in np.asarray(size).reshape(-1)[2:]]
        axes = [base_coordinates(n, node.attrs["align_corners"]) for n in spatial]  # D, H, W (or H, W)
        mesh = np.meshgrid(*axes, indexing="ij")
        points = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(mesh[0].size)])  # x, y, (z,) 1
        grid = np.matmul(np.asarray(theta, np.float64), points)  # [N, rank, points]
        return [np.swapaxes(grid, 1, 2).reshape(theta.shape[0], *spatial, rank).astype(theta.dtype)]

    def tactics(self, node, inputs, outputs):
        from .affine_grid import affine_grid_tactic

        if inputs[1].value is None:
            raise self.unsupported(node, "a size computed from data at run time",
                                   "give size as an initializer, a folded computation or a tensor's shape")
        return [affine_grid_tactic(inputs[0], outputs[0], _rank(inputs[0]), int(node.attrs["align_corners"]))]

    def examples(self):
        f16, f32, f64 = (np.dtype(t) for t in ("float16", "float32", "float64"))

        def size(*v):
            return np.array(v, np.int64)

        return [Example((TensorInfo(f32, (2, 2, 3)), size(2, 3, 4, 5)), {}),
                Example((TensorInfo(f32, (1, 2, 3)), size(1, 1, 3, 1)), {"align_corners": 1}),
                Example((TensorInfo(f64, (2, 3, 4)), size(2, 1, 2, 3, 4)), {"align_corners": 1}),
                Example((TensorInfo(f16, (1, 3, 4)), size(1, 2, 1, 2, 3)), {}, rtol=1e-2, atol=1e-2)]


def _rank(theta) -> int | None:
    """2 or 3 spatial dims, from theta's ``[N, 2, 3]`` or ``[N, 3, 4]``; ``None`` for neither."""
    dims = tuple(theta.shape[1:])
    return {(2, 3): 2, (3, 4): 3}.get(dims)


OPS = (AffineGrid,)
