"""The channels-last convolution ``plugrt.conv::ConvNHWC``, and how a Conv becomes one.

ConvNHWC is Conv with the channel axis last: X ``[N, spatial..., C]``, W ``[M, k...,
C/group]``, B ``[M]``, Y ``[N, out_spatial..., M]``, Conv's attributes. Shape inference,
checks and the reference are Conv's on the arrays with their channel axis moved back to 1.
The ``channels_last`` pass of the shape family (:mod:`plugrt_builtin_ops.shape.channels_last`)
makes it out of a Conv (:func:`channels_last_form`) where it has a tensor-core kernel; in
an INT8 build the quant family's ``fuse_qdq`` then makes it ``plugrt.quant::ConvIntegerNHWC``.
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import no_epilogue
from plugrt.plugin import Example, TensorInfo, optional
from plugrt_builtin_ops.common.layout import channels_first, channels_last
from plugrt_builtin_ops.common.scale_folding import vector_along

from .ops import Conv
from .wgmma_nhwc import nhwc_tactics

DOMAIN = "plugrt.conv"
#: Input channels a Conv needs to become channels-last: whole 16-byte chunks of FP16.
CHANNEL_MULTIPLE = 8
#: The same in an INT8 build, whose convolutions read int8: whole 16-byte chunks of int8.
INT8_CHANNEL_MULTIPLE = 16


class ChannelsLast:
    """Mixin for a convolution of the conv family with the channel axis last (X ``[N,
    spatial..., C]``, W ``[M, k..., C/group]``, Y ``[N, out_spatial..., M]``): checks,
    shape inference, the reference and the kernel geometry are its channels-first base's
    on inputs 0 and 1 and output 0 with their channel axis moved back to 1. The quant
    family's ConvIntegerNHWC is one too."""

    def check(self, node, inputs):
        super().check(node, [channels_first(i) for i in inputs[:2]] + list(inputs[2:]))

    def infer(self, node, inputs):
        return [channels_last(super().infer(node, [channels_first(i) for i in inputs[:2]] + list(inputs[2:]))[0])]

    def reference(self, node, inputs):
        x, w = (np.moveaxis(np.asarray(a), -1, 1) for a in inputs[:2])
        return [np.ascontiguousarray(np.moveaxis(super().reference(node, [x, w, *inputs[2:]])[0], 1, -1))]

    def _kernel_geometry(self, node, inputs, outputs):
        return super()._kernel_geometry(node, [channels_first(i) for i in inputs[:2]] + list(inputs[2:]),
                                        [channels_first(outputs[0])])


class ConvNHWC(ChannelsLast, Conv):
    """Y = conv(X, W) + B with the channel axis last: X (N, D1..Dn, C), W (M, k1..kn, C/group), B (M)."""

    domain = DOMAIN
    op_type = "ConvNHWC"

    def fold_scale(self, node, inputs, output, scale, shift):
        """A per-output-channel ``y * scale + shift`` (channels on the last axis) into W and B."""
        w, b = inputs[1], optional(inputs, 2)
        if w.value is None or (b is not None and b.value is None):
            return None
        s, t = vector_along(scale, output.shape, -1), vector_along(shift, output.shape, -1)
        if s is None or t is None:
            return None
        weights = np.asarray(w.value, np.float64) * s.reshape((-1,) + (1,) * (w.rank - 1))
        bias = np.asarray(b.value, np.float64) if b is not None else np.zeros(len(s))
        return {1: weights.astype(w.dtype), 2: (bias * s + t).astype(w.dtype if b is None else b.dtype)}

    def tactics(self, node, inputs, outputs, epilogue=None):
        """:func:`.wgmma_nhwc.nhwc_tactics`; each applies ``epilogue`` at its final store."""
        geo = self._kernel_geometry(node, inputs, outputs)
        return nhwc_tactics(geo, inputs[0].dtype, epilogue or no_epilogue(len(node.inputs)), len(node.inputs) > 2
                            and node.inputs[2] != "", inputs[1].value)

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        rng = np.random.default_rng(7)

        def weights(shape, dtype):
            return (rng.standard_normal(shape) * 0.3).astype(dtype)

        return [
            Example((TensorInfo(f32, (2, 5, 7, 8)), weights((16, 3, 3, 8), f32), weights((16,), f32)),
                    {"pads": [1, 1, 1, 1]}),
            Example((TensorInfo(f16, (1, 6, 5, 16)), weights((8, 3, 1, 16), f16)),
                    {"strides": [2, 1], "pads": [1, 0, 0, 0], "dilations": [1, 1]}, rtol=1e-2, atol=1e-2),
            Example((TensorInfo(f32, (1, 7, 6, 4)), weights((6, 2, 2, 2), f32)),
                    {"group": 2, "dilations": [2, 1], "strides": [1, 2]}),
            Example((TensorInfo(f16, (2, 9, 8)), weights((8, 3, 8), f16), weights((8,), f16)),
                    {"pads": [1, 1]}, rtol=1e-2, atol=1e-2),
        ]


def channels_last_form(node, graph, multiple: int = CHANNEL_MULTIPLE) -> dict | None:
    """What the pass needs to make ``node`` (an ONNX Conv) a ConvNHWC: ``{"attrs",
    "weight", "pad_channels"}`` (the weight moved to ``[M, k..., C/group]``; zero input
    channels to add so that C is a whole ``multiple``: FP16's 16-byte chunks by default,
    a first layer's 3 becoming 8; :data:`INT8_CHANNEL_MULTIPLE` in an INT8 build; the
    weight padded to match), or None where the Conv has no fast channels-last kernel (not
    2-D, grouped but not depthwise, a weight that is not a constant, symbolic channels,
    ``auto_pad``, more than half of C padding). A depthwise Conv (one input channel per
    group) runs channels-last on the plain kernel, whose threads take consecutive channels:
    a MobileNet's depthwise layers between its 1x1 convolutions need no layout changes."""
    if node.domain or node.op_type != "Conv" or len(node.inputs) < 2:
        return None
    x, w = graph.info(node.inputs[0]), graph.info(node.inputs[1])
    if x is None or w is None or w.value is None or x.rank != 4 or not isinstance(x.shape[1], int):
        return None
    channels, group = x.shape[1], node.attrs.get("group", 1)
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET" or (group != 1 and group != channels):
        return None
    pad = -channels % multiple if group == 1 else 0
    if pad and channels >= multiple and 2 * pad > channels:
        return None
    attrs = {name: node.attrs[name] for name in ("dilations", "group", "kernel_shape", "pads", "strides")
             if node.attrs.get(name) is not None}
    weight = np.moveaxis(w.value, 1, -1)
    weight = np.pad(weight, [(0, 0)] * (weight.ndim - 1) + [(0, pad)])
    return {"attrs": attrs, "weight": np.ascontiguousarray(weight), "pad_channels": pad}


def space_to_depth_form(node, graph, form: dict, multiple: int = CHANNEL_MULTIPLE) -> dict | None:
    """A first layer's stride folded into its channels (space to depth, as TPU ResNet-50
    stems do), where that shortens its K: a stride-``s`` Conv over C channels is a Conv over
    blocks of its input, each block's pixels read as channels. Two foldings are weighed,
    the shortest K kept (ties: the first):

    - along W alone: ``[N, H, W, C]`` *is* ``[N, H, W/s, s * C]`` in memory (a Reshape,
      no copy), so the Conv keeps its stride along H and runs stride 1 over the pairs
      (triples, ...) of pixels along W. ResNet's 7x7/2 stem over 3 channels padded to 4
      first: 7 x 4 taps over 8 channels, K 224 instead of 7 * 7 * 8 = 392;
    - along both axes, ``s x s`` blocks (a Transpose makes them channels): a stride-1
      Conv. ResNet's stem in an INT8 build (16-byte chunks of 16 int8): 4 x 4 taps over 16
      channels, K 256 instead of 784.

    A block's channels ``(rh * fw + rw) * C' + c`` are made whole chunks either by padding
    C to ``C'`` first (where that gives whole chunks, ``pre_pad``) or by padding the block
    after (``pad_channels``), whichever gives the shorter K. Along a folded axis (kernel k,
    pads b and e, input size H, output size O): with ``l = ceil(b / s)`` blocks of padding
    before, tap j of ``k' = floor((k - 1 - b) / s) + l + 1`` and block offset r carry the
    original tap ``t = s * (j - l) + r + b`` (zero where t is outside 0..k-1); the block
    Conv pads ``l`` before and what the last output reaches past the ``ceil(H / s)``
    blocks after (the input zero-padded to whole blocks first). ``form``:
    :func:`channels_last_form`'s for ``node``. Returns ``{"attrs", "weight",
    "pad_channels", "pre_pad", "fold", "spatial_pad"}`` (``fold``: the block's height and
    width), or None where folding does not apply (channels already whole, a group,
    unequal strides or stride 1, dilation, a symbolic spatial size) or would not shorten K."""
    attrs = form["attrs"]
    x, w = graph.info(node.inputs[0]), graph.info(node.inputs[1])
    strides = list(attrs.get("strides", [1, 1]))
    if (not form["pad_channels"] or attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1]))
            or strides[0] != strides[1] or strides[0] < 2 or not all(isinstance(d, int) for d in x.shape[2:])):
        return None
    s, channels = strides[0], x.shape[1]
    best, best_k = None, w.value.shape[2] * w.value.shape[3] * (channels + form["pad_channels"])
    for fold in ((1, s), (s, s)):
        found = _folded(w.value, x.shape[2:], list(attrs.get("pads", [0, 0, 0, 0])), s, fold, channels, multiple)
        if found is not None and found[0] < best_k:
            best_k, best = found
    if best is None:
        return None
    best["attrs"] = {**attrs, **best["attrs"]}
    return best


def _folded(weight, size, pads, s: int, fold: tuple, channels: int, multiple: int):
    """``(K, form)`` of :func:`space_to_depth_form`'s folding ``fold`` (block height and
    width, each 1 or the stride ``s``), or None where a block's taps would give more outputs
    than the Conv."""
    kernel = weight.shape[2:]
    kernels, strides, begins, ends, origins, extra = [], [], [], [], [], []
    for axis in range(2):
        k, b, e, f = kernel[axis], pads[axis], pads[axis + 2], fold[axis]
        if f == 1:  # (this axis keeps its stride and pads)
            kernels.append(k), strides.append(s), begins.append(b), ends.append(e), extra.append(0)
            origins.append([[j] for j in range(k)])
            continue
        out = (size[axis] + b + e - k) // s + 1
        lead = -(-b // s)
        taps = (k - 1 - b) // s + lead + 1
        blocks = -(-size[axis] // s)
        end = (out - 1) - lead + taps - 1 - (blocks - 1)
        if end < 0:  # (the blocks would give more outputs than the Conv)
            return None
        kernels.append(taps), strides.append(1), begins.append(lead), ends.append(end)
        extra.append(blocks * s - size[axis])
        origins.append([[s * (j - lead) + r + b for r in range(s)] for j in range(taps)])
    pixels = fold[0] * fold[1]
    pre = next((p for p in range(multiple) if not (pixels * (channels + p)) % multiple), None)
    post = -(pixels * channels) % multiple
    if pre is None or pixels * (channels + pre) > pixels * channels + post:
        pre = 0
    else:
        post = 0
    depth = pixels * (channels + pre)
    original = np.moveaxis(weight, 1, -1)  # [M, kh, kw, C]
    folded = np.zeros((original.shape[0], kernels[0], kernels[1], depth + post), original.dtype)
    for jh, row in enumerate(origins[0]):
        for jw, column in enumerate(origins[1]):
            for rh, th in enumerate(row):
                for rw, tw in enumerate(column):
                    if 0 <= th < kernel[0] and 0 <= tw < kernel[1]:
                        at = (rh * fold[1] + rw) * (channels + pre)
                        folded[:, jh, jw, at:at + channels] = original[:, th, tw]
    block_attrs = {"kernel_shape": kernels, "strides": strides, "pads": [begins[0], begins[1], ends[0], ends[1]],
                   "dilations": [1, 1]}
    k_total = kernels[0] * kernels[1] * (depth + post)
    return k_total, {"attrs": block_attrs, "weight": folded, "pad_channels": post, "pre_pad": pre,
                     "fold": list(fold), "spatial_pad": extra}


OPS = (ConvNHWC,)
