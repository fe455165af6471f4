"""Pooling: MaxPool, AveragePool, LpPool and their global forms, for any number of spatial dims.

Windows are taken with ``numpy.lib.stride_tricks.sliding_window_view`` over the padded
input; per-dimension masks say which window taps fall on the real input and which on
explicit padding, so padding never enters a max and is counted in an average only when
``count_include_pad`` asks for it. Taps past the end padding (the last window of
``ceil_mode``) are never counted.
"""

from __future__ import annotations


import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from plugrt.plugin import FLOAT_DTYPES, REDUCTION, REQUIRED, Attr, OpPlugin, TensorInfo, dims

from . import global_pool, window_pool

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _geometry(size: int, k: int, s: int, d: int, pb: int, pe: int, auto_pad: str, ceil_mode: bool):
    """One spatial dim: ``(out, pad_begin, pad_end)`` following the ONNX pooling spec."""
    keff = (k - 1) * d + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = -(-size // s)
        total = max(0, (out - 1) * s + keff - size)
        pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        return out, pb, total - pb
    if auto_pad == "VALID":
        return max(0, (size - keff) // s + 1), 0, 0
    span = size + pb + pe - keff
    if ceil_mode:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + pb:  # the last window must start inside the input or begin pad
            out -= 1
    else:
        out = span // s + 1
    return max(0, out), pb, pe


class PoolOp(OpPlugin):
    """The shared attribute handling of the windowed pools."""

    attributes = (
        Attr("kernel_shape", "ints", REQUIRED),
        Attr("strides", "ints", None),
        Attr("pads", "ints", None),
        Attr("auto_pad", "string", "NOTSET"),
        Attr("dilations", "ints", None),
        Attr("ceil_mode", "int", 0),
    )
    dtypes = FLOAT_DTYPES

    def params(self, node, rank: int):
        """``(kernel, strides, dilations, pads_begin, pads_end)`` for ``rank - 2`` spatial dims."""
        a = node.attrs
        n = rank - 2
        kernel = list(a["kernel_shape"])
        strides = list(a["strides"]) if a["strides"] else [1] * n
        dilations = list(a.get("dilations") or [1] * n)
        pads = list(a["pads"]) if a["pads"] else [0] * (2 * n)
        return kernel, strides, dilations, pads[:n], pads[n:]

    def check(self, node, inputs):
        x = inputs[0]
        a = node.attrs
        n = x.rank - 2
        if n < 1:
            raise self.unsupported(node, f"input of rank {x.rank}", "pooling needs [N, C, spatial...] (rank >= 3)")
        if a["auto_pad"] not in AUTO_PADS:
            raise self.unsupported(node, f"auto_pad={a['auto_pad']!r}", f"use one of {', '.join(AUTO_PADS)}")
        lengths = {"kernel_shape": n, "strides": n, "dilations": n, "pads": 2 * n}
        for name, want in lengths.items():
            value = a.get(name)
            if value and len(value) != want:
                raise self.unsupported(node, f"{name} of length {len(value)} for {n} spatial dims", f"give {want} values")
        kernel, strides, dilations, pb, pe = self.params(node, x.rank)
        if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1:
            raise self.unsupported(node, "kernel_shape, strides or dilations below 1", "use positive values")
        if min(pb + pe) < 0:
            raise self.unsupported(node, f"negative pads {a['pads']}", "pads must be >= 0")

    def out_spatial(self, node, shape):
        kernel, strides, dilations, pb, pe = self.params(node, len(shape))
        a = node.attrs
        sizes = []
        for i, size in enumerate(shape[2:]):
            args = (kernel[i], strides[i], dilations[i], pb[i], pe[i], a["auto_pad"], bool(a["ceil_mode"]))
            sizes.append(dims.derive(lambda v, args=args: _geometry(v, *args)[0], size, label=f"{node.name}_pool{i}"))
        return sizes

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, (*x.shape[:2], *self.out_spatial(node, x.shape)))]

    def geometry(self, node, x: TensorInfo, y: TensorInfo, storage_order: int = 0) -> np.ndarray:
        """The window geometry table the CUDA kernels read (pads after auto_pad/ceil_mode)."""
        kernel, strides, dilations, pbs, pes = self.params(node, x.rank)
        a = node.attrs
        begins, ends = [], []
        for i, size in enumerate(x.shape[2:]):
            _, pb, pe = _geometry(int(size), kernel[i], strides[i], dilations[i], pbs[i], pes[i],
                                  a["auto_pad"], bool(a["ceil_mode"]))
            begins.append(pb)
            ends.append(pe)
        return window_pool.window_geometry(x.shape, y.shape, kernel, strides, dilations, begins, ends,
                                               storage_order)

    def windows(self, node, x: np.ndarray, fill):
        """The windows of ``x``, shape ``[N, C, *out, *kernel]``, padding set to ``fill``,
        and the per-window-tap masks ``(real, countable)`` of shape ``[*out, *kernel]``."""
        kernel, strides, dilations, pbs, pes = self.params(node, x.ndim)
        a = node.attrs
        n = x.ndim - 2
        pad_width, outs, real, countable = [(0, 0), (0, 0)], [], [], []
        for i in range(n):
            size, k, s, d = x.shape[2 + i], kernel[i], strides[i], dilations[i]
            out, pb, pe = _geometry(size, k, s, d, pbs[i], pes[i], a["auto_pad"], bool(a["ceil_mode"]))
            keff = (k - 1) * d + 1
            end = max(0, (max(out, 1) - 1) * s + keff - pb - size)  # room for one window at least
            pad_width.append((pb, end))
            outs.append(out)
            pos = np.arange(out)[:, None] * s - pb + np.arange(k)[None, :] * d
            real.append((pos >= 0) & (pos < size))
            countable.append((pos >= -pb) & (pos < size + pe))
        xp = np.pad(x, pad_width, mode="constant", constant_values=fill)
        keffs = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        view = sliding_window_view(xp, keffs, axis=tuple(range(2, 2 + n)))
        index = (slice(None), slice(None))
        index += tuple(slice(0, max(0, (o - 1) * s + 1), s) for o, s in zip(outs, strides))
        index += tuple(slice(None, None, d) for d in dilations)
        view = view[index]
        return view, _outer(real), _outer(countable), outs, kernel


def _outer(masks: list[np.ndarray]) -> np.ndarray:
    """Combine per-dim ``[out_i, k_i]`` masks into one ``[*out, *k]`` mask."""
    n = len(masks)
    result = np.ones((1,) * (2 * n), dtype=bool)
    for i, m in enumerate(masks):
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = m.shape
        result = result & m.reshape(shape)
    return result


def _flat_windows(view: np.ndarray, n: int) -> np.ndarray:
    return view.reshape(*view.shape[: 2 + n], int(np.prod(view.shape[2 + n:], dtype=np.int64)))


class MaxPool(PoolOp):
    """MaxPool with the optional Indices output (flat indices into the input, row-major
    over the spatial dims for ``storage_order=0``, column-major for 1)."""

    op_type = "MaxPool"
    attributes = PoolOp.attributes + (Attr("storage_order", "int", 0),)
    outputs = (1, 2)
    dtypes = FLOAT_DTYPES | {np.dtype("int8"), np.dtype("uint8")}

    def check(self, node, inputs):
        super().check(node, inputs)
        if node.attrs["storage_order"] not in (0, 1):
            raise self.unsupported(node, f"storage_order={node.attrs['storage_order']}", "use 0 (row major) or 1")

    def infer(self, node, inputs):
        (y,) = super().infer(node, inputs)
        return [y, TensorInfo(np.int64, y.shape)]

    def tactics(self, node, inputs, outputs):
        table = self.geometry(node, inputs[0], outputs[0], node.attrs["storage_order"])
        return window_pool.window_pool_tactics("max", inputs[0], outputs[0], table, with_index=len(outputs) > 1)

    def reference(self, node, inputs):
        x = inputs[0]
        n = x.ndim - 2
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        view, real, _, outs, kernel = self.windows(node, x, low)
        values = np.where(real, view, x.dtype.type(low))
        flat = _flat_windows(values, n)
        y = flat.max(axis=-1) if flat.size else np.full(flat.shape[:-1], low, x.dtype)
        results = [y.astype(x.dtype, copy=False)]
        if len(node.outputs) > 1:
            results.append(self._indices(node, x, flat, outs, kernel))
        return results

    def _indices(self, node, x, flat, outs, kernel):
        _, strides, dilations, pbs, pes = self.params(node, x.ndim)
        a = node.attrs
        n = x.ndim - 2
        # the first maximum in row-major window order
        tap = np.argmax(flat, axis=-1) if flat.size else np.zeros(flat.shape[:-1], np.int64)
        taps = np.unravel_index(tap, kernel)
        coords = []
        for i in range(n):
            size = x.shape[2 + i]
            _, pb, _ = _geometry(size, kernel[i], strides[i], dilations[i], pbs[i], pes[i],
                                 a["auto_pad"], bool(a["ceil_mode"]))
            o = np.arange(outs[i]).reshape([-1 if j == i else 1 for j in range(n)])
            coords.append(np.clip(o * strides[i] - pb + taps[i] * dilations[i], 0, size - 1))
        order = "F" if a["storage_order"] == 1 else "C"
        spatial = np.ravel_multi_index(tuple(coords), x.shape[2:], order=order)
        plane = int(np.prod(x.shape[2:], dtype=np.int64))
        nc = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[0], x.shape[1], *([1] * n))
        return (nc * plane + spatial).astype(np.int64)


class AveragePool(PoolOp):
    """AveragePool; ``count_include_pad`` counts explicit (and auto) padding taps."""

    op_type = "AveragePool"
    attributes = PoolOp.attributes + (Attr("count_include_pad", "int", 0),)

    def tactics(self, node, inputs, outputs):
        table = self.geometry(node, inputs[0], outputs[0])
        return window_pool.window_pool_tactics("avg", inputs[0], outputs[0], table,
                                                   include_pad=int(node.attrs["count_include_pad"] != 0))

    def reference(self, node, inputs):
        x = inputs[0]
        n = x.ndim - 2
        view, real, countable, _, _ = self.windows(node, x, 0)
        mask = countable if node.attrs["count_include_pad"] else real
        axes = tuple(range(-n, 0))
        total = np.where(real, view.astype(np.float64), 0.0).sum(axis=axes)
        count = mask.sum(axis=axes)
        with np.errstate(divide="ignore", invalid="ignore"):
            return [(total / count).astype(x.dtype)]


class LpPool(PoolOp):
    """LpPool (opset 2 on, where ``p`` is an int): ``(sum |x|^p)^(1/p)`` over each window."""

    op_type = "LpPool"
    since_opset = 2
    attributes = PoolOp.attributes + (Attr("p", "int", 2),)

    def tactics(self, node, inputs, outputs):
        table = self.geometry(node, inputs[0], outputs[0])
        return window_pool.window_pool_tactics("lp", inputs[0], outputs[0], table, p=node.attrs["p"])

    def reference(self, node, inputs):
        x = inputs[0]
        n = x.ndim - 2
        p = node.attrs["p"]
        view, real, _, _, _ = self.windows(node, x, 0)
        powered = np.where(real, np.abs(view.astype(np.float64)) ** p, 0.0)
        return [(powered.sum(axis=tuple(range(-n, 0))) ** (1.0 / p)).astype(x.dtype)]


class GlobalPool(OpPlugin):
    """A pool over all spatial dims, keeping them as size 1."""

    groups = frozenset({REDUCTION})
    dtypes = FLOAT_DTYPES

    def check(self, node, inputs):
        if inputs[0].rank < 3:
            raise self.unsupported(node, f"input of rank {inputs[0].rank}", "pooling needs [N, C, spatial...] (rank >= 3)")

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, (*x.shape[:2], *([1] * (x.rank - 2))))]

    #: the global kernel's reduction: "avg", "max" or "lp"
    kind = ""

    def tactics(self, node, inputs, outputs):
        return global_pool.global_pool_tactics(self.kind, inputs[0], p=node.attrs.get("p", 2))

    def reference(self, node, inputs):
        x = inputs[0]
        axes = tuple(range(2, x.ndim))
        return [np.asarray(self.compute(node, x, axes)).astype(x.dtype)]


class GlobalAveragePool(GlobalPool):
    op_type = "GlobalAveragePool"
    kind = "avg"

    def compute(self, node, x, axes):
        return np.mean(x.astype(np.float64), axis=axes, keepdims=True)


class GlobalMaxPool(GlobalPool):
    op_type = "GlobalMaxPool"
    kind = "max"

    def compute(self, node, x, axes):
        return np.max(x, axis=axes, keepdims=True)


class GlobalLpPool(GlobalPool):
    op_type = "GlobalLpPool"
    kind = "lp"
    since_opset = 2
    attributes = (Attr("p", "int", 2),)

    def compute(self, node, x, axes):
        p = node.attrs["p"]
        return np.sum(np.abs(x.astype(np.float64)) ** p, axis=axes, keepdims=True) ** (1.0 / p)


OPS = (MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool)
