"""Convolutions: Conv and ConvTranspose over any number of spatial dims.

Both references work on the whole tensor at once: Conv gathers its input windows with
``sliding_window_view`` (im2col) and multiplies them per group with one batched matmul;
ConvTranspose multiplies per group and scatters the columns back (col2im) with one strided
add per kernel offset. Float32 and float16 accumulate in float64 and are cast back.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from plugrt import ShapeError
from plugrt.kernels import no_epilogue
from plugrt.plugin import ANCHOR, FLOAT_DTYPES, Attr, OpPlugin, TensorInfo, dims, optional
from plugrt_builtin_ops.common.scale_folding import vector_along

from .direct import MAX_RANK
from .geometry import ConvGeometry
from .tactics import conv_tactics, conv_transpose_tactics

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64, copy=False)


def _spatial_ints(node, name: str, value, rank: int, fill: int) -> list[int]:
    """An ints attribute with one value per spatial axis (``fill`` when absent)."""
    if value is None:
        return [fill] * rank
    value = [int(v) for v in value]
    if len(value) != rank:
        raise ShapeError(f"{node.describe()}: {name} has {len(value)} values, expected {rank} (one per spatial axis)")
    return value


def _explicit_pads(node, rank: int) -> list[int]:
    pads = node.attrs["pads"]
    if pads is None:
        return [0] * (2 * rank)
    pads = [int(p) for p in pads]
    if len(pads) != 2 * rank:
        raise ShapeError(f"{node.describe()}: pads has {len(pads)} values, expected {2 * rank} (begin and end per spatial axis)")
    return pads


def _split(total: int, upper: bool) -> tuple[int, int]:
    """Split ``total`` padding; SAME_UPPER puts the odd element at the end."""
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


class _ConvBase(OpPlugin):
    groups = frozenset({ANCHOR})
    dtypes = FLOAT_DTYPES
    inputs = (2, 3)
    transposed = False

    def check(self, node, inputs):
        if node.attrs["auto_pad"] not in AUTO_PADS:
            raise self.unsupported(node, f"auto_pad={node.attrs['auto_pad']!r}", f"use one of {', '.join(AUTO_PADS)}")
        x, w = inputs[0], inputs[1]
        if x.rank < 3 or w.rank != x.rank:
            raise ShapeError(
                f"{node.describe()}: X and W must have the same rank >= 3 (N, C, spatial...), got X{dims.format_shape(x.shape)} "
                f"and W{dims.format_shape(w.shape)}"
            )
        group = node.attrs["group"]
        if group < 1:
            raise ShapeError(f"{node.describe()}: group must be >= 1, got {group}")
        kernel = node.attrs["kernel_shape"]
        if kernel is not None and list(kernel) != [k for k in w.shape[2:]]:
            if len(kernel) != w.rank - 2 or all(isinstance(k, int) for k in w.shape[2:]):
                raise self.unsupported(
                    node, f"kernel_shape={list(kernel)} differing from W's spatial shape {list(w.shape[2:])}",
                    "drop kernel_shape or make it match W",
                )
        for i in range(len(x.shape) - 2):
            for name in ("strides", "dilations"):
                value = node.attrs[name]
                if value is not None and i < len(value) and value[i] < 1:
                    raise ShapeError(f"{node.describe()}: {name} must be >= 1, got {list(value)}")
        channels = x.shape[1]
        per_group = w.shape[0] if self.transposed else w.shape[1]
        if isinstance(channels, int) and isinstance(per_group, int):
            expected = per_group if self.transposed else per_group * group
            if channels != expected or (self.transposed and channels % group):
                raise ShapeError(
                    f"{node.describe()}: X has {channels} channels but W{dims.format_shape(w.shape)} with group={group} "
                    f"expects {expected}"
                )
        if not self.transposed and isinstance(w.shape[0], int) and w.shape[0] % group:
            raise ShapeError(f"{node.describe()}: W's {w.shape[0]} output channels are not divisible by group={group}")
        b = optional(inputs, 2)
        if b is not None:
            out_channels = self._out_channels(node, w)
            if b.rank != 1 or (isinstance(b.shape[0], int) and isinstance(out_channels, int) and b.shape[0] != out_channels):
                raise ShapeError(f"{node.describe()}: B must be 1-D of {out_channels} values, got B{dims.format_shape(b.shape)}")

    def fold_scale(self, node, inputs, output, scale, shift):
        """Fold a per-output-channel ``y * scale + shift`` into W and B (B added when absent).

        Both must be constants; the scale and shift may vary along the channel axis 1 only.
        """
        w, b = inputs[1], optional(inputs, 2)
        if w.value is None or (b is not None and b.value is None):
            return None
        s, t = vector_along(scale, output.shape, 1), vector_along(shift, output.shape, 1)
        if s is None or t is None:
            return None
        weights = self._scale_weights(node, _wide(w.value), s)
        bias = _wide(b.value) if b is not None else np.zeros(len(s))
        return {1: weights.astype(w.dtype), 2: (bias * s + t).astype(w.dtype if b is None else b.dtype)}

    def _params(self, node, rank: int):
        strides = _spatial_ints(node, "strides", node.attrs["strides"], rank, 1)
        dilations = _spatial_ints(node, "dilations", node.attrs["dilations"], rank, 1)
        return strides, dilations

    def _kernel_geometry(self, node, inputs, outputs) -> ConvGeometry:
        """The node at concrete shapes, as the kernels take it."""
        x, w, y = inputs[0], inputs[1], outputs[0]
        rank = x.rank - 2
        if rank > MAX_RANK:
            raise self.unsupported(node, f"{rank} spatial dims on the GPU",
                                   f"the CUDA kernels take up to {MAX_RANK}")
        strides, dilations = self._params(node, rank)
        geometry = self._geometry(node, x.shape[2:], w.shape[2:])
        return ConvGeometry(
            batch=int(x.shape[0]), in_channels=int(x.shape[1]), out_channels=int(y.shape[1]),
            group=int(node.attrs["group"]), in_spatial=tuple(int(d) for d in x.shape[2:]),
            kernel=tuple(int(d) for d in w.shape[2:]), out_spatial=tuple(int(d) for d in y.shape[2:]),
            strides=tuple(strides), dilations=tuple(dilations), pads=tuple(int(g[1]) for g in geometry),
            transposed=self.transposed,
        )


_CONV_ATTRIBUTES = (
    Attr("auto_pad", "string", "NOTSET"),
    Attr("dilations", "ints", None),
    Attr("group", "int", 1),
    Attr("kernel_shape", "ints", None),
    Attr("pads", "ints", None),
    Attr("strides", "ints", None),
)


class Conv(_ConvBase):
    """Y = conv(X, W) + B, with X (N, C, D1..Dn), W (M, C/group, k1..kn), B (M)."""

    op_type = "Conv"
    attributes = _CONV_ATTRIBUTES

    def _out_channels(self, node, w):
        return w.shape[0]

    def _geometry(self, node, in_shape, kernel):
        """Per spatial axis: (output size, pad begin, pad end); dims may be symbolic."""
        rank = len(in_shape)
        strides, dilations = self._params(node, rank)
        auto_pad = node.attrs["auto_pad"]
        pads = _explicit_pads(node, rank) if auto_pad == "NOTSET" else [0] * (2 * rank)
        out = []
        for i, (size, k, s, d) in enumerate(zip(in_shape, kernel, strides, dilations)):
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                upper = auto_pad == "SAME_UPPER"

                def same_pads(n, kk, s=s, d=d, upper=upper):
                    total = max(0, (-(-n // s) - 1) * s + (kk - 1) * d + 1 - n)
                    return _split(total, upper)

                o = dims.derive(lambda n: -(-n // s), size, label=f"ceildiv{s}")
                if isinstance(size, int) and isinstance(k, int):
                    begin, end = same_pads(size, k)
                else:
                    begin = end = None  # only needed by the reference, where shapes are concrete
            else:
                begin, end = pads[i], pads[i + rank]

                def valid(n, kk, s=s, d=d, begin=begin, end=end):
                    return (n + begin + end - (kk - 1) * d - 1) // s + 1

                o = dims.derive(valid, size, k, label=f"conv_s{s}_d{d}_p{begin}_{end}")
            if isinstance(o, int) and o < 1:
                raise ShapeError(
                    f"{node.describe()}: spatial axis {i} of size {size} with kernel {k}, stride {s}, dilation {d} "
                    f"and pads ({begin}, {end}) gives an empty output"
                )
            out.append((o, begin, end))
        return out

    def infer(self, node, inputs):
        x, w = inputs[0], inputs[1]
        geometry = self._geometry(node, x.shape[2:], w.shape[2:])
        return [TensorInfo(x.dtype, (x.shape[0], w.shape[0], *[g[0] for g in geometry]))]

    def reference(self, node, inputs):
        x, w = inputs[0], inputs[1]
        b = optional(inputs, 2)
        rank = x.ndim - 2
        group = node.attrs["group"]
        strides, dilations = self._params(node, rank)
        geometry = self._geometry(node, x.shape[2:], w.shape[2:])
        xw = _wide(x)
        # Pad (or crop, for negative pads) the spatial axes.
        widths = [(0, 0), (0, 0)] + [(max(g[1], 0), max(g[2], 0)) for g in geometry]
        xw = np.pad(xw, widths)
        crop = tuple(slice(max(-g[1], 0), xw.shape[2 + i] - max(-g[2], 0)) for i, g in enumerate(geometry))
        xw = xw[(slice(None), slice(None), *crop)]
        kernel = w.shape[2:]
        extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        windows = sliding_window_view(xw, extent, axis=tuple(range(2, 2 + rank)))
        # windows: (N, C, P1..Pn, E1..En); take strides on P, dilations on E, keep valid outputs.
        select = tuple(slice(0, g[0] * s, s) for g, s in zip(geometry, strides))
        select += tuple(slice(None, None, d) for d in dilations)
        windows = windows[(slice(None), slice(None), *select)]
        n, c = x.shape[0], x.shape[1]
        m = w.shape[0]
        cg, mg = c // group, m // group
        out_spatial = [g[0] for g in geometry]
        positions = int(np.prod(out_spatial))
        taps = cg * int(np.prod(kernel))
        # (N, G, Cg, O..., K...) -> (N, G, O..., Cg, K...) -> (N, G, P, Cg*K)
        windows = windows.reshape(n, group, cg, *out_spatial, *kernel)
        order = (0, 1, *range(3, 3 + rank), 2, *range(3 + rank, 3 + 2 * rank))
        cols = np.ascontiguousarray(windows.transpose(order)).reshape(n, group, positions, taps)
        weights = _wide(w).reshape(group, mg, taps).transpose(0, 2, 1)  # (G, Cg*K, Mg)
        y = np.matmul(cols, weights)  # (N, G, P, Mg)
        y = y.transpose(0, 1, 3, 2).reshape(n, m, *out_spatial)
        if b is not None:
            y = y + _wide(b).reshape(m, *([1] * rank))
        return [y.astype(x.dtype)]

    def _scale_weights(self, node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        """W (M, C/group, k...) scaled by ``s`` (M) along its output channels."""
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))

    def tactics(self, node, inputs, outputs, epilogue=None):
        """Every tactic that fits the node, best guess first (:func:`.tactics.conv_tactics`);
        each applies ``epilogue`` at its final store."""
        geo = self._kernel_geometry(node, inputs, outputs)
        return conv_tactics(geo, inputs[0].dtype, epilogue or no_epilogue(len(node.inputs)))


class ConvTranspose(_ConvBase):
    """The gradient of Conv: X (N, C, D1..Dn), W (C, M/group, k1..kn), B (M)."""

    op_type = "ConvTranspose"
    transposed = True
    attributes = _CONV_ATTRIBUTES + (Attr("output_padding", "ints", None), Attr("output_shape", "ints", None))

    def _out_channels(self, node, w):
        return dims.mul(w.shape[1], node.attrs["group"])

    def _output_shape(self, node, rank):
        shape = node.attrs["output_shape"]
        if shape is None:
            return None
        shape = [int(v) for v in shape]
        if len(shape) == rank + 2:  # onnxruntime also accepts (N, C, spatial...)
            shape = shape[2:]
        if len(shape) != rank:
            raise ShapeError(f"{node.describe()}: output_shape has {len(shape)} values, expected {rank} (spatial dims)")
        return shape

    def _geometry(self, node, in_shape, kernel):
        """Per spatial axis: (output size, pad begin, pad end, full size before padding)."""
        rank = len(in_shape)
        strides, dilations = self._params(node, rank)
        output_padding = _spatial_ints(node, "output_padding", node.attrs["output_padding"], rank, 0)
        output_shape = self._output_shape(node, rank)
        auto_pad = node.attrs["auto_pad"]
        pads = _explicit_pads(node, rank) if auto_pad == "NOTSET" else [0] * (2 * rank)
        out = []
        for i, (size, k, s, d, op) in enumerate(zip(in_shape, kernel, strides, dilations, output_padding)):
            full = dims.derive(lambda n, kk, s=s, d=d: s * (n - 1) + (kk - 1) * d + 1, size, k, label=f"convt_s{s}_d{d}")
            target = None
            if output_shape is not None:
                target = output_shape[i]
            elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                target = dims.mul(size, s)
            if target is None:
                begin, end = pads[i], pads[i + rank]
                o = dims.derive(lambda f, op=op, begin=begin, end=end: f + op - begin - end, full, label=f"pad{op}_{begin}_{end}")
            else:
                o = target
                if isinstance(full, int) and isinstance(target, int):
                    # The spec's split: SAME_UPPER puts the odd element at the end, all other modes
                    # at the beginning. A negative total extends the output with zeros at the end.
                    begin, end = _split(full + op - target, auto_pad == "SAME_UPPER")
                else:
                    begin = end = None
            if isinstance(o, int) and o < 1:
                raise ShapeError(f"{node.describe()}: spatial axis {i} of size {size} gives an empty output ({o})")
            out.append((o, begin, end, full))
        return out

    def infer(self, node, inputs):
        x, w = inputs[0], inputs[1]
        geometry = self._geometry(node, x.shape[2:], w.shape[2:])
        return [TensorInfo(x.dtype, (x.shape[0], self._out_channels(node, w), *[g[0] for g in geometry]))]

    def reference(self, node, inputs):
        x, w = inputs[0], inputs[1]
        b = optional(inputs, 2)
        rank = x.ndim - 2
        group = node.attrs["group"]
        strides, dilations = self._params(node, rank)
        geometry = self._geometry(node, x.shape[2:], w.shape[2:])
        n, c = x.shape[0], x.shape[1]
        in_spatial = x.shape[2:]
        kernel = w.shape[2:]
        cg, mg = c // group, w.shape[1]
        m = mg * group
        positions = int(np.prod(in_spatial))
        ktaps = int(np.prod(kernel))
        # Per group: (N, G, P, Cg) @ (G, Cg, Mg*K) -> (N, G, P, Mg, K...)
        xs = _wide(x).reshape(n, group, cg, positions).transpose(0, 1, 3, 2)
        weights = _wide(w).reshape(group, cg, mg * ktaps)
        cols = np.matmul(xs, weights).reshape(n, group, *in_spatial, mg, *kernel)
        cols = np.moveaxis(cols, 2 + rank, 2)  # (N, G, Mg, D..., K...)
        full = [g[3] for g in geometry]
        y = np.zeros((n, group, mg, *full))
        for offset in np.ndindex(*kernel):
            target = tuple(
                slice(o * d, o * d + s * (size - 1) + 1, s)
                for o, d, s, size in zip(offset, dilations, strides, in_spatial)
            )
            y[(Ellipsis, *target)] += cols[(Ellipsis, *offset)]
        y = y.reshape(n, m, *full)
        # Crop by the pads; output positions past the full result (output_padding, negative pads) stay 0.
        out_spatial = [g[0] for g in geometry]
        out = np.zeros((n, m, *out_spatial))
        src, dst = [], []
        for (o, begin, _end, f) in geometry:
            lo, hi = max(begin, 0), min(begin + o, f)
            src.append(slice(lo, max(hi, lo)))
            dst.append(slice(lo - begin, lo - begin + max(hi - lo, 0)))
        out[(slice(None), slice(None), *dst)] = y[(slice(None), slice(None), *src)]
        if b is not None:
            out += _wide(b).reshape(m, *([1] * rank))
        return [out.astype(x.dtype)]

    def _scale_weights(self, node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        """W (C, M/group, k...) scaled by ``s`` (M): output channel g*(M/group)+j is
        W[g*(C/group):(g+1)*(C/group), j]."""
        group = node.attrs["group"]
        c, mg = w.shape[0], w.shape[1]
        per_channel = s.reshape(group, 1, mg, *([1] * (w.ndim - 2)))
        return (w.reshape(group, c // group, mg, *w.shape[2:]) * per_channel).reshape(w.shape)

    def tactics(self, node, inputs, outputs, epilogue=None):
        """The direct kernels (:func:`.tactics.conv_transpose_tactics`); each applies
        ``epilogue`` at its store."""
        geo = self._kernel_geometry(node, inputs, outputs)
        return conv_transpose_tactics(geo, inputs[0].dtype, epilogue or no_epilogue(len(node.inputs)))


OPS = (Conv, ConvTranspose)
