"""NonMaxSuppression (opset 10, 11+): per batch and class, the boxes kept greedily by score,
as ONNX's reference (and onnxruntime) selects them.

Boxes whose score is above ``score_threshold`` (all of them without one) are taken in
score order, equal scores lower index first; a box is kept unless its IoU with a box
already kept in its class exceeds ``iou_threshold``, until ``max_output_boxes_per_class``
(0 or absent: none) are kept. Boxes are ``[y1, x1, y2, x2]`` (either corner first) or,
with ``center_point_box=1``, ``[x_center, y_center, width, height]``; IoU arithmetic is in
float32, as the reference computes it. Output: ``(selected, 3)`` int64 rows
``[batch, class, box]``, batch by batch, class by class, in selection order.

How many boxes survive is the data. Where the inputs' values are known when the engine is
specialized (constants, or shape-tensor inputs) the node runs on the host, like a shape
computation; boxes or scores computed on the device run the greedy tactic
(:func:`.nms.nms_tactic`) as a data-dependent layer, its output sized for every class
keeping its most boxes (:meth:`NonMaxSuppression.output_bounds`).
"""

from __future__ import annotations

import numpy as np

from plugrt import ModelError
from plugrt.plugin import Attr, OpPlugin, TensorInfo, optional

from .nms import nms_tactic

_F32, _INT64 = np.dtype(np.float32), np.dtype(np.int64)


def _scalar(array, default):
    """The first value of an optional 1-element input (``default`` when absent or empty)."""
    if array is None or np.size(array) == 0:
        return default
    return np.asarray(array).reshape(-1)[0]


def _extents(boxes, center: bool):
    """``(y_min, x_min, y_max, x_max)`` of ``boxes`` (..., 4), in float32."""
    b = boxes.astype(np.float32)
    if center:
        half_w, half_h = b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
        return b[..., 1] - half_h, b[..., 0] - half_w, b[..., 1] + half_h, b[..., 0] + half_w
    return (np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
            np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3]))


def suppressed(box, kept, iou_threshold) -> bool:
    """Whether ``box`` (its 4 extents) overlaps any of ``kept`` (4 arrays) by IoU above the
    threshold (an empty intersection or a degenerate box never suppresses)."""
    y0, x0, y1, x1 = box
    ky0, kx0, ky1, kx1 = kept
    inter_w = np.minimum(x1, kx1) - np.maximum(x0, kx0)
    inter_h = np.minimum(y1, ky1) - np.maximum(y0, ky0)
    inter = inter_w * inter_h
    area, kept_area = (x1 - x0) * (y1 - y0), (kx1 - kx0) * (ky1 - ky0)
    union = area + kept_area - inter
    valid = (inter_w > 0) & (inter_h > 0) & (inter > 0) & (area > 0) & (kept_area > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / union
    return bool(np.any(valid & (iou > iou_threshold)))


def non_max_suppression(boxes, scores, max_per_class: int, iou_threshold, score_threshold, center: bool):
    """The selected ``[batch, class, box]`` rows (int64, (selected, 3))."""
    extents = _extents(boxes, center)
    rows = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            class_scores = scores[b, c]
            candidates = np.arange(class_scores.shape[0])
            if score_threshold is not None:
                candidates = candidates[class_scores > score_threshold]
            order = candidates[np.lexsort((candidates, -class_scores[candidates].astype(np.float64)))]
            kept: list[int] = []
            for index in order:
                if len(kept) >= max_per_class:
                    break
                box = [e[b, index] for e in extents]
                if kept and suppressed(box, [e[b, kept] for e in extents], iou_threshold):
                    continue
                kept.append(int(index))
                rows.append((b, c, int(index)))
    return np.array(rows, np.int64).reshape(len(rows), 3)


class NonMaxSuppression(OpPlugin):
    op_type = "NonMaxSuppression"
    since_opset = 10
    attributes = (Attr("center_point_box", "int", 0),)
    inputs = (2, 5)
    dtypes = frozenset({_F32, _INT64})

    def check(self, node, inputs):
        self.require_dtypes(node, inputs, {_F32}, which=[0, 1, 3, 4])
        self.require_dtypes(node, inputs, {_INT64}, which=[2])
        boxes, scores = inputs[0], inputs[1]
        if node.attrs["center_point_box"] not in (0, 1):
            raise ModelError(f"{node.describe()}: center_point_box={node.attrs['center_point_box']}; it is 0 or 1")
        if boxes.rank != 3 or scores.rank != 3:
            raise ModelError(f"{node.describe()}: boxes are (batches, boxes, 4) and scores (batches, classes, "
                             f"boxes); got ranks {boxes.rank} and {scores.rank}")
        pairs = ((boxes.shape[0], scores.shape[0]), (boxes.shape[1], scores.shape[2]), (boxes.shape[2], 4))
        if any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in pairs):
            raise ModelError(f"{node.describe()}: boxes {list(boxes.shape)} and scores {list(scores.shape)} do "
                             "not match as (batches, boxes, 4) and (batches, classes, boxes)")

    def infer(self, node, inputs):
        present = [i for i in inputs if i is not None]
        if all(i.value is not None for i in present):
            values = [None if i is None else i.value for i in inputs]
            return [TensorInfo.of(self.reference(node, values)[0])]
        return [TensorInfo(_INT64, (f"{node.name}_d0", 3))]

    def reference(self, node, inputs):
        boxes, scores = inputs[0], inputs[1]
        max_per_class = max(int(_scalar(optional(inputs, 2), 0)), 0)
        iou_threshold = np.float32(_scalar(optional(inputs, 3), 0.0))
        score_threshold = _scalar(optional(inputs, 4), None)
        if score_threshold is not None:
            score_threshold = np.float32(score_threshold)
        return [non_max_suppression(boxes, scores, max_per_class, iou_threshold, score_threshold,
                                    bool(node.attrs["center_point_box"]))]

    def output_bounds(self, node, inputs):
        """Every class keeping ``max_output_boxes_per_class`` boxes (known at build time),
        or all of them."""
        batches, boxes = (int(d) for d in inputs[0].shape[:2])
        limit = optional(inputs, 2)
        most = boxes if limit is not None and limit.value is None else max(int(_scalar(
            None if limit is None else limit.value, 0)), 0)
        return [(batches * int(inputs[1].shape[1]) * min(most, boxes), 3)]

    def tactics(self, node, inputs, outputs):
        if not all(i is None or i.is_static for i in inputs):
            raise self.unsupported(node, "inputs of shapes not known at build time",
                                   "give the boxes and scores a profile")
        return [nms_tactic(list(inputs), bool(node.attrs["center_point_box"]))]


OPS = (NonMaxSuppression,)
