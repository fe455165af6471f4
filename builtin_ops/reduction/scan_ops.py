"""CumSum, CumProd and TopK: ops that run along one axis of X, line by line, as the
reductions do, but keep (CumSum, CumProd) or select (TopK) elements instead of folding them
into one.

The scans' axis (an input) and TopK's K (an input) must be constants for the engine (the
kernels are planned around them); the references take any value.
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import FLOAT_DTYPES, NUMERIC_DTYPES, REDUCTION, Attr, Example, OpPlugin, TensorInfo

from .ops import _normalize_axis

_INDEX_DTYPES = frozenset(np.dtype(t) for t in ("int32", "int64"))
_SCAN_DTYPES = FLOAT_DTYPES | {np.dtype(t) for t in ("int32", "int64", "uint32", "uint64")}


def _scalar(node, what: str, value) -> int:
    """The one integer of a 0-D or 1-element tensor (CumSum's axis, TopK's K)."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"{node.describe()}: {what} must hold one value, got shape {list(array.shape)}")
    return int(array.reshape(-1)[0])


def _one_element(info) -> bool:
    """Whether a tensor of ``info`` may hold exactly one element (0-D, or 1-D of length 1)."""
    if info.rank == 0:
        return True
    return info.rank == 1 and (info.shape[0] == 1 or not isinstance(info.shape[0], int))


class Scan(OpPlugin):
    """What CumSum and CumProd share: ``y[..., i, ...]`` is the running sum (product) of
    ``x[..., j, ...]`` along ``axis`` for ``j <= i`` (``j < i`` with ``exclusive``; ``j >= i``,
    or ``j > i``, with ``reverse``); an exclusive scan's first element is 0 (1).

    The results are in X's dtype, as ONNX's reference computes them: integers wrap, and
    float16 partial results round to float16 at every step. The CUDA kernel computes
    float16 in float32 and rounds once per output, so its float16 results may differ from
    the reference by a few ulp of the running total (they are the closer to the exact ones).
    """

    attributes = (Attr("exclusive", "int", 0), Attr("reverse", "int", 0))
    inputs = (2, 2)
    groups = frozenset({REDUCTION})
    dtypes = _SCAN_DTYPES | _INDEX_DTYPES
    #: Whether the scan multiplies (CumProd) rather than adds (CumSum).
    product = False

    def check(self, node, inputs):
        x, axis = inputs
        self.require_dtypes(node, inputs, _SCAN_DTYPES, which=[0])
        self.require_dtypes(node, inputs, _INDEX_DTYPES, which=[1])
        if x.rank == 0:
            raise self.unsupported(node, "a 0-D input", f"{self.op_type} scans along an axis; give X at least one dim")
        if not _one_element(axis):
            raise self.unsupported(node, f"an axis input of shape {list(axis.shape)}",
                                   "axis is one integer: a 0-D (or 1-element) tensor")
        if axis.value is not None:
            value = _scalar(node, "axis", axis.value)
            if not -x.rank <= value < x.rank:
                raise self.unsupported(node, f"axis={value} for an input of rank {x.rank}",
                                       f"use an axis in [{-x.rank}, {x.rank - 1}]")

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def tactics(self, node, inputs, outputs):
        from .scan import scan_tactics

        x, axis = inputs
        if axis.value is None:
            raise self.unsupported(node, "an axis input computed at run time",
                                   "make axis a constant (an initializer or a folded computation)")
        axis = _normalize_axis(_scalar(node, "axis", axis.value), x.rank)
        return scan_tactics(x.shape, axis, x.dtype, self.product, bool(node.attrs["exclusive"]),
                            bool(node.attrs["reverse"]))

    def reference(self, node, inputs):
        x, axis = inputs
        axis = _normalize_axis(_scalar(node, "axis", axis), x.ndim)
        reverse = bool(node.attrs["reverse"])
        if reverse:
            x = np.flip(x, axis)
        scan = np.cumprod if self.product else np.cumsum
        with np.errstate(over="ignore"):  # integers wrap, as on the GPU
            total = scan(x, axis=axis, dtype=x.dtype)
        if node.attrs["exclusive"]:  # y[i] = inclusive[i - 1], y[0] = 0 (1 for a product)
            shifted = np.ones_like(total) if self.product else np.zeros_like(total)
            body = [slice(None)] * x.ndim
            head = list(body)
            body[axis], head[axis] = slice(1, None), slice(0, -1)
            shifted[tuple(body)] = total[tuple(head)]
            total = shifted
        if reverse:
            total = np.flip(total, axis)
        return [np.ascontiguousarray(total)]


class CumSum(Scan):
    op_type = "CumSum"
    since_opset = 11

    def examples(self):
        f32, f16, i64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)
        return [Example((TensorInfo(f32, (3, 7)), np.array(1, np.int64))),
                Example((TensorInfo(f32, (2, 5, 3)), np.array(1, np.int32)), {"exclusive": 1, "reverse": 1}),
                Example((TensorInfo(f32, (3, 4, 5)), np.array([-3], np.int64)), {"reverse": 1}),
                Example((TensorInfo(f16, (2, 3, 5)), np.array(-1, np.int64)), {"exclusive": 1},
                        rtol=1e-2, atol=1e-2),
                Example((TensorInfo(i64, (5, 3)), np.array(0, np.int32)), {"exclusive": 1}, opset=11)]


class CumProd(Scan):
    op_type = "CumProd"
    since_opset = 26
    product = True

    def examples(self):
        f32, f16, i32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
        near_one = {0: (0.5, 1.5)}  # products that stay in range
        return [Example((TensorInfo(f32, (3, 7)), np.array(1, np.int64)), ranges=near_one, opset=26),
                Example((TensorInfo(f32, (2, 5, 3)), np.array(1, np.int32)), {"exclusive": 1, "reverse": 1},
                        ranges=near_one, opset=26),
                Example((TensorInfo(f16, (2, 3, 5)), np.array([-1], np.int64)), {"exclusive": 1}, ranges=near_one,
                        rtol=1e-2, atol=1e-2, opset=26),
                Example((TensorInfo(i32, (5, 3)), np.array(0, np.int32)), {"reverse": 1}, ranges={0: (-3, 4)},
                        opset=26)]


class TopK(OpPlugin):
    """The ``k`` largest (``largest=0``: smallest) elements of X along ``axis`` and their
    int64 indices, best first.

    Equal values come in index order (the lower index first, whether largest or smallest),
    as the spec says. NaN, which the spec leaves open, ranks as in ONNX's reference: above
    every number, +inf included (first with ``largest``, last without), NaNs among
    themselves in index order. ``sorted=0`` leaves the order
    unspecified; both the reference and the kernel then still return it sorted, as the
    spec allows. ``largest`` and ``sorted`` exist from opset 11 (opset 10 takes ``axis``
    only). K (a 1-element int64 input) may be 0 (empty outputs) up to the axis length.
    """

    op_type = "TopK"
    since_opset = 10
    attributes = (Attr("axis", "int", -1), Attr("largest", "int", None), Attr("sorted", "int", None))
    inputs = (2, 2)
    outputs = (2, 2)
    groups = frozenset({REDUCTION})
    dtypes = NUMERIC_DTYPES

    def check(self, node, inputs):
        x, k = inputs
        self.require_dtypes(node, inputs, {np.dtype(np.int64)}, which=[1])
        if node.opset < 11:
            for name in ("largest", "sorted"):
                if node.attrs[name] is not None:
                    raise self.unsupported(node, f"the {name} attribute at opset {node.opset}",
                                           "largest and sorted exist from opset 11; import the model at opset 11+")
        if x.rank == 0:
            raise self.unsupported(node, "a 0-D input", "TopK selects along an axis; give X at least one dim")
        axis = node.attrs["axis"]
        if not -x.rank <= axis < x.rank:
            raise self.unsupported(node, f"axis={axis} for an input of rank {x.rank}",
                                   f"use an axis in [{-x.rank}, {x.rank - 1}]")
        if k.rank != 1 or not _one_element(k):
            raise self.unsupported(node, f"a K input of shape {list(k.shape)}", "K is a 1-D tensor of one value")
        if k.value is not None:
            count, size = _scalar(node, "K", k.value), x.shape[_normalize_axis(axis, x.rank)]
            if count < 0:
                raise self.unsupported(node, f"K={count}", "K counts the elements to select: 0 or more")
            if isinstance(size, int) and count > size:
                raise self.unsupported(node, f"K={count} along an axis of {size}", f"K must be in [0, {size}]")

    def largest(self, node) -> bool:
        return node.attrs["largest"] is None or bool(node.attrs["largest"])

    def infer(self, node, inputs):
        x, k = inputs
        axis = _normalize_axis(node.attrs["axis"], x.rank)
        count = f"{node.name}_k" if k.value is None else _scalar(node, "K", k.value)
        shape = [count if i == axis else d for i, d in enumerate(x.shape)]
        return [TensorInfo(x.dtype, shape), TensorInfo(np.int64, shape)]

    def tactics(self, node, inputs, outputs):
        from .topk import topk_tactics

        x, k = inputs
        if k.value is None:
            raise self.unsupported(node, "a K input computed at run time",
                                   "make K a constant (an initializer or a folded computation)")
        axis = _normalize_axis(node.attrs["axis"], x.rank)
        return topk_tactics(x.shape, axis, _scalar(node, "K", k.value), x.dtype, self.largest(node))

    def reference(self, node, inputs):
        x, k = inputs
        axis = _normalize_axis(node.attrs["axis"], x.ndim)
        count, size = _scalar(node, "K", k), x.shape[axis]
        if not 0 <= count <= size:
            raise ValueError(f"{node.describe()}: K={count} along an axis of {size}")
        largest = self.largest(node)
        position = np.arange(size).reshape([size if i == axis else 1 for i in range(x.ndim)])
        # lexsort: ascending by value (NaN last), equal values by the tie key (index order
        # once a largest-first ordering is flipped)
        tie_key = np.broadcast_to(-position if largest else position, x.shape)
        order = np.lexsort((tie_key, x), axis=axis)
        if largest:
            order = np.flip(order, axis=axis)
        indices = np.take(order, np.arange(count), axis=axis).astype(np.int64)
        return [np.take_along_axis(x, indices, axis=axis), indices]

    def examples(self):
        f32, f16, i64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)

        def few_values(rng, dtype, shape):  # many ties
            return rng.integers(-2, 3, shape).astype(dtype)

        return [Example((TensorInfo(f32, (3, 7)), np.array([3], np.int64))),
                Example((TensorInfo(f32, (2, 5, 3)), np.array([5], np.int64)), {"axis": 1, "largest": 0},
                        name="float32(2,5,3) k=all smallest"),
                Example((TensorInfo(f32, (3, 6, 5)), np.array([2], np.int64)), {"axis": -2, "sorted": 0},
                        ranges={0: few_values}, name="float32(3,6,5) ties"),
                Example((TensorInfo(f16, (2, 3, 9)), np.array([4], np.int64)), {"largest": 0}),
                Example((TensorInfo(i64, (5, 3)), np.array([2], np.int64)), {"axis": 0}, opset=10)]


OPS = (CumSum, CumProd, TopK)
