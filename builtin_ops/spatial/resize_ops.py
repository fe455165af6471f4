"""Resampling: Resize and Upsample.

Resize is computed separably, one axis at a time: per axis, each output position gets
a source coordinate (the coordinate transformation mode), then either a nearest index
or a small window of input indices and kernel weights (linear, cubic, antialiased),
applied with ``np.take`` over the whole tensor (the CUDA tactic is in :mod:`.resize`).
"""

from __future__ import annotations

import math

import numpy as np

from plugrt.plugin import ALL_DTYPES, Attr, OpPlugin, TensorInfo, dims, optional

from . import resize

def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _source_coords(ctm, n_out, n_in, scale, length, roi):
    """Source coordinate of each output index along one axis, computed in float32.

    ``length`` is the output length the scale implies (fractional when computed from a
    scale factor), as the ONNX reference uses it. Float32 arithmetic, as onnxruntime
    does, settles exact ties (nearest rounding) the same way a float32 kernel does.
    """
    f = np.float32
    y, scale, n_in, length = np.arange(n_out, dtype=f), f(scale), f(n_in), f(length)
    if ctm == "half_pixel":
        return (y + f(0.5)) / scale - f(0.5)
    if ctm == "half_pixel_symmetric":
        offset = n_in / f(2) * (f(1) - f(n_out) / (scale * n_in))
        return offset + (y + f(0.5)) / scale - f(0.5)
    if ctm == "pytorch_half_pixel":
        return (y + f(0.5)) / scale - f(0.5) if n_out > 1 else np.zeros(n_out, f)
    if ctm == "align_corners":
        return y * (n_in - f(1)) / (length - f(1)) if length != 1 else np.zeros(n_out, f)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "tf_half_pixel_for_nn":
        return (y + f(0.5)) / scale
    if ctm == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if length == 1:
            return np.full(n_out, f(0.5) * (start + end) * (n_in - f(1)), f)
        return start * (n_in - f(1)) + y * (end - start) * (n_in - f(1)) / (length - f(1))
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _nearest_index(x, mode, scale):
    if mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    if mode == "simple":  # Upsample and Resize-10: ceil when downsampling, else floor
        return np.ceil(x) if scale < 1 else np.floor(x)
    raise ValueError(f"unknown nearest_mode {mode!r}")


def _window(x, mode, scale, attrs):
    """Input indices (out, k) and weights (out, k) of a linear or cubic kernel."""
    base = np.ceil(x) - 1  # ratio in (0, 1], as the ONNX reference counts it
    ratio = x - base
    s = min(scale, 1.0) if attrs["antialias"] else 1.0
    support = 1.0 if mode == "linear" else 2.0
    start = math.floor(-support / s) + 1
    offsets = np.arange(start, 2 - start, dtype=np.float64)
    d = (offsets[None, :] - ratio[:, None]) * s
    if mode == "linear":
        w = np.clip(1 - np.abs(d), 0, 1)
    else:
        w = _cubic_kernel(d, attrs["cubic_coeff_a"])
    if attrs["antialias"]:
        w = w / w.sum(axis=1, keepdims=True)
    return (base[:, None] + offsets[None, :]).astype(np.int64), w


def axis_taps(n_in, n_out, scale, length, roi, attrs, nearest_mode):
    """One axis's resampling as data: input indices ``idx[n_out, k]`` (clipped into the
    input), their weights ``w[n_out, k]`` (``None`` for nearest, where ``k`` is 1) and the
    tf_crop_and_resize ``outside[n_out]`` mask (``None`` for other modes)."""
    mode, ctm = attrs["mode"], attrs["coordinate_transformation_mode"]
    x = _source_coords(ctm, n_out, n_in, scale, length, roi).astype(np.float64)
    if mode == "nearest":
        idx = np.clip(_nearest_index(x, nearest_mode, scale), 0, n_in - 1).astype(np.intp)[:, None]
        w = None
    else:
        idx, w = _window(x, mode, scale, attrs)
        if attrs["exclude_outside"]:
            w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        idx = np.clip(idx, 0, n_in - 1).astype(np.intp)
    outside = (x < 0) | (x > n_in - 1) if ctm == "tf_crop_and_resize" else None
    return idx, w, outside


def resize_axis(data, axis, n_out, scale, length, roi, attrs, nearest_mode):
    """Resample ``data`` along one axis to ``n_out`` samples."""
    idx, w, outside = axis_taps(data.shape[axis], n_out, scale, length, roi, attrs, nearest_mode)
    bshape = (1,) * axis + (n_out,) + (1,) * (data.ndim - axis - 1)
    if w is None:
        out = np.take(data, idx[:, 0], axis=axis)
    else:
        out = sum(np.take(data, idx[:, k], axis=axis) * w[:, k].reshape(bshape) for k in range(idx.shape[1]))
    if outside is not None:
        fill = attrs["extrapolation_value"]
        fill = _cast_result(np.array(fill), out.dtype) if w is None else fill
        out = np.where(outside.reshape(bshape), fill, out)
    return out


def _cast_result(y, dtype):
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(y), info.min, info.max).astype(dtype)
    return y.astype(dtype)


def _present(array):
    return array is not None and np.size(array) > 0


def _floor_scaled(n, scale) -> int:
    """floor(n * scale), exactly (in float64, as ONNX shape inference and reference do)."""
    return int(math.floor(n * float(scale)))


class Resize(OpPlugin):
    """Resize-10 to 19+ (opset 10: ``X, scales`` with asymmetric coordinates)."""

    op_type = "Resize"
    since_opset = 10
    attributes = (
        Attr("mode", "string", "nearest"),
        Attr("coordinate_transformation_mode", "string", "half_pixel"),
        Attr("nearest_mode", "string", "round_prefer_floor"),
        Attr("cubic_coeff_a", "float", -0.75),
        Attr("exclude_outside", "int", 0),
        Attr("extrapolation_value", "float", 0.0),
        Attr("antialias", "int", 0),
        Attr("axes", "ints", None),
        Attr("keep_aspect_ratio_policy", "string", "stretch"),
    )
    inputs = (1, 4)
    dtypes = ALL_DTYPES

    def check(self, node, inputs):
        a, opset = node.attrs, node.opset
        modes = ("nearest", "linear") if opset < 11 else ("nearest", "linear", "cubic")
        ctms = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"]
        ctms += ["tf_half_pixel_for_nn"] if opset < 13 else []
        ctms += ["half_pixel_symmetric"] if opset >= 19 else []
        checks = [("mode", modes), ("coordinate_transformation_mode", ctms),
                  ("nearest_mode", ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")),
                  ("keep_aspect_ratio_policy", ("stretch", "not_larger", "not_smaller"))]
        for name, allowed in checks if opset >= 11 else checks[:1]:
            if a[name] not in allowed:
                raise self.unsupported(node, f"{name}={a[name]!r}", f"use one of {', '.join(allowed)}")
        if inputs[0].dtype == np.bool_ and a["mode"] != "nearest":
            raise self.unsupported(node, f"mode={a['mode']!r} on bool input", "use mode 'nearest'")
        if opset < 11 and len(inputs) != 2:
            raise ValueError("Resize-10 takes exactly the inputs X and scales")

    # The plan: per axis, the output length and the scale and length the coordinates use.
    def _plan(self, node, shape, roi, scales, sizes):
        a, rank = node.attrs, len(shape)
        axes = list(range(rank)) if node.opset < 18 or a["axes"] is None else \
            [int(v) + rank if v < 0 else int(v) for v in a["axes"]]
        if _present(scales) and _present(sizes):
            raise ValueError("only one of scales and sizes may be given")
        if not _present(scales) and not _present(sizes):
            raise ValueError("one of scales and sizes must be given")
        full_roi = [(0.0, 1.0)] * rank
        if _present(roi) and a["coordinate_transformation_mode"] == "tf_crop_and_resize":
            roi = np.asarray(roi, dtype=np.float64).reshape(-1)
            for i, axis in enumerate(axes):
                full_roi[axis] = (float(roi[i]), float(roi[i + len(axes)]))
        plan = [(d, 1.0, d) for d in shape]  # (n_out, scale, length)
        if _present(scales):
            scales = np.asarray(scales).reshape(-1)
            for i, axis in enumerate(axes):
                s, n_in = float(scales[i]), shape[axis]
                if not isinstance(n_in, int):  # symbolic (inference only)
                    plan[axis] = (n_in if s == 1 else None, s, None)
                    continue
                plan[axis] = (n_in if s == 1 else _floor_scaled(n_in, scales[i]), s, s * n_in)
            return plan, full_roi
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        policy = a["keep_aspect_ratio_policy"] if node.opset >= 18 else "stretch"
        if policy == "stretch":
            for i, axis in enumerate(axes):
                n_in = shape[axis]
                scale = sizes[i] / n_in if isinstance(n_in, int) and n_in else 1.0
                plan[axis] = (sizes[i], scale, sizes[i])
            return plan, full_roi
        ratios = [sizes[i] / shape[axis] for i, axis in enumerate(axes)]
        s = min(ratios) if policy == "not_larger" else max(ratios)
        for axis in axes:
            plan[axis] = (int(math.floor(s * shape[axis] + 0.5)), s, s * shape[axis])
        return plan, full_roi

    def _split(self, node, values):
        if node.opset < 11:
            return None, values[1], None
        return optional(values, 1), optional(values, 2), optional(values, 3)

    def infer(self, node, inputs):
        x = inputs[0]
        roi, scales, sizes = self._split(node, inputs)
        known = [None if i is None else i.value if i.value is not None else
                 (np.zeros(0) if i.is_static and 0 in i.shape else "unknown") for i in (roi, scales, sizes)]
        rank, a = x.rank, node.attrs
        axes = set(range(rank)) if node.opset < 18 or a["axes"] is None else \
            {int(v) % rank for v in a["axes"]}
        fresh = [f"{node.name}_d{i}" if i in axes else d for i, d in enumerate(x.shape)]
        if any(isinstance(k, str) for k in known[1:]):
            return [TensorInfo(x.dtype, tuple(fresh))]
        _, scales, sizes = known
        if _present(scales):
            plan, _ = self._plan(node, x.shape, None, scales, None)
            out = [n if n is not None else dims.mul(x.shape[i], int(s)) if s.is_integer() else fresh[i]
                   for i, (n, s, _) in enumerate(plan)]
            return [TensorInfo(x.dtype, tuple(out))]
        symbolic = any(not isinstance(x.shape[i], int) for i in axes)
        if symbolic and node.opset >= 18 and a["keep_aspect_ratio_policy"] != "stretch":
            return [TensorInfo(x.dtype, tuple(fresh))]
        plan, _ = self._plan(node, x.shape, None, None, sizes)
        return [TensorInfo(x.dtype, tuple(n for n, _, _ in plan))]

    def settings(self, node, shape, values):
        """``(plan, roi, attrs, nearest_mode)`` of :func:`resample` for input values."""
        roi, scales, sizes = self._split(node, values)
        plan, full_roi = self._plan(node, shape, roi, scales, sizes)
        attrs = dict(node.attrs)
        nearest_mode = attrs["nearest_mode"]
        if node.opset < 11:
            attrs.update(coordinate_transformation_mode="asymmetric", antialias=0, exclude_outside=0)
            nearest_mode = "simple"
        if node.opset < 18:
            attrs["antialias"] = 0
        return plan, full_roi, attrs, nearest_mode

    def reference(self, node, inputs):
        x = inputs[0]
        return [resample(x, *self.settings(node, x.shape, inputs))]

    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        roi, scales, sizes = self._split(node, inputs)
        ctm = node.attrs["coordinate_transformation_mode"] if node.opset >= 11 else "asymmetric"
        values = [None]
        for name, info in (("roi", roi), ("scales", scales), ("sizes", sizes)):
            if info is None or info.value is not None or 0 in info.shape:
                values.append(None if info is None else info.value if info.value is not None else np.zeros(0))
            elif name == "roi" and ctm != "tf_crop_and_resize":
                values.append(None)  # only tf_crop_and_resize reads it
            else:
                raise self.unsupported(node, f"a {name} input not known at build time",
                                       "make it an initializer or computable from constants")
        if node.opset < 11:
            values = [None, values[2]]
        settings = self.settings(node, tuple(int(d) for d in x.shape), values)
        return [_tactic(self, node, x, outputs[0], values, *settings)]


def _tactic(op, node, x: TensorInfo, y: TensorInfo, values, plan, roi, attrs, nearest_mode):
    """The CUDA tactic of a Resize or Upsample node whose scales/sizes/roi are ``values``."""
    shape = tuple(int(d) for d in x.shape)
    nearest = attrs["mode"] == "nearest"
    fill = attrs["extrapolation_value"]
    if nearest:
        fill = _cast_result(np.array(fill), x.dtype)
    if 0 in shape:  # the output does not depend on the (empty) input: precompute it
        constant = op.reference(node, [np.zeros(shape, x.dtype), *values[1:]])[0]
        return resize.resize_tactic(x, y, None, nearest, fill, constant)
    tables = resample_tables(shape, plan, roi, attrs, nearest_mode)
    return resize.resize_tactic(x, y, tables, nearest, fill)


def _unchanged(n_in, n_out, scale, roi) -> bool:
    """Whether ``resample`` leaves an axis as it is."""
    return n_out == n_in and scale == 1.0 and roi == (0.0, 1.0)


def resample_tables(shape, plan, roi, attrs, nearest_mode):
    """:func:`axis_taps` of every axis of a non-empty input, as :func:`resample` applies
    them (an unchanged axis gets the identity: one tap of weight 1, never outside)."""
    tables = []
    for axis, (n_out, scale, length) in enumerate(plan):
        n_in = shape[axis]
        if _unchanged(n_in, n_out, scale, roi[axis]):
            w = None if attrs["mode"] == "nearest" else np.ones((n_in, 1))
            tables.append((np.arange(n_in, dtype=np.intp)[:, None], w, None))
        else:
            tables.append(axis_taps(n_in, n_out, scale, length, roi[axis], attrs, nearest_mode))
    return tables


def resample(x, plan, roi, attrs, nearest_mode):
    """Resize ``x`` per ``plan`` = [(n_out, scale, length)] per axis."""
    nearest = attrs["mode"] == "nearest"
    y = x if nearest else x.astype(np.float64)
    for axis, (n_out, scale, length) in enumerate(plan):
        if _unchanged(x.shape[axis], n_out, scale, roi[axis]):
            continue
        if n_out == 0 or x.shape[axis] == 0:
            shape = list(y.shape)
            shape[axis] = n_out
            y = np.zeros(shape, dtype=y.dtype)
            continue
        y = resize_axis(y, axis, n_out, scale, length, roi[axis], attrs, nearest_mode)
    if nearest:
        return y.copy() if y is x else y
    return _cast_result(y, x.dtype)


# ----------------------------------------------------------------------- Upsample


class Upsample(OpPlugin):
    """Upsample-7 (``scales`` attribute) and -9 (``scales`` input): asymmetric coordinates."""

    op_type = "Upsample"
    since_opset = 7
    until_opset = 9
    attributes = (Attr("mode", "string", "nearest"), Attr("scales", "floats", None))
    inputs = (1, 2)
    dtypes = ALL_DTYPES

    def check(self, node, inputs):
        mode = node.attrs["mode"]
        if mode not in ("nearest", "linear"):
            raise self.unsupported(node, f"mode={mode!r}", "use 'nearest' or 'linear'")
        if inputs[0].dtype == np.bool_ and mode != "nearest":
            raise self.unsupported(node, "mode 'linear' on bool input", "use mode 'nearest'")
        if node.opset < 9 and node.attrs["scales"] is None:
            raise ValueError("Upsample-7 needs the scales attribute")
        if node.opset >= 9 and len(inputs) != 2:
            raise ValueError("Upsample-9 needs the scales input")

    def _scales(self, node, values):
        if node.opset < 9:
            return np.asarray(node.attrs["scales"], dtype=np.float32)
        return values[1]

    def infer(self, node, inputs):
        x = inputs[0]
        scales = self._scales(node, [x.value, None if len(inputs) < 2 else inputs[1].value])
        if scales is None:
            return [TensorInfo(x.dtype, tuple(f"{node.name}_d{i}" for i in range(x.rank)))]
        scales = np.asarray(scales).reshape(-1)
        out = [d if s == 1 else _floor_scaled(d, s) if isinstance(d, int) else
               dims.mul(d, int(s)) if float(s).is_integer() else f"{node.name}_d{i}"
               for i, (d, s) in enumerate(zip(x.shape, scales))]
        return [TensorInfo(x.dtype, tuple(out))]

    def settings(self, node, shape, values):
        """``(plan, roi, attrs, nearest_mode)`` of :func:`resample` for input values."""
        scales = np.asarray(self._scales(node, values)).reshape(-1)
        plan = [(d if s == 1 else _floor_scaled(d, s), float(s), float(s) * d) for d, s in zip(shape, scales)]
        attrs = {"mode": node.attrs["mode"], "coordinate_transformation_mode": "asymmetric", "antialias": 0,
                 "exclude_outside": 0, "cubic_coeff_a": -0.75, "extrapolation_value": 0.0}
        return plan, [(0.0, 1.0)] * len(shape), attrs, "simple"

    def reference(self, node, inputs):
        x = inputs[0]
        return [resample(x, *self.settings(node, x.shape, inputs))]

    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        values = [None, None if len(inputs) < 2 else inputs[1].value]
        if node.opset >= 9 and values[1] is None:
            raise self.unsupported(node, "a scales input not known at build time",
                                   "make it an initializer or computable from constants")
        settings = self.settings(node, tuple(int(d) for d in x.shape), values)
        return [_tactic(self, node, x, outputs[0], values, *settings)]


OPS = (Resize, Upsample)
