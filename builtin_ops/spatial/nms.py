"""CUDA tactic of NonMaxSuppression with boxes or scores computed on the device: a
data-dependent layer (:meth:`plugrt.plugin.OpPlugin.output_bounds`), the count of boxes
kept being the data. It selects as :func:`.nms_ops.non_max_suppression` does:

1. one block per (batch, class): each candidate (score above the threshold, when there is
   one) is ranked by counting the candidates before it (higher score, or equal score and
   lower index), which orders them; then the block keeps boxes greedily in that order,
   its threads testing a box against the boxes kept so far together (float32 IoU, the
   reference's arithmetic), until ``max_output_boxes_per_class`` are kept;
2. one thread turns each class's count into its first row's position and writes the
   output's shape, ``(selected, 3)``;
3. each block writes its class's ``[batch, class, box]`` rows.

Scalar operands (max boxes, IoU and score thresholds) are read on the device from
one-element arrays: copies of values known at build time, or the runtime inputs.
"""

from __future__ import annotations

import numpy as np
from numba import float32, int64

from plugrt.kernels import MAX_BLOCKS, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic


@jit(device=True)
def _extents(boxes, base, center):
    """``(y_min, x_min, y_max, x_max)`` of the box at ``boxes[base:base + 4]``."""
    a = boxes[base]
    b = boxes[base + 1]
    c = boxes[base + 2]
    d = boxes[base + 3]
    if center != 0:
        half_w = c / float32(2)
        half_h = d / float32(2)
        return b - half_h, a - half_w, b + half_h, a + half_w
    return min(a, c), min(b, d), max(a, c), max(b, d)


@jit(device=True)
def _suppresses(boxes, box, kept, center, threshold):
    """Whether the kept box at ``kept`` overlaps the box at ``box`` by IoU above
    ``threshold`` (an empty intersection or a degenerate box never suppresses)."""
    y0, x0, y1, x1 = _extents(boxes, box, center)
    ky0, kx0, ky1, kx1 = _extents(boxes, kept, center)
    inter_w = min(x1, kx1) - max(x0, kx0)
    inter_h = min(y1, ky1) - max(y0, ky0)
    inter = inter_w * inter_h
    area = (x1 - x0) * (y1 - y0)
    kept_area = (kx1 - kx0) * (ky1 - ky0)
    union = area + kept_area - inter
    if inter_w > 0 and inter_h > 0 and inter > 0 and area > 0 and kept_area > 0 and union > 0:
        return inter / union > threshold
    return False


@jit
def nms_select_kernel(boxes, scores, n, classes, pairs, limit, iou, score_min, has_min, center, order, kept, counts):
    """Per (batch, class) pair: ``kept[pair * n:]`` the boxes kept, ``counts[pair]`` how many."""
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    most = max(limit[0], int64(0))
    threshold = iou[0]
    floor = score_min[0]
    for pair in range(cuda.blockIdx.x, pairs, cuda.gridDim.x):
        base = pair * n
        batch = pair // classes
        for i in range(t, n, width):
            s = scores[base + i]
            if has_min == 0 or s > floor:
                rank = 0
                for j in range(n):
                    other = scores[base + j]
                    if (has_min == 0 or other > floor) and (other > s or (other == s and j < i)):
                        rank += 1
                order[base + rank] = i
        candidates = 0
        for start in range(0, n, width):
            i = start + t
            flag = 0
            if i < n and (has_min == 0 or scores[base + i] > floor):
                flag = 1
            candidates += cuda.syncthreads_count(flag)
        count = int64(0)
        for p in range(candidates):
            if count >= most:
                break
            box = order[base + p]
            hit = 0
            for q in range(t, count, width):
                if _suppresses(boxes, (batch * n + box) * 4, (batch * n + kept[base + q]) * 4, center, threshold):
                    hit = 1
            if cuda.syncthreads_or(hit) == 0:
                if t == 0:
                    kept[base + count] = box
                count += 1
                cuda.syncthreads()
        if t == 0:
            counts[pair] = count
        cuda.syncthreads()


@jit
def nms_offsets_kernel(counts, offsets, pairs, shape):
    """Each pair's first row, and the output's shape ``(selected, 3)``."""
    if cuda.grid(1) == 0:
        total = int64(0)
        for pair in range(pairs):
            offsets[pair] = total
            total += counts[pair]
        shape[0] = total
        shape[1] = 3


@jit
def nms_write_kernel(kept, counts, offsets, n, classes, pairs, out):
    for pair in range(cuda.blockIdx.x, pairs, cuda.gridDim.x):
        for q in range(cuda.threadIdx.x, counts[pair], cuda.blockDim.x):
            row = (offsets[pair] + q) * 3
            out[row] = pair // classes
            out[row + 1] = pair % classes
            out[row + 2] = kept[pair * n + q]


def _scalar(info, array, dtype, default):
    """A one-element device array: the value known at build time (``default`` when the
    input is absent or empty), else the runtime input."""
    if info is None or (info.value is not None and np.size(info.value) == 0):
        return to_device(np.array([default], dtype))
    if info.value is not None:
        return to_device(np.asarray(info.value, dtype).reshape(-1)[:1])
    return flat(array)


def nms_tactic(inputs, center: bool) -> Tactic:
    """NonMaxSuppression of ``inputs`` (their infos: shapes static; scalars with values
    where known) as a data-dependent layer."""
    batches, n = (int(d) for d in inputs[0].shape[:2])
    classes = int(inputs[1].shape[1])
    pairs = batches * classes
    scalars = [inputs[k] if k < len(inputs) else None for k in (2, 3, 4)]
    has_min = scalars[2] is not None and not (scalars[2].value is not None and np.size(scalars[2].value) == 0)

    def launches(ins, outs, workspace):
        order, kept, counts, offsets = _split(workspace, pairs, n)
        limit = _scalar(scalars[0], ins[2] if len(ins) > 2 else None, np.int64, 0)
        iou = _scalar(scalars[1], ins[3] if len(ins) > 3 else None, np.float32, 0.0)
        floor = _scalar(scalars[2], ins[4] if len(ins) > 4 else None, np.float32, 0.0)
        _, threads = grid_1d(n)
        blocks = max(1, min(pairs, MAX_BLOCKS))
        return [Launch(nms_select_kernel, blocks, threads,
                       (flat(ins[0]), flat(ins[1]), np.int64(n), np.int64(classes), np.int64(pairs), limit, iou,
                        floor, np.int64(has_min), np.int64(center), order, kept, counts)),
                Launch(nms_offsets_kernel, 1, 1, (counts, offsets, np.int64(pairs), outs[-1])),
                Launch(nms_write_kernel, blocks, threads,
                       (kept, counts, offsets, np.int64(n), np.int64(classes), np.int64(pairs), flat(outs[0])))]

    return Tactic("greedy", launches, workspace_bytes=8 * (2 * pairs * max(n, 1) + 2 * pairs))


def _split(workspace, pairs: int, n: int):
    """The workspace as the kernels' int64 arrays: order, kept (a row of ``n`` per pair),
    counts and offsets (one per pair)."""
    words = workspace.view(np.int64)
    rows = pairs * max(n, 1)
    return words[:rows], words[rows:2 * rows], words[2 * rows:2 * rows + pairs], words[2 * rows + pairs:2 * rows + 2 * pairs]
