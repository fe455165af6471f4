"""Col2Im (opset 18): sliding blocks (N, C * prod(block_shape), L) summed back into images
(N, C, *image_shape), the inverse of an im2col with ``dilations``, ``pads`` and ``strides``
(``L`` is the number of block positions). Overlapping blocks add up.

``image_shape`` and ``block_shape`` are inputs; the engine needs them at build time (as
initializers, folded computations or shape-tensor inputs), the reference takes any. Sums
are in the data's dtype (integers wrap), except float16, summed in float32 and rounded
once (ONNX's reference rounds every step to float16). The CUDA kernel is in :mod:`.col2im`.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import NUMERIC_DTYPES, Attr, Example, OpPlugin, TensorInfo

_INT64 = np.dtype(np.int64)


def block_counts(image, block, dilations, pads, strides) -> list[int]:
    """Block positions along each spatial axis."""
    r = len(image)
    return [(image[d] + pads[d] + pads[d + r] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
            for d in range(r)]


def col2im(data, image, block, dilations, pads, strides) -> np.ndarray:
    """Y (N, C, *image) of Col2Im, taps in order (the kernel adds in the same order)."""
    r = len(image)
    taps = math.prod(block)
    n, length = data.shape[0], data.shape[2]
    channels = data.shape[1] // taps
    counts = block_counts(image, block, dilations, pads, strides)
    acc_dtype = np.float32 if data.dtype == np.float16 else data.dtype
    y = np.zeros((n, channels, *image), acc_dtype)
    blocks = data.reshape(n, channels, taps, *counts).astype(acc_dtype)
    for t, offsets in enumerate(np.ndindex(*block)):
        into, take = [slice(None)] * 2, [slice(None), slice(None), t]
        for d in range(r):
            shift = offsets[d] * dilations[d] - pads[d]  # image position of block 0's tap
            first = max(0, -(shift // strides[d]))  # the first block whose tap is inside
            if shift + first * strides[d] < 0:
                first += 1
            last = (image[d] - 1 - shift) // strides[d] if image[d] - 1 - shift >= 0 else -1
            last = min(last, counts[d] - 1)
            if last < first:
                break
            take.append(slice(first, last + 1))
            start = shift + first * strides[d]
            into.append(slice(start, start + (last - first) * strides[d] + 1, strides[d]))
        else:
            y[tuple(into)] += blocks[tuple(take)]
    return y.astype(data.dtype)


class Col2Im(OpPlugin):
    op_type = "Col2Im"
    since_opset = 18
    attributes = (Attr("dilations", "ints", None), Attr("pads", "ints", None), Attr("strides", "ints", None))
    inputs = (3, 3)
    dtypes = NUMERIC_DTYPES

    def geometry(self, node, r: int):
        """``(dilations, pads, strides)`` of ``r`` spatial dims, defaults filled in."""
        a = node.attrs
        dilations = list(a["dilations"] or [1] * r)
        pads = list(a["pads"] or [0] * (2 * r))
        strides = list(a["strides"] or [1] * r)
        if len(dilations) != r or len(pads) != 2 * r or len(strides) != r:
            raise ModelError(f"{node.describe()}: dilations, pads and strides need {r}, {2 * r} and {r} values for "
                             f"{r} spatial dims; got {len(dilations)}, {len(pads)}, {len(strides)}")
        if min(dilations + strides) < 1 or min(pads) < 0:
            raise ModelError(f"{node.describe()}: dilations and strides must be 1 or more and pads 0 or more")
        return dilations, pads, strides

    def check(self, node, inputs):
        data, image, block = inputs
        self.require_dtypes(node, inputs, {_INT64}, which=[1, 2])
        if data.rank != 3 or image.rank != 1 or block.rank != 1:
            raise ModelError(f"{node.describe()}: input is (N, C * prod(block_shape), L), image_shape and "
                             f"block_shape are 1-D; got ranks {data.rank}, {image.rank}, {block.rank}")
        if isinstance(image.shape[0], int) and isinstance(block.shape[0], int) and image.shape[0] != block.shape[0]:
            raise ModelError(f"{node.describe()}: image_shape has {image.shape[0]} dims, block_shape {block.shape[0]}")

    def infer(self, node, inputs):
        data, image, block = inputs
        r = image.shape[0]
        if not isinstance(r, int):
            raise self.unsupported(node, "an image_shape of unknown length", "give image_shape a static shape")
        dims = [f"{node.name}_d{2 + d}" for d in range(r)]
        channels = f"{node.name}_d1"
        if image.value is not None:
            dims = [int(v) for v in image.value.reshape(-1)]
        if block.value is not None:
            kernel = [int(v) for v in block.value.reshape(-1)]
            taps = math.prod(kernel)
            if min(kernel, default=1) < 1:
                raise ShapeError(f"{node.describe()}: block_shape {kernel} has a dim below 1")
            if isinstance(data.shape[1], int):
                if data.shape[1] % taps:
                    raise ShapeError(f"{node.describe()}: input dim 1 ({data.shape[1]}) is no multiple of "
                                     f"prod(block_shape) = {taps}")
                channels = data.shape[1] // taps
            if image.value is not None:
                counts = block_counts(dims, kernel, *self.geometry(node, r))
                if min(counts, default=1) < 1 or (isinstance(data.shape[2], int) and data.shape[2] != math.prod(counts)):
                    raise ShapeError(f"{node.describe()}: {counts} block positions fit image_shape {dims}; input "
                                     f"dim 2 is {data.shape[2]}, it must be their product")
        return [TensorInfo(data.dtype, (data.shape[0], channels, *dims))]

    def reference(self, node, inputs):
        data, image, block = inputs
        image, block = [int(v) for v in image.reshape(-1)], [int(v) for v in block.reshape(-1)]
        return [col2im(data, image, block, *self.geometry(node, len(image)))]

    def tactics(self, node, inputs, outputs):
        from .col2im import col2im_tactic

        data, image, block = inputs
        if image.value is None or block.value is None:
            raise self.unsupported(node, "image_shape or block_shape computed at run time",
                                   "make them initializers, folded computations or shape-tensor inputs")
        image, block = [int(v) for v in image.value.reshape(-1)], [int(v) for v in block.value.reshape(-1)]
        return [col2im_tactic(data, outputs[0], image, block, *self.geometry(node, len(image)))]

    def examples(self):
        f16, f32, f64, i32 = (np.dtype(t) for t in ("float16", "float32", "float64", "int32"))

        def shape(*v):
            return np.array(v, np.int64)

        return [Example((TensorInfo(f32, (2, 6, 9)), shape(4, 5), shape(2, 3)), {}),
                Example((TensorInfo(f32, (1, 8, 6)), shape(5, 5), shape(2, 2)),
                        {"strides": [2, 2], "pads": [1, 0, 0, 1], "dilations": [1, 2]}),
                Example((TensorInfo(f16, (1, 4, 6)), shape(3, 4), shape(2, 2)), {}, rtol=1e-3, atol=1e-3),
                Example((TensorInfo(f64, (1, 8, 6)), shape(3, 3, 4), shape(2, 2, 2)), {"strides": [1, 2, 1]}),
                Example((TensorInfo(i32, (2, 3, 7)), shape(7,), shape(3,)), {"pads": [1, 1]})]


OPS = (Col2Im,)
