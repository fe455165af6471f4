"""Reductions (ReduceSum, ReduceMean, ... ArgMax, ArgMin) and the softmax family.

Reduce ops take ``axes`` as an attribute before opset 18 (ReduceSum: before 13) and as an
optional second input from then on. Empty axes reduce over everything unless
``noop_with_empty_axes`` is set, in which case they reduce over no axis (NumPy's
``axis=()``): ReduceSumSquare then squares, ReduceLogSum takes the log, and so on.
Reducing over an empty set yields the reduction's identity (0, 1, -inf, ...).
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import FLOAT_DTYPES, NUMERIC_DTYPES, REDUCTION, Attr, Example, OpPlugin, TensorInfo, optional

_REDUCE_DTYPES = FLOAT_DTYPES | {np.dtype(t) for t in ("int32", "int64", "uint32", "uint64")}
_MINMAX_DTYPES = _REDUCE_DTYPES | {np.dtype(t) for t in ("int8", "uint8", "bool")}


def _normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _as_float(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


class ReduceOp(OpPlugin):
    """A Reduce* op. Subclasses implement :meth:`compute` (x, axes tuple, keepdims)."""

    attributes = (Attr("axes", "ints", None), Attr("keepdims", "int", 1), Attr("noop_with_empty_axes", "int", 0))
    inputs = (1, 2)
    groups = frozenset({REDUCTION})
    #: the dtypes of the data input; ``dtypes`` adds int64 for the axes input
    data_dtypes = _REDUCE_DTYPES
    dtypes = _REDUCE_DTYPES
    #: the first opset where axes is an input rather than an attribute
    axes_input_since = 18

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.dtypes = frozenset(cls.data_dtypes | {np.dtype("int64")})

    def axes_as_input(self, node) -> bool:
        return node.opset >= self.axes_input_since

    def raw_axes(self, node, axes_input):
        """The axes as given (a list, or None when absent), from the attribute or the input."""
        if self.axes_as_input(node):
            return None if axes_input is None else [int(a) for a in np.asarray(axes_input).reshape(-1)]
        return node.attrs["axes"]

    def resolve(self, node, rank: int, raw) -> tuple:
        if not raw:
            return () if node.attrs["noop_with_empty_axes"] else tuple(range(rank))
        axes = tuple(sorted({_normalize_axis(a, rank) for a in raw}))
        if len(axes) != len(raw):
            raise ValueError(f"axes {list(raw)} repeat an axis")
        return axes

    def check(self, node, inputs):
        self.require_dtypes(node, inputs, self.data_dtypes, which=[0])
        since = self.axes_input_since
        axes_input = optional(inputs, 1)
        if self.axes_as_input(node):
            if node.attrs["axes"] is not None:
                raise self.unsupported(node, f"the axes attribute at opset {node.opset}",
                                       f"from opset {since} axes is the second input")
            if axes_input is not None and axes_input.value is None and not node.attrs["keepdims"]:
                if axes_input.rank != 1 or not isinstance(axes_input.shape[0], int):
                    raise self.unsupported(
                        node, "keepdims=0 with a non-constant axes input of unknown length",
                        "the output rank is unknown; make axes a constant (initializer) or set keepdims=1")
        elif axes_input is not None:
            raise self.unsupported(node, f"an axes input at opset {node.opset}",
                                   f"before opset {since} axes is an attribute")

    def infer(self, node, inputs):
        x = inputs[0]
        keep = bool(node.attrs["keepdims"])
        axes_input = optional(inputs, 1)
        if axes_input is not None and axes_input.value is None:
            return [TensorInfo(self.out_dtype(x.dtype), self._unknown_axes_shape(node, x, axes_input, keep))]
        axes = self.resolve(node, x.rank, self.raw_axes(node, None if axes_input is None else axes_input.value))
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else \
            [d for i, d in enumerate(x.shape) if i not in axes]
        return [TensorInfo(self.out_dtype(x.dtype), shape)]

    def _unknown_axes_shape(self, node, x, axes_input, keep):
        """The output shape when the axes input is not a known constant."""
        if keep:  # every dim either stays or becomes 1
            return [1 if d == 1 else f"{node.name}_d{i}" for i, d in enumerate(x.shape)]
        count = axes_input.shape[0]
        if count == 0:
            return list(x.shape) if node.attrs["noop_with_empty_axes"] else []
        if count > x.rank:
            raise ValueError(f"{count} axes for an input of rank {x.rank}")
        return [f"{node.name}_d{i}" for i in range(x.rank - count)]

    def out_dtype(self, dtype):
        return dtype

    def tactics(self, node, inputs, outputs):
        x, axes_input = inputs[0], optional(inputs, 1)
        if axes_input is not None and axes_input.value is None:
            raise self.unsupported(node, "an axes input computed at run time",
                                   "make axes a constant (an initializer or a folded shape computation)")
        axes = self.resolve(node, x.rank, self.raw_axes(node, None if axes_input is None else axes_input.value))
        return self.kernel_tactics(x, axes)

    def kernel_tactics(self, x, axes):
        from .reduce import reduce_tactics

        return reduce_tactics(self.op_type, x.shape, axes, x.dtype)

    def reference(self, node, inputs):
        x = inputs[0]
        axes = self.resolve(node, x.ndim, self.raw_axes(node, optional(inputs, 1)))
        keep = bool(node.attrs["keepdims"])
        if axes and any(x.shape[a] == 0 for a in axes) and self.empty_value(x.dtype) is not None:
            shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else \
                [d for i, d in enumerate(x.shape) if i not in axes]
            return [np.full(shape, self.empty_value(x.dtype), dtype=x.dtype)]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            result = self.compute(x, axes, keep)
        return [np.asarray(result).astype(x.dtype, copy=False)]

    def empty_value(self, dtype):
        """The result of reducing an empty set, where NumPy's own is not the spec's."""
        return None

    def compute(self, x, axes, keep):
        raise NotImplementedError


class ReduceSum(ReduceOp):
    op_type = "ReduceSum"
    axes_input_since = 13

    def compute(self, x, axes, keep):
        if x.dtype.kind == "f":
            return np.sum(_as_float(x), axis=axes, keepdims=keep)
        return np.sum(x, axis=axes, keepdims=keep, dtype=x.dtype)


class ReduceSumSquare(ReduceOp):
    op_type = "ReduceSumSquare"

    def compute(self, x, axes, keep):
        if x.dtype.kind == "f":
            return np.sum(np.square(_as_float(x)), axis=axes, keepdims=keep)
        return np.sum(x * x, axis=axes, keepdims=keep, dtype=x.dtype)


class ReduceMean(ReduceOp):
    op_type = "ReduceMean"

    def compute(self, x, axes, keep):
        if x.dtype.kind == "f":
            return np.mean(_as_float(x), axis=axes, keepdims=keep)
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        total = np.sum(x, axis=axes, keepdims=keep, dtype=np.int64 if x.dtype.kind == "i" else np.uint64)
        if count == 0:
            return np.zeros_like(total)  # undefined by the spec
        quotient = np.abs(total) // count  # integer mean truncates toward zero
        return np.where(total < 0, -quotient, quotient) if x.dtype.kind == "i" else quotient


class ReduceProd(ReduceOp):
    op_type = "ReduceProd"

    def compute(self, x, axes, keep):
        if x.dtype.kind == "f":
            return np.prod(_as_float(x), axis=axes, keepdims=keep)
        return np.prod(x, axis=axes, keepdims=keep, dtype=x.dtype)


class ReduceMax(ReduceOp):
    op_type = "ReduceMax"
    data_dtypes = _MINMAX_DTYPES

    def empty_value(self, dtype):
        if dtype.kind == "b":
            return False
        return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min

    def compute(self, x, axes, keep):
        return np.max(x, axis=axes, keepdims=keep)


class ReduceMin(ReduceOp):
    op_type = "ReduceMin"
    data_dtypes = _MINMAX_DTYPES

    def empty_value(self, dtype):
        if dtype.kind == "b":
            return True
        return np.inf if dtype.kind == "f" else np.iinfo(dtype).max

    def compute(self, x, axes, keep):
        return np.min(x, axis=axes, keepdims=keep)


class ReduceL1(ReduceOp):
    op_type = "ReduceL1"

    def compute(self, x, axes, keep):
        if x.dtype.kind == "f":
            return np.sum(np.abs(_as_float(x)), axis=axes, keepdims=keep)
        return np.sum(np.abs(x), axis=axes, keepdims=keep, dtype=x.dtype)


class ReduceL2(ReduceOp):
    op_type = "ReduceL2"

    def compute(self, x, axes, keep):
        return np.sqrt(np.sum(np.square(_as_float(x)), axis=axes, keepdims=keep))


class ReduceLogSum(ReduceOp):
    op_type = "ReduceLogSum"
    data_dtypes = FLOAT_DTYPES

    def compute(self, x, axes, keep):
        return np.log(np.sum(_as_float(x), axis=axes, keepdims=keep))


class ReduceLogSumExp(ReduceOp):
    op_type = "ReduceLogSumExp"
    data_dtypes = FLOAT_DTYPES

    def empty_value(self, dtype):
        return -np.inf

    def kernel_tactics(self, x, axes):
        from .softmax import LOG_SUM_EXP, exp_tactics

        return exp_tactics(LOG_SUM_EXP, x.shape, axes, x.dtype)

    def compute(self, x, axes, keep):
        x = _as_float(x)
        if not axes:
            return x
        peak = np.max(x, axis=axes, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        out = np.log(np.sum(np.exp(x - peak), axis=axes, keepdims=True)) + peak
        return out if keep else np.squeeze(out, axis=axes)


class ArgOp(OpPlugin):
    """ArgMax / ArgMin: int64 indices of the first (or last) extremum along ``axis``."""

    attributes = (Attr("axis", "int", 0), Attr("keepdims", "int", 1), Attr("select_last_index", "int", 0))
    groups = frozenset({REDUCTION})
    dtypes = NUMERIC_DTYPES

    def check(self, node, inputs):
        x = inputs[0]
        if not -x.rank <= node.attrs["axis"] < x.rank:
            raise self.unsupported(node, f"axis={node.attrs['axis']} for an input of rank {x.rank}",
                                   f"use an axis in [{-x.rank}, {x.rank - 1}]")

    def infer(self, node, inputs):
        x = inputs[0]
        axis = _normalize_axis(node.attrs["axis"], x.rank)
        if node.attrs["keepdims"]:
            shape = [1 if i == axis else d for i, d in enumerate(x.shape)]
        else:
            shape = [d for i, d in enumerate(x.shape) if i != axis]
        return [TensorInfo(np.int64, shape)]

    def tactics(self, node, inputs, outputs):
        from .argmax import arg_tactics

        x = inputs[0]
        axis = _normalize_axis(node.attrs["axis"], x.rank)
        return arg_tactics(x.shape, (axis,), x.dtype, is_max=self.op_type == "ArgMax",
                           last=bool(node.attrs["select_last_index"]))

    def reference(self, node, inputs):
        x = inputs[0]
        axis = _normalize_axis(node.attrs["axis"], x.ndim)
        if node.attrs["select_last_index"]:
            index = x.shape[axis] - 1 - self.arg(np.flip(x, axis=axis), axis)
        else:
            index = self.arg(x, axis)
        if node.attrs["keepdims"]:
            index = np.expand_dims(index, axis)
        return [np.asarray(index, dtype=np.int64)]


class ArgMax(ArgOp):
    op_type = "ArgMax"

    def arg(self, x, axis):
        return np.argmax(x, axis=axis)


class ArgMin(ArgOp):
    op_type = "ArgMin"

    def arg(self, x, axis):
        return np.argmin(x, axis=axis)


class SoftmaxOp(OpPlugin):
    """Softmax, LogSoftmax, Hardmax. Before opset 13 the input is coerced to 2-D at
    ``axis`` (default 1) and the op runs over the flattened trailing dims; from 13 on it
    runs along the single ``axis`` (default -1)."""

    attributes = (Attr("axis", "int", None),)
    groups = frozenset({REDUCTION})
    dtypes = FLOAT_DTYPES

    def axis(self, node, rank: int) -> int:
        axis = node.attrs["axis"]
        if axis is None:
            axis = 1 if node.opset < 13 else -1
        if node.opset < 13:  # coercion to 2-D: axis may equal rank
            if not -rank <= axis <= rank:
                raise ValueError(f"axis {axis} is out of range for rank {rank}")
            return axis + rank if axis < 0 else axis
        return _normalize_axis(axis, rank)

    def check(self, node, inputs):
        x = inputs[0]
        try:
            self.axis(node, x.rank)
        except ValueError as exc:
            raise self.unsupported(node, f"axis={node.attrs['axis']} for an input of rank {x.rank}", str(exc))

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def reduced_axes(self, node, rank: int) -> tuple:
        """The axes one softmax row spans: ``axis`` (opset 13 on) or ``axis`` to the end."""
        axis = self.axis(node, rank)
        return (axis,) if node.opset >= 13 else tuple(range(axis, rank))

    def tactics(self, node, inputs, outputs):
        from .softmax import LOG_SOFTMAX, SOFTMAX, exp_tactics

        x = inputs[0]
        mode = SOFTMAX if self.op_type == "Softmax" else LOG_SOFTMAX
        return exp_tactics(mode, x.shape, self.reduced_axes(node, x.rank), x.dtype)

    def reference(self, node, inputs):
        x = inputs[0]
        axis = self.axis(node, x.ndim)
        if x.size == 0:  # np.max has no identity for an empty axis
            return [x.copy()]
        if node.opset < 13:
            rows = int(np.prod(x.shape[:axis], dtype=np.int64))
            flat = x.reshape(rows, -1) if x.size else x.reshape(rows, int(np.prod(x.shape[axis:], dtype=np.int64)))
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                out = self.compute(flat, 1)
            return [out.reshape(x.shape).astype(x.dtype, copy=False)]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return [self.compute(x, axis).astype(x.dtype, copy=False)]

    @staticmethod
    def shifted(x, axis):
        # float16 stays float16, as in ONNX's reference: the node cases' expected outputs
        # (fp16 attention chains) are rounded that way and a float64 softmax misses them by 2 ulp.
        x = x if x.dtype == np.float16 else _as_float(x)
        peak = np.max(x, axis=axis, keepdims=True)
        return x - np.where(np.isfinite(peak), peak, 0.0)


class Softmax(SoftmaxOp):
    op_type = "Softmax"

    def compute(self, x, axis):
        e = np.exp(self.shifted(x, axis))
        return e / np.sum(e, axis=axis, keepdims=True)

    def examples(self):
        return [Example((TensorInfo(np.float32, (3, 5)),)),
                Example((TensorInfo(np.float32, (2, 3, 4)),), {"axis": 1}),
                Example((TensorInfo(np.float32, (2, 3, 4)),), {"axis": 1}, opset=11, name="opset11-2d-coercion"),
                Example((TensorInfo(np.float16, (2, 6)),), rtol=1e-3, atol=1e-3)]


class LogSoftmax(SoftmaxOp):
    op_type = "LogSoftmax"

    def compute(self, x, axis):
        s = self.shifted(x, axis)
        return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


class Hardmax(SoftmaxOp):
    op_type = "Hardmax"

    def tactics(self, node, inputs, outputs):
        from .argmax import arg_tactics

        x = inputs[0]
        return arg_tactics(x.shape, self.reduced_axes(node, x.rank), x.dtype, hardmax=True)

    def compute(self, x, axis):
        out = np.zeros(x.shape, dtype=x.dtype)
        if x.shape[axis]:
            index = np.expand_dims(np.argmax(x, axis=axis), axis)
            np.put_along_axis(out, index, 1, axis=axis)
        return out


OPS = (
    ReduceSum, ReduceSumSquare, ReduceMean, ReduceProd, ReduceMax, ReduceMin, ReduceL1, ReduceL2,
    ReduceLogSum, ReduceLogSumExp, ArgMax, ArgMin, Softmax, LogSoftmax, Hardmax,
)
