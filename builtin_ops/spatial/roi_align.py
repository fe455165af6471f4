"""CUDA tactic of RoiAlign: one thread per output element (roi, channel, bin row, bin
column) walks its bin's sample points, as :func:`.roi_align_ops.roi_align` does, in the
same order and the same arithmetic (float32 for float16 and float32 data, float64 for
float64). An roi whose batch index is outside X gives zeros (the reference refuses it).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import float32, float64, int64

from plugrt.kernels import cuda, flat, grid_1d, jit
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type, maximum


@functools.lru_cache(maxsize=None)
def _sample(ct, load):
    """``sample(x, base, height, width, yy, xx)``: the four weighted corner values of a
    bilinear sample at ``(yy, xx)`` of the map at ``x[base:]`` (weights 0 at pixel (0, 0)
    for a point more than a pixel outside)."""
    zero, one = ct(0), ct(1)

    @jit(device=True)
    def sample(x, base, height, width, yy, xx):
        if yy < -one or yy > ct(height) or xx < -one or xx > ct(width):
            v = zero * load(x, base)
            return v, v, v, v
        y = max(yy, zero)
        x_pos = max(xx, zero)
        y_low = int64(y)
        x_low = int64(x_pos)
        if y_low >= height - 1:
            y_low = height - 1
            y_high = y_low
            ly = zero
        else:
            y_high = y_low + 1
            ly = y - ct(y_low)
        if x_low >= width - 1:
            x_low = width - 1
            x_high = x_low
            lx = zero
        else:
            x_high = x_low + 1
            lx = x_pos - ct(x_low)
        hy = one - ly
        hx = one - lx
        v1 = hy * hx * load(x, base + y_low * width + x_low)
        v2 = hy * lx * load(x, base + y_low * width + x_high)
        v3 = ly * hx * load(x, base + y_high * width + x_low)
        v4 = ly * lx * load(x, base + y_high * width + x_high)
        return v1, v2, v3, v4

    return sample


@functools.lru_cache(maxsize=None)
def roi_align_kernel(dtype: str, is_max: bool, half_pixel: bool):
    """``kernel(y, x, rois, batch_indices, n_out, batch, channels, height, width, out_h,
    out_w, sampling_ratio, scale)`` over Y's ``n_out`` elements."""
    ct = float64 if np.dtype(dtype) == np.float64 else float32
    load = compute_type(dtype)[2]
    sample = _sample(ct, load)
    zero, one, half = ct(0), ct(1), ct(0.5)
    offset = half if half_pixel else zero

    @jit
    def kernel(y, x, rois, batch_indices, n_out, batch, channels, height, width, out_h, out_w, sampling_ratio,
               scale):
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            pw = i % out_w
            rest = i // out_w
            ph = rest % out_h
            rest //= out_h
            c = rest % channels
            r = rest // channels
            b = batch_indices[r]
            if b < 0 or b >= batch:
                y[i] = zero
                continue
            start_w = load(rois, r * 4) * scale - offset
            start_h = load(rois, r * 4 + 1) * scale - offset
            roi_w = (load(rois, r * 4 + 2) * scale - offset) - start_w
            roi_h = (load(rois, r * 4 + 3) * scale - offset) - start_h
            if not half_pixel:  # malformed ROIs become 1x1
                roi_w = max(roi_w, one)
                roi_h = max(roi_h, one)
            bin_h = roi_h / ct(out_h)
            bin_w = roi_w / ct(out_w)
            grid_h = sampling_ratio
            grid_w = sampling_ratio
            if sampling_ratio <= 0:
                grid_h = int64(math.ceil(roi_h / ct(out_h)))
                grid_w = int64(math.ceil(roi_w / ct(out_w)))
            base = (b * channels + c) * height * width
            acc = zero
            first = True
            for iy in range(grid_h):
                yy = start_h + ct(ph) * bin_h + (ct(iy) + half) * bin_h / ct(grid_h)
                for ix in range(grid_w):
                    xx = start_w + ct(pw) * bin_w + (ct(ix) + half) * bin_w / ct(grid_w)
                    v1, v2, v3, v4 = sample(x, base, height, width, yy, xx)
                    if is_max:
                        value = maximum(maximum(maximum(v1, v2), v3), v4)
                        acc = value if first else maximum(acc, value)
                        first = False
                    else:
                        acc += v1 + v2 + v3 + v4
            if not is_max:
                acc = acc / ct(max(grid_h * grid_w, 1))
            y[i] = acc

    return kernel


def roi_align_tactic(x_info, y_info, settings: dict) -> Tactic:
    """The one-thread-per-output-element tactic for :func:`.roi_align_ops.roi_align`'s
    keyword ``settings``."""
    batch, channels, height, width = (int(d) for d in x_info.shape)
    n_out = math.prod(int(d) for d in y_info.shape)
    dtype = np.dtype(x_info.dtype)
    ct = np.float64 if dtype == np.float64 else np.float32
    kernel_args = (dtype.str, settings["mode"] == "max", settings["half_pixel"])

    def launches(inputs, outputs, workspace):
        if n_out == 0:
            return []
        blocks, threads = grid_1d(n_out)
        args = (flat(outputs[0]), flat(inputs[0]), flat(inputs[1]), flat(inputs[2]), np.int64(n_out),
                np.int64(batch), np.int64(channels), np.int64(height), np.int64(width),
                np.int64(settings["output_height"]), np.int64(settings["output_width"]),
                np.int64(settings["sampling_ratio"]), ct(settings["spatial_scale"]))
        return [Launch(roi_align_kernel(*kernel_args), blocks, threads, args)]

    return Tactic("element", launches, {})
