"""A 2-D MaxPool tactic whose window is compiled into the kernel.

The owner's kernel serves every rank and geometry from one compiled kernel: each tap of
each output walks a geometry table with 64-bit divisions. Here kernel size, strides,
dilations and begin pads are closure constants of a kernel made per geometry (one
compile each; a network has few), so a thread computes its output's row and column once
and the tap loops unroll. NCHW float32, one output per thread (a grid-stride loop), no Indices output; padding
taps are skipped (MaxPool pads with -inf), NaN propagates as in NumPy's max.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import cuda, elementwise_grid, flat, jit
from plugrt.plugin import Example, Launch, Tactic, TacticProvider, TensorInfo

#: Threads per block of each tactic, best first (measured on the H200 at ResNet-18's MaxPool).
BLOCKS = (256, 128)


class MaxPool2d(TacticProvider):
    """Tactics ``window2d_t256``, ``window2d_t128`` for 2-D float32 MaxPool without Indices."""

    op_type = "MaxPool"
    version = "1.0"
    tactic_names = tuple(f"window2d_t{threads}" for threads in BLOCKS)

    def tactics(self, node, inputs, outputs):
        x, y = inputs[0], outputs[0]
        if x.rank != 4 or x.dtype != np.float32 or len(outputs) != 1 or not all(isinstance(d, int) for d in x.shape):
            return []
        window = geometry(node.attrs, x.shape, y.shape)
        return [window_tactic(window, x.shape, y.shape, threads) for threads in BLOCKS]

    def examples(self):
        x = TensorInfo(np.float32, (1, 2, 6, 7))
        return [
            Example((x,), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, opset=12),
            Example((x,), {"kernel_shape": [2, 3], "strides": [2, 1], "ceil_mode": 1}, opset=12),
            Example((x,), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "dilations": [1, 2]}, opset=12),
        ]


def geometry(attrs, x_shape, y_shape) -> dict:
    """Kernel, strides, dilations and begin pads of the two spatial dims (``auto_pad``
    applied; ``ceil_mode`` only lengthens the output, whose extra taps fall on padding)."""
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in (attrs.get("strides") or [1, 1])]
    dilations = [int(d) for d in (attrs.get("dilations") or [1, 1])]
    pads = [int(p) for p in (attrs.get("pads") or [0, 0, 0, 0])]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    begins = []
    for i in range(2):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            reach = (int(y_shape[2 + i]) - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
            total = max(0, reach - int(x_shape[2 + i]))
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        elif auto_pad == "VALID":
            begins.append(0)
        else:
            begins.append(pads[i])
    return {"kernel": kernel, "strides": strides, "dilations": dilations, "pads": begins}


def window_tactic(window: dict, x_shape, y_shape, threads: int) -> Tactic:
    n, c, h, w = (int(d) for d in x_shape)
    oh, ow = int(y_shape[2]), int(y_shape[3])
    total = n * c * oh * ow
    kernel = max_pool_kernel(*window["kernel"], *window["strides"], *window["dilations"], *window["pads"])

    def launches(ins, outs, workspace):
        blocks, block = elementwise_grid(total, 1, threads)
        args = (flat(outs[0]), flat(ins[0]), np.int64(total), np.int64(h), np.int64(w), np.int64(oh), np.int64(ow))
        return [Launch(kernel, blocks, block, args)]

    return Tactic(f"window2d_t{threads}", launches, {**window, "threads": threads})


@functools.lru_cache(maxsize=None)
def max_pool_kernel(kh, kw, sh, sw, dh, dw, ph, pw):
    """The kernel for one window geometry (every argument a compile-time constant)."""
    low = np.float32(-math.inf)

    @jit(device=True)
    def window_max(x, row0, col0, base, h, w):
        best = low
        for a in range(kh):
            row = row0 + a * dh
            if 0 <= row < h:
                start = base + row * w
                for b in range(kw):
                    col = col0 + b * dw
                    if 0 <= col < w:
                        value = x[start + col]
                        if value > best or value != value:
                            best = value
                            if value != value:
                                return best
        return best

    @cuda.jit
    def max_pool_2d(y, x, total, h, w, oh, ow):
        for i in range(cuda.grid(1), total, cuda.gridsize(1)):  # one pass on a GPU; the simulator has few threads
            col = i % ow
            rest = i // ow
            row = rest % oh
            plane = rest // oh
            y[i] = window_max(x, row * sh - ph, col * sw - pw, plane * h * w, h, w)

    return max_pool_2d
