"""CUDA tactics of the per-channel normalizations: BatchNormalization (inference and
training) and LRN.

BatchNormalization in inference form is ``y = (x - mean[c]) * a[c] + bias[c]`` with
``a = scale / sqrt(var + epsilon)``: computed on the host when the four parameters are
build-time constants (as in exported models), else by a small prologue kernel into the
workspace. Training mode reuses the row kernel on the view rows = channels, columns =
(N, D1, ...), then updates the running statistics.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic

from .row_norm import VARIANCE, ParamIndex, RowNorm, RowView, accumulator, PER_ROW


def channel_layout(x_shape, p_shape) -> tuple[int, int] | None:
    """(channels, inner) of a parameter of ``p_shape`` over X's dim 1 on, or ``None``.

    ``[C]`` gives (C, prod(D1, ...)); ``[C, D1, ...]`` (BatchNorm ``spatial=0``) gives
    (C * D1 * ..., the rest).
    """
    p_shape = tuple(int(d) for d in p_shape)
    tail = tuple(int(d) for d in x_shape[1:])
    if tail[:len(p_shape)] != p_shape:
        return None
    return int(np.prod(p_shape, dtype=np.int64)), int(np.prod(tail[len(p_shape):], dtype=np.int64))


# --------------------------------------------------------------------------- kernels


@functools.lru_cache(maxsize=None)
def channel_affine_kernel(acc_name: str):
    """``y[i] = (x[i] - m[c]) * a[c] + b[c]`` with ``c = (i // inner) % channels``."""
    acc = np.dtype(acc_name).type

    @jit
    def kernel(x, y, n, inner, channels, m, a, b):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            c = (i // inner) % channels
            y[i] = (acc(x[i]) - acc(m[c])) * acc(a[c]) + acc(b[c])

    return kernel


@functools.lru_cache(maxsize=None)
def batchnorm_factor_kernel(acc_name: str):
    """``a[c] = scale[c] / sqrt(var[c] + eps)``: the runtime-parameter prologue."""
    acc = np.dtype(acc_name).type

    @jit
    def kernel(scale, var, eps, a, channels):
        for c in range(cuda.grid(1), channels, cuda.gridsize(1)):
            a[c] = acc(scale[c]) / math.sqrt(acc(var[c]) + eps)

    return kernel


@functools.lru_cache(maxsize=None)
def running_stats_kernel(acc_name: str):
    """``out = old * momentum + batch * (1 - momentum)`` per channel."""
    acc = np.dtype(acc_name).type
    one = acc(1)

    @jit
    def kernel(old, batch, momentum, out, channels):
        for c in range(cuda.grid(1), channels, cuda.gridsize(1)):
            out[c] = acc(old[c]) * momentum + acc(batch[c]) * (one - momentum)

    return kernel


@jit
def copy_kernel(src, dst, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[i] = src[i]


@functools.lru_cache(maxsize=None)
def lrn_kernel(acc_name: str):
    """``y = x / (bias + alpha / size * sum of x^2 over the channel window) ** beta``."""
    acc = np.dtype(acc_name).type
    zero = acc(0)

    @jit
    def kernel(x, y, n, inner, channels, below, above, alpha_over_size, beta, bias):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            c = (i // inner) % channels
            start = i - c * inner
            lo = max(c - below, 0)
            hi = min(c + above, channels - 1)
            total = zero
            for k in range(lo, hi + 1):
                v = acc(x[start + k * inner])
                total += v * v
            y[i] = acc(x[i]) / math.pow(bias + alpha_over_size * total, beta)

    return kernel


# --------------------------------------------------------------------------- tactics


def _launch_1d(kernel, n: int, *args) -> Launch:
    blocks, threads = grid_1d(n)
    return Launch(kernel, blocks, threads, args)


def _copies(ins, outs, pairs) -> list[Launch]:
    """Copy input -> output for each (input, output) position whose output is present."""
    launches = []
    for src, dst in pairs:
        if dst < len(outs) and outs[dst] is not None:
            n = int(np.prod(outs[dst].shape, dtype=np.int64))
            if n:
                launches.append(_launch_1d(copy_kernel, n, flat(ins[src]), flat(outs[dst]), np.int64(n)))
    return launches


def batchnorm_inference_tactics(x_info, params, epsilon: float) -> list[Tactic]:
    """Tactics for inference-form BatchNormalization.

    :param params: the TensorInfo of scale, bias, mean, var. Returns ``[]`` when their
        shapes do not fit X (the caller reports that as unsupported).
    """
    acc = accumulator(x_info.dtype)
    x_shape = tuple(int(d) for d in x_info.shape)
    n = int(np.prod(x_shape, dtype=np.int64))
    kernel = channel_affine_kernel(acc.name)
    values = [p.value for p in params]
    tactics = []

    if all(v is not None for v in values):
        scale, bias, mean, var = (np.asarray(v, dtype=np.float64) for v in values)
        a, b, m = np.broadcast_arrays(scale / np.sqrt(var + epsilon), bias, mean)
        layout = channel_layout(x_shape, a.shape)
        if layout is not None:
            channels, inner = layout
            host = [np.ascontiguousarray(t.reshape(-1), dtype=acc) for t in (m, a, b)]

            def const_launches(ins, outs, workspace):
                launches = _copies(ins, outs, [(3, 1), (4, 2)])
                if n:
                    m_d, a_d, b_d = (to_device(t) for t in host)
                    launches.insert(0, _launch_1d(kernel, n, flat(ins[0]), flat(outs[0]), np.int64(n),
                                                  np.int64(max(inner, 1)), np.int64(channels), m_d, a_d, b_d))
                return launches

            tactics.append(Tactic("channel_affine_const", const_launches))

    shapes = {tuple(int(d) for d in p.shape) for p in params}
    layout = channel_layout(x_shape, next(iter(shapes))) if len(shapes) == 1 else None
    if layout is not None:
        channels, inner = layout
        factor = batchnorm_factor_kernel(acc.name)

        def runtime_launches(ins, outs, workspace):
            launches = _copies(ins, outs, [(3, 1), (4, 2)])
            if n:
                a = workspace.view(acc)[:channels]
                launches[:0] = [
                    _launch_1d(factor, channels, flat(ins[1]), flat(ins[4]), acc.type(epsilon), a, np.int64(channels)),
                    _launch_1d(kernel, n, flat(ins[0]), flat(outs[0]), np.int64(n), np.int64(max(inner, 1)),
                               np.int64(channels), flat(ins[3]), a, flat(ins[2])),
                ]
            return launches

        tactics.append(Tactic("channel_affine", runtime_launches, workspace_bytes=max(channels, 1) * acc.itemsize))
    return tactics


def batchnorm_training_tactics(x_info, epsilon: float, momentum: float) -> list[Tactic]:
    """Tactics for ``training_mode=1``: batch statistics per channel over (N, D1, ...),
    Y normalized with them, outputs 1 and 2 the updated running mean and variance."""
    acc = accumulator(x_info.dtype)
    shape = tuple(int(d) for d in x_info.shape)
    channels = shape[1]
    view = RowView(shape, (0,) + tuple(range(2, len(shape))))
    per_channel = ParamIndex(PER_ROW, max(channels, 1))
    norm = RowNorm(view, acc, epsilon, scale=1, scale_index=per_channel, bias=2, bias_index=per_channel,
                   second_stat=VARIANCE)
    running = running_stats_kernel(acc.name)

    def make(tactic: Tactic) -> Tactic:
        bx, by = tactic.params["block"]

        def launches(ins, outs, workspace):
            stats = workspace.view(acc)
            batch_mean, batch_var = stats[:max(channels, 1)], stats[max(channels, 1):2 * max(channels, 1)]
            result = norm.launches(ins, outs, None, bx=bx, by=by, stats=(batch_mean, batch_var))
            for old, batch, out in ((3, batch_mean, 1), (4, batch_var, 2)):
                if channels and out < len(outs) and outs[out] is not None:
                    result.append(_launch_1d(running, channels, flat(ins[old]), batch, acc.type(momentum),
                                             flat(outs[out]), np.int64(channels)))
            return result

        return Tactic(tactic.name, launches, dict(tactic.params), 2 * max(channels, 1) * acc.itemsize)

    return [make(t) for t in norm.tactics()]


def lrn_tactics(x_info, size: int, alpha: float, beta: float, bias: float) -> list[Tactic]:
    acc = accumulator(x_info.dtype)
    shape = tuple(int(d) for d in x_info.shape)
    n = int(np.prod(shape, dtype=np.int64))
    channels, inner = shape[1], int(np.prod(shape[2:], dtype=np.int64))
    kernel = lrn_kernel(acc.name)
    scalars = (np.int64((size - 1) // 2), np.int64(size // 2), acc.type(alpha / size), acc.type(beta), acc.type(bias))

    def launches(ins, outs, workspace):
        if n == 0:
            return []
        return [_launch_1d(kernel, n, flat(ins[0]), flat(outs[0]), np.int64(n), np.int64(max(inner, 1)),
                           np.int64(channels), *scalars)]

    return [Tactic("channel_window", launches)]
