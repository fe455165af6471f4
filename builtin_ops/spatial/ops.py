"""Spatial data movement: Pad, DepthToSpace, SpaceToDepth (Resize and Upsample are in
:mod:`.resize_ops`; the kernels in :mod:`.pad` and :mod:`.permute`)."""

from __future__ import annotations

import numpy as np

from plugrt.plugin import ALL_DTYPES, REQUIRED, SHAPE, Attr, OpPlugin, TensorInfo, dims, optional

from . import pad, permute

# ------------------------------------------------------------------------------ Pad


def _scalar(array, dtype, default=0):
    """The single value of an optional scalar-like input, cast to ``dtype``."""
    if array is None or np.size(array) == 0:
        return np.array(default).astype(dtype)
    return np.asarray(array).reshape(-1)[0].astype(dtype)


def pad_array(x: np.ndarray, pads, mode: str, value) -> np.ndarray:
    """Pad ``x`` by per-axis ``(begin, end)`` counts; negative counts crop first."""
    pads = [(int(b), int(e)) for b, e in pads]
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(pads))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in pads]
    if not any(b or e for b, e in grow):
        return x.copy()
    if mode == "constant":
        shape = tuple(n + b + e for n, (b, e) in zip(x.shape, grow))
        out = np.full(shape, value, dtype=x.dtype)
        out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, grow))] = x
        return out
    return np.pad(x, grow, mode={"edge": "edge", "reflect": "reflect", "wrap": "wrap"}[mode])


def _pad_shape(node, x: TensorInfo, pads) -> tuple:
    """Output shape for per-axis pairs, or fresh symbols where a pair is ``None``."""
    out = []
    for axis, (d, pair) in enumerate(zip(x.shape, pads)):
        if pair is None:
            out.append(f"{node.name}_d{axis}")
        else:
            out.append(dims.add(d, int(pair[0]) + int(pair[1])))
    return tuple(out)


class _PadBase(OpPlugin):
    op_type = "Pad"
    dtypes = ALL_DTYPES
    modes = ("constant", "reflect", "edge", "wrap")

    def check(self, node, inputs):
        if node.attrs["mode"] not in self.modes:
            raise self.unsupported(node, f"mode={node.attrs['mode']!r}", f"use one of {self.modes}")

    def pairs(self, node, rank, values):
        """Per-axis (begin, end) pairs, or ``None`` when the pads are not known."""
        raise NotImplementedError

    def infer(self, node, inputs):
        x = inputs[0]
        values = [None if i is None else i.value for i in inputs]
        pairs = self.pairs(node, x.rank, values)
        if pairs is None:
            pairs = self.unknown(node, x.rank, inputs)
        return [TensorInfo(x.dtype, _pad_shape(node, x, pairs))]

    def unknown(self, node, rank, inputs):
        return [None] * rank

    def tactics(self, node, inputs, outputs):
        x = inputs[0]
        pairs = self.pairs(node, x.rank, [None if i is None else i.value for i in inputs])
        if pairs is None:
            raise self.unsupported(node, "pads or axes not known at build time",
                                   "make them initializers or computable from constants")
        mode = node.attrs["mode"]
        kept = [int(n) - max(-b, 0) - max(-e, 0) for n, (b, e) in zip(x.shape, pairs)]
        if mode != "constant" and any(k <= 0 and (b > 0 or e > 0) for k, (b, e) in zip(kept, pairs)):
            raise self.unsupported(node, f"mode {mode!r} padding an empty axis", "there is nothing to repeat")
        value, index = self.fill_source(node, inputs, x.dtype)
        return pad.pad_tactics(x, outputs[0], pairs, mode, value, index)

    def fill_source(self, node, inputs, dtype):
        """``(host value, None)`` or ``(None, input index)`` of the constant mode's value."""
        return self.value(node, inputs, dtype), None

    def reference(self, node, inputs):
        x = inputs[0]
        pairs = self.pairs(node, x.ndim, inputs)
        return [pad_array(x, pairs, node.attrs["mode"], self.value(node, inputs, x.dtype))]


class PadAttr(_PadBase):
    """Pad-1 (``paddings``) and Pad-2 (``pads``), with the float ``value`` attribute."""

    since_opset = 1
    until_opset = 10
    attributes = (Attr("mode", "string", "constant"), Attr("pads", "ints", None),
                  Attr("paddings", "ints", None), Attr("value", "float", 0.0))

    def check(self, node, inputs):
        super().check(node, inputs)
        name = "paddings" if node.opset < 2 else "pads"
        pads = node.attrs[name]
        if pads is None or len(pads) != 2 * inputs[0].rank:
            raise ValueError(f"attribute {name!r} must hold 2 * rank = {2 * inputs[0].rank} ints, got {pads}")

    def pairs(self, node, rank, values):
        pads = node.attrs["paddings" if node.opset < 2 else "pads"]
        return list(zip(pads[:rank], pads[rank:]))

    def value(self, node, inputs, dtype):
        return _scalar(np.float64(node.attrs["value"]), dtype)


class Pad(_PadBase):
    """Pad-11+: ``pads`` and ``constant_value`` inputs, ``axes`` input since 18."""

    since_opset = 11
    attributes = (Attr("mode", "string", "constant"),)
    inputs = (2, 4)

    def _axes(self, node, rank, values):
        axes = optional(values, 3)
        if axes is None:
            return list(range(rank))
        if node.opset < 18:
            raise ValueError("the axes input needs opset 18")
        return [int(a) + rank if a < 0 else int(a) for a in np.asarray(axes).reshape(-1)]

    def pairs(self, node, rank, values):
        pads = values[1]
        if pads is None or (len(values) > 3 and values[3] is None and node.inputs[3]):
            return None
        axes = self._axes(node, rank, values)
        pads = np.asarray(pads).reshape(-1)
        if pads.size != 2 * len(axes):
            raise ValueError(f"pads must hold 2 * {len(axes)} values, got {pads.size}")
        pairs = [(0, 0)] * rank
        for i, axis in enumerate(axes):
            pairs[axis] = (int(pads[i]), int(pads[i + len(axes)]))
        return pairs

    def unknown(self, node, rank, inputs):
        axes_info = optional(inputs, 3)
        if axes_info is None or axes_info.value is not None:
            axes = self._axes(node, rank, [None, None, None, None if axes_info is None else axes_info.value])
            return [None if a in axes else (0, 0) for a in range(rank)]
        return [None] * rank

    def value(self, node, inputs, dtype):
        return _scalar(optional(inputs, 2), dtype)

    def fill_source(self, node, inputs, dtype):
        info = optional(inputs, 2)
        if info is None or info.value is not None or 0 in info.shape:
            return _scalar(None if info is None else info.value, dtype), None
        if info.dtype != dtype:
            raise self.unsupported(node, f"a runtime constant_value of dtype {info.dtype} for data of {dtype}",
                                   "give it the data's dtype or make it an initializer")
        return None, 2  # read on the device, so it may change between runs


# ------------------------------------------------------------------- DepthToSpace


class _BlockOp(OpPlugin):
    attributes = (Attr("blocksize", "int", REQUIRED), Attr("mode", "string", "DCR"))
    groups = frozenset({SHAPE})
    dtypes = ALL_DTYPES

    def check(self, node, inputs):
        if node.attrs["mode"] not in ("DCR", "CRD"):
            raise self.unsupported(node, f"mode={node.attrs['mode']!r}", "use 'DCR' or 'CRD'")
        if inputs[0].rank != 4:
            raise ValueError(f"input must be 4-D [N,C,H,W], got rank {inputs[0].rank}")
        if node.attrs["blocksize"] < 1:
            raise ValueError(f"blocksize must be positive, got {node.attrs['blocksize']}")


class DepthToSpace(_BlockOp):
    op_type = "DepthToSpace"

    def infer(self, node, inputs):
        x, b = inputs[0], node.attrs["blocksize"]
        n, c, h, w = x.shape
        if isinstance(c, int) and c % (b * b):
            raise ValueError(f"channels {c} are not divisible by blocksize**2 = {b * b}")
        c = dims.derive(lambda v: v // (b * b), c, label=f"div{b * b}") if b > 1 else c
        return [TensorInfo(x.dtype, (n, c, dims.mul(h, b), dims.mul(w, b)))]

    def tactics(self, node, inputs, outputs):
        b = node.attrs["blocksize"]
        n, c, h, w = (int(d) for d in inputs[0].shape)
        if node.attrs["mode"] == "DCR":
            view, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
        else:
            view, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
        return [permute.block_permute_tactic(inputs[0].shape, view, perm)]

    def reference(self, node, inputs):
        x, b = inputs[0], node.attrs["blocksize"]
        n, c, h, w = x.shape
        if node.attrs["mode"] == "DCR":
            y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return [np.ascontiguousarray(y).reshape(n, c // (b * b), h * b, w * b)]


class SpaceToDepth(_BlockOp):
    op_type = "SpaceToDepth"

    def infer(self, node, inputs):
        x, b = inputs[0], node.attrs["blocksize"]
        n, c, h, w = x.shape
        for d in (h, w):
            if isinstance(d, int) and d % b:
                raise ValueError(f"spatial dim {d} is not divisible by blocksize {b}")
        h, w = ((dims.derive(lambda v: v // b, d, label=f"div{b}") if b > 1 else d) for d in (h, w))
        return [TensorInfo(x.dtype, (n, dims.mul(c, b * b), h, w))]

    def tactics(self, node, inputs, outputs):
        b = node.attrs["blocksize"]
        n, c, h, w = (int(d) for d in inputs[0].shape)
        perm = (0, 3, 5, 1, 2, 4) if node.attrs["mode"] == "DCR" else (0, 1, 3, 5, 2, 4)
        return [permute.block_permute_tactic(inputs[0].shape, (n, c, h // b, b, w // b, b), perm)]

    def reference(self, node, inputs):
        x, b = inputs[0], node.attrs["blocksize"]
        n, c, h, w = x.shape
        t = x.reshape(n, c, h // b, b, w // b, b)
        perm = (0, 3, 5, 1, 2, 4) if node.attrs["mode"] == "DCR" else (0, 1, 3, 5, 2, 4)
        return [np.ascontiguousarray(t.transpose(perm)).reshape(n, c * b * b, h // b, w // b)]


OPS = (PadAttr, Pad, DepthToSpace, SpaceToDepth)
