"""CUDA tactics of STFTMagnitude: frame into the workspace, then a DFT per frame.

Both tactics run two kernels over one workspace laid out as float32
``[rows, frame_length]`` with ``rows = batch * frames`` (row ``b * frames + t`` is frame
``t`` of signal ``b``):

1. :func:`frame_kernel` cuts the (optionally reflect-padded) signal into frames and
   multiplies each by the window, one workspace element per thread-step;
2. a DFT kernel reads the windowed frames back and writes
   ``|sum_m frame[m] * exp(-2*pi*i*k*m / n_fft)|`` for every bin ``k``. Zero padding to
   ``n_fft`` adds nothing to the sum, so only ``frame_length`` terms are summed. The
   twiddles come from a host table of ``cos``/``sin(2*pi*j / n_fft)`` (computed in float64,
   stored as float32) indexed by ``(k * m) mod n_fft``, kept exactly in integers, so no
   angle error grows with ``k * m``.

``direct`` gives each thread one (frame, bin) output and reads the frame and twiddles from
global memory; ``shared`` gives each block one frame at a time and stages the twiddle table
(once per block) and the frame (once per row) in dynamic shared memory, where its threads
share them across bins (offered while both fit in 48 KiB).
"""

from __future__ import annotations

import math

import numpy as np
from numba import float32

from plugrt.kernels import cuda, elementwise_grid, flat, jit, rows_grid, to_device
from plugrt.plugin import Launch, Tactic

ZERO = np.float32(0.0)  # a float32 constant (float32(0.0) in a kernel truncates a double)

#: Shared memory the ``shared`` tactic may stage (float32 words: 48 KiB, the default
#: per-block limit needing no opt-in): ``2 * n_fft + frame_length`` must fit.
SHARED_WORDS_LIMIT = 12 * 1024


@jit
def frame_kernel(x, frames_ws, rows, frames, n, length, hop, pad, window):
    """``frames_ws[r, m] = x[b, reflect(t * hop + m - pad)] * window[m]``, ``r = b * frames + t``.

    ``x`` is the flat [batch * n] signal; ``pad`` is 0 without centering. Reflection
    (``x[-1] = x[1]``) is valid while ``pad < n``; the plugin checks that.
    """
    total = rows * length
    for i in range(cuda.grid(1), total, cuda.gridsize(1)):
        r = i // length
        m = i - r * length
        b = r // frames
        t = r - b * frames
        j = t * hop + m - pad
        if j < 0:
            j = -j
        if j >= n:
            j = 2 * (n - 1) - j
        frames_ws[i] = x[b * n + j] * window[m]


@jit
def dft_direct_kernel(frames_ws, out, rows, length, bins, n_fft, cos_table, sin_table):
    """``out[r, k] = |DFT_n_fft(frames_ws[r])[k]|``, one (row, bin) per thread-step."""
    total = rows * bins
    for i in range(cuda.grid(1), total, cuda.gridsize(1)):
        r = i // bins
        k = i - r * bins
        base = r * length
        re = ZERO
        im = ZERO
        twiddle = 0  # (k * m) mod n_fft
        for m in range(length):
            v = frames_ws[base + m]
            re += v * cos_table[twiddle]
            im += v * sin_table[twiddle]
            twiddle += k
            if twiddle >= n_fft:
                twiddle -= n_fft
        out[i] = math.sqrt(re * re + im * im)


@jit
def dft_shared_kernel(frames_ws, out, rows, length, bins, n_fft, cos_table, sin_table):
    """Like :func:`dft_direct_kernel`, one block per row, everything it rereads in dynamic
    shared memory laid out as ``[cos (n_fft) | sin (n_fft) | frame (length)]`` float32: the
    twiddles are staged once per block, the frame once per row; threads stride the bins."""
    staged = cuda.shared.array(0, dtype=float32)
    tx = cuda.threadIdx.x
    step = cuda.blockDim.x
    frame = 2 * n_fft
    for j in range(tx, n_fft, step):
        staged[j] = cos_table[j]
        staged[n_fft + j] = sin_table[j]
    for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):  # the same trip count in the whole block
        base = r * length
        for m in range(tx, length, step):
            staged[frame + m] = frames_ws[base + m]
        cuda.syncthreads()
        for k in range(tx, bins, step):
            re = ZERO
            im = ZERO
            twiddle = 0
            for m in range(length):
                v = staged[frame + m]
                re += v * staged[twiddle]
                im += v * staged[n_fft + twiddle]
                twiddle += k
                if twiddle >= n_fft:
                    twiddle -= n_fft
            out[r * bins + k] = math.sqrt(re * re + im * im)
        cuda.syncthreads()  # the frame is overwritten next trip


def twiddle_tables(n_fft: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` of ``2*pi*j / n_fft`` for ``j < n_fft``, float32 (computed in float64)."""
    angle = 2.0 * np.pi * np.arange(n_fft, dtype=np.float64) / n_fft
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def stft_tactics(batch: int, n: int, frames: int, length: int, hop: int, pad: int, n_fft: int,
                 window: np.ndarray) -> list[Tactic]:
    """The tactics of one STFTMagnitude node at concrete shapes, best first.

    :param window: the float64 window of ``length`` samples (the plugin makes it).
    """
    rows = batch * frames
    bins = n_fft // 2 + 1
    workspace_bytes = 4 * rows * length
    window32 = np.ascontiguousarray(window, dtype=np.float32)
    cos_table, sin_table = twiddle_tables(n_fft)
    sizes = (np.int64(rows), np.int64(length), np.int64(bins), np.int64(n_fft))
    shared_words = 2 * n_fft + length

    def frame_launch(x, frames_ws) -> Launch:
        grid, block = elementwise_grid(rows * length)
        args = (flat(x), frames_ws, np.int64(rows), np.int64(frames), np.int64(n), np.int64(length),
                np.int64(hop), np.int64(pad), to_device(window32))
        return Launch(frame_kernel, grid, block, args)

    def workspace_frames(workspace):
        return workspace[:workspace_bytes].view(np.float32)

    def direct(ins, outs, workspace):
        frames_ws = workspace_frames(workspace)
        grid, block = elementwise_grid(rows * bins)
        dft = Launch(dft_direct_kernel, grid, block,
                     (frames_ws, flat(outs[0])) + sizes + (to_device(cos_table), to_device(sin_table)))
        return [frame_launch(ins[0], frames_ws), dft]

    def shared(ins, outs, workspace):
        frames_ws = workspace_frames(workspace)
        threads = min(256, max(32, -(-bins // 32) * 32))
        grid, block = rows_grid(rows, threads)
        dft = Launch(dft_shared_kernel, grid, block,
                     (frames_ws, flat(outs[0])) + sizes + (to_device(cos_table), to_device(sin_table)),
                     shared_bytes=4 * shared_words)
        return [frame_launch(ins[0], frames_ws), dft]

    def empty(ins, outs, workspace):
        return []  # a batch of no signals: nothing to compute

    if rows == 0:
        return [Tactic("empty", empty, {}, 0)]
    found = []
    if shared_words <= SHARED_WORDS_LIMIT:  # frames and twiddles read from global memory once, not per bin
        found.append(Tactic("shared", shared, {"algorithm": "dft", "frame_read": "shared"}, workspace_bytes))
    found.append(Tactic("direct", direct, {"algorithm": "dft", "frame_read": "global"}, workspace_bytes))
    return found
