"""RoiAlign (opset 10; 16 adds ``coordinate_transformation_mode``), as ONNX's reference
(and onnxruntime) computes it.

Each region of interest ``(x1, y1, x2, y2)``, scaled by ``spatial_scale`` (and shifted by
half a pixel with ``half_pixel``, the default from opset 16; opset 10 computes as
``output_half_pixel``), is cut into ``output_height x output_width`` bins; each bin
samples a ``sampling_ratio``-square grid of points (``sampling_ratio=0``: adaptive, the
ceiling of the bin's size), each point bilinearly interpolated, and averages them
(``avg``) or keeps their maximum (``max``: of the four weighted corner values of each
point, which is onnxruntime's definition). A point more than a pixel outside the map reads
0. The CUDA kernel is in :mod:`.roi_align`.

float16 and float32 compute in float32 (ONNX's reference computes float16 in float16),
float64 in float64.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ModelError
from plugrt.plugin import FLOAT_DTYPES, Attr, Example, OpPlugin, TensorInfo

_INT64 = np.dtype(np.int64)
_COORDINATE_MODES = ("half_pixel", "output_half_pixel")
_MODES = ("avg", "max")


def compute_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def bin_grid(roi_size, pooled: int, sampling_ratio: int) -> int:
    """Sample points per bin along one axis: the ratio, or (0) the bin's size rounded up."""
    if sampling_ratio > 0:
        return int(sampling_ratio)
    return int(math.ceil(roi_size / roi_size.dtype.type(pooled)))


def _corners(image, y, x):
    """The four corners ``[(weight, values)]`` of bilinear samples at ``y`` (column) x ``x``
    (row) of ``image`` (C, H, W); points beyond the map get weight 0 at pixel (0, 0)."""
    f = y.dtype.type
    height, width = image.shape[1:]
    outside = (y < f(-1)) | (y > f(height)) | (x < f(-1)) | (x > f(width))
    y, x = np.maximum(y, f(0)), np.maximum(x, f(0))
    lows, highs, fractions = [], [], []
    for v, size in ((y, height), (x, width)):
        low = v.astype(np.int64)
        last = low >= size - 1
        low = np.where(last, size - 1, low)
        high = np.where(last, size - 1, low + 1)
        fractions.append(np.where(last, f(0), v - low.astype(v.dtype)))
        lows.append(low)
        highs.append(high)
    (ly, lx), (y_low, x_low), (y_high, x_high) = fractions, lows, highs
    hy, hx = f(1) - ly, f(1) - lx
    corners = []
    for w, yi, xi in ((hy * hx, y_low, x_low), (hy * lx, y_low, x_high), (ly * hx, y_high, x_low),
                      (ly * lx, y_high, x_high)):
        w = np.where(outside, f(0), w)
        yi, xi = np.broadcast_arrays(np.where(outside, 0, yi), np.where(outside, 0, xi))
        corners.append((w, image[:, yi, xi]))
    return corners


def roi_align(x, rois, batch_indices, *, mode: str, half_pixel: bool, output_height: int, output_width: int,
              sampling_ratio: int, spatial_scale: float) -> np.ndarray:
    """Y (num_rois, C, output_height, output_width) of RoiAlign."""
    ct = compute_dtype(x.dtype)
    f = ct.type
    n_rois, channels = rois.shape[0], x.shape[1]
    y = np.zeros((n_rois, channels, output_height, output_width), ct)
    offset = f(0.5) if half_pixel else f(0)
    ph = np.arange(output_height, dtype=ct)[:, None]
    pw = np.arange(output_width, dtype=ct)[None, :]
    for r in range(n_rois):
        batch = int(batch_indices[r])
        if not 0 <= batch < x.shape[0]:
            raise ValueError(f"batch index {batch} of roi {r} is outside the batch of {x.shape[0]}")
        start_w, start_h, end_w, end_h = (rois[r].astype(ct) * f(spatial_scale) - offset)
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half_pixel:  # malformed ROIs become 1x1
            roi_w, roi_h = max(roi_w, f(1)), max(roi_h, f(1))
        bin_h, bin_w = roi_h / f(output_height), roi_w / f(output_width)
        grid_h = bin_grid(roi_h, output_height, sampling_ratio)
        grid_w = bin_grid(roi_w, output_width, sampling_ratio)
        image = x[batch].astype(ct)
        total = None
        for iy in range(grid_h):
            yy = start_h + ph * bin_h + (f(iy) + f(0.5)) * bin_h / f(grid_h)
            for ix in range(grid_w):
                xx = start_w + pw * bin_w + (f(ix) + f(0.5)) * bin_w / f(grid_w)
                corners = _corners(image, yy, xx)
                if mode == "avg":
                    (w1, v1), (w2, v2), (w3, v3), (w4, v4) = corners
                    value = w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4
                    total = value if total is None else total + value
                else:
                    value = np.maximum.reduce([w * v for w, v in corners])
                    total = value if total is None else np.maximum(total, value)
        if total is not None:
            y[r] = total / f(max(grid_h * grid_w, 1)) if mode == "avg" else total
    return y.astype(x.dtype)


class RoiAlign(OpPlugin):
    """Y (num_rois, C, output_height, output_width) pooled from X (N, C, H, W) over
    ``rois`` (num_rois, 4) of images ``batch_indices`` (num_rois,)."""

    op_type = "RoiAlign"
    since_opset = 10
    attributes = (Attr("coordinate_transformation_mode", "string", None), Attr("mode", "string", "avg"),
                  Attr("output_height", "int", 1), Attr("output_width", "int", 1),
                  Attr("sampling_ratio", "int", 0), Attr("spatial_scale", "float", 1.0))
    inputs = (3, 3)
    dtypes = FLOAT_DTYPES | {_INT64}

    def half_pixel(self, node) -> bool:
        given = node.attrs["coordinate_transformation_mode"]
        if node.opset < 16:
            return False
        return (given or "half_pixel") == "half_pixel"

    def settings(self, node) -> dict:
        """The keyword arguments of :func:`roi_align` for this node."""
        a = node.attrs
        return {"mode": a["mode"], "half_pixel": self.half_pixel(node), "output_height": a["output_height"],
                "output_width": a["output_width"], "sampling_ratio": a["sampling_ratio"],
                "spatial_scale": a["spatial_scale"]}

    def check(self, node, inputs):
        x, rois, batch_indices = inputs
        a = node.attrs
        if node.opset < 16 and a["coordinate_transformation_mode"] is not None:
            raise self.unsupported(node, f"coordinate_transformation_mode at opset {node.opset}",
                                   "it exists from opset 16; import the model at opset 16+")
        given = a["coordinate_transformation_mode"] or "half_pixel"
        if given not in _COORDINATE_MODES:
            raise self.unsupported(node, f"coordinate_transformation_mode={given!r}",
                                   f"use one of {', '.join(_COORDINATE_MODES)}")
        if a["mode"] not in _MODES:
            raise self.unsupported(node, f"mode={a['mode']!r}", f"use one of {', '.join(_MODES)}")
        self.require_dtypes(node, inputs, FLOAT_DTYPES, which=[0, 1])
        self.require_dtypes(node, inputs, {_INT64}, which=[2])
        if x.dtype != rois.dtype:
            raise ModelError(f"{node.describe()}: X is {x.dtype} and rois {rois.dtype}; they share one type")
        if x.rank != 4 or rois.rank != 2 or batch_indices.rank != 1:
            raise ModelError(f"{node.describe()}: X (N, C, H, W), rois (num_rois, 4) and batch_indices "
                             f"(num_rois,) have ranks 4, 2, 1; got {x.rank}, {rois.rank}, {batch_indices.rank}")
        if isinstance(rois.shape[1], int) and rois.shape[1] != 4:
            raise ModelError(f"{node.describe()}: rois is (num_rois, 4), got {list(rois.shape)}")
        for name in ("output_height", "output_width"):
            if a[name] < 1:
                raise ModelError(f"{node.describe()}: {name}={a[name]}; it must be 1 or more")
        if a["sampling_ratio"] < 0:
            raise ModelError(f"{node.describe()}: sampling_ratio={a['sampling_ratio']}; use 0 (adaptive) or more")

    def infer(self, node, inputs):
        x, rois, _ = inputs
        a = node.attrs
        return [TensorInfo(x.dtype, (rois.shape[0], x.shape[1], a["output_height"], a["output_width"]))]

    def reference(self, node, inputs):
        x, rois, batch_indices = inputs
        return [roi_align(x, rois, batch_indices, **self.settings(node))]

    def tactics(self, node, inputs, outputs):
        from .roi_align import roi_align_tactic

        return [roi_align_tactic(inputs[0], outputs[0], self.settings(node))]

    def examples(self):
        f16, f32, f64 = (np.dtype(t) for t in ("float16", "float32", "float64"))
        i64 = _INT64
        boxes = {1: (-1.0, 6.0), 2: (0, 2)}  # corners partly outside a 5x6 map, two images
        return [Example((TensorInfo(f32, (2, 3, 5, 6)), TensorInfo(f32, (4, 4)), TensorInfo(i64, (4,))),
                        {"output_height": 2, "output_width": 3}, opset=16, ranges=boxes, rtol=1e-4, atol=1e-5),
                Example((TensorInfo(f32, (2, 2, 5, 6)), TensorInfo(f32, (3, 4)), TensorInfo(i64, (3,))),
                        {"mode": "max", "sampling_ratio": 2, "coordinate_transformation_mode": "output_half_pixel",
                         "output_height": 3, "output_width": 2, "spatial_scale": 0.5}, opset=16, ranges=boxes,
                        rtol=1e-4, atol=1e-5),
                Example((TensorInfo(f16, (2, 2, 5, 6)), TensorInfo(f16, (2, 4)), TensorInfo(i64, (2,))),
                        {"output_height": 2, "output_width": 2}, opset=10, ranges=boxes, rtol=1e-2, atol=1e-2),
                Example((TensorInfo(f64, (2, 2, 5, 6)), TensorInfo(f64, (3, 4)), TensorInfo(i64, (3,))),
                        {"output_height": 2, "output_width": 2, "sampling_ratio": 3}, opset=22, ranges=boxes)]


OPS = (RoiAlign,)
