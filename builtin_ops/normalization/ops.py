"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
RMSNormalization, GroupNormalization, MeanVarianceNormalization and LRN (LpNormalization,
a norm rather than statistics, is in :mod:`.lp_norm_ops`).

Statistics and the normalization itself are computed in float64 and cast back to the
input dtype (or to the stash dtype for LayerNormalization's Mean and InvStdDev, to the
scale's dtype for RMSNormalization's Y).
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import broadcast_strides
from plugrt.plugin import (FLOAT_DTYPES, NORMALIZATION, REQUIRED, Attr, Example, OpPlugin, Scale, TensorInfo,
                           optional)

from . import channel_norm
from .row_norm import ABSENT, INV_STD, ParamIndex, RowNorm, RowView, param_index
from .row_norm_vector import row_tactics

_STASH_FLOAT = 1  # TensorProto.FLOAT, the only stash_type NumPy can honour exactly


def _wide(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else np.asarray(x).astype(np.float64)


def _channel_param(p: np.ndarray, rank: int) -> np.ndarray:
    """A per-channel parameter ([C], or [C, D1, ...]) shaped to broadcast over [N, C, D1, ...]."""
    return p.reshape(p.shape + (1,) * max(rank - 1 - p.ndim, 0))


def _normalize(x: np.ndarray, axes: tuple, epsilon: float):
    """(x - mean) / sqrt(var + epsilon) over ``axes`` (float64), with mean and 1/std."""
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + epsilon)
    return centered * inv_std, mean, inv_std


def _shape(info: TensorInfo) -> tuple:
    return tuple(int(d) for d in info.shape)


def _axis_strides(rank: int, axis: int, stride: int = 1) -> np.ndarray:
    """Strides of a parameter that varies along ``axis`` only (0 elsewhere)."""
    strides = np.zeros(rank, dtype=np.int64)
    strides[axis] = stride
    return strides


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{what}={axis} is out of range for rank {rank}")
    return axis % rank


class NormOp(OpPlugin):
    groups = frozenset({NORMALIZATION})
    dtypes = FLOAT_DTYPES

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]


class BatchNormalization(NormOp):
    """BatchNormalization, opset 7 on.

    Inference mode: y = scale * (x - mean) / sqrt(var + epsilon) + B. From opset 14,
    ``training_mode=1`` normalizes with the batch statistics and also outputs the updated
    running mean and variance. ``spatial=0`` (opsets 7-8) takes [C, D1, ...] parameters.
    Before opset 14 a node with more than one output asks for training: refused.
    """

    op_type = "BatchNormalization"
    since_opset = 7
    inputs = (5, 5)
    outputs = (1, 5)
    attributes = (
        Attr("epsilon", "float", 1e-5),
        Attr("momentum", "float", 0.9),
        Attr("spatial", "int", 1),
        Attr("training_mode", "int", 0),
    )

    def _training(self, node) -> bool:
        return node.opset >= 14 and bool(node.attrs["training_mode"])

    def check(self, node, inputs):
        if node.opset < 14 and any(node.outputs[1:]):
            raise self.unsupported(
                node, f"training mode (outputs beyond Y) at opset {node.opset}",
                "drop the extra outputs, or use opset >= 14 with training_mode=1")
        if node.opset >= 14 and len(node.outputs) > 3:
            raise ValueError(f"at most 3 outputs from opset 14, got {len(node.outputs)}")
        if node.opset < 14 and node.attrs["training_mode"]:
            raise self.unsupported(node, f"attribute training_mode at opset {node.opset}", "it exists from opset 14")
        if node.opset >= 9 and node.attrs["spatial"] != 1:
            raise self.unsupported(node, f"attribute spatial at opset {node.opset}", "it exists up to opset 8")

    def infer(self, node, inputs):
        x, mean, var = inputs[0], inputs[3], inputs[4]
        if x.rank < 2:
            raise ValueError(f"X must have rank >= 2, got {x.rank}")
        return [TensorInfo(x.dtype, x.shape), TensorInfo(mean.dtype, mean.shape), TensorInfo(var.dtype, var.shape)]

    def tactics(self, node, inputs, outputs):
        eps = node.attrs["epsilon"]
        if self._training(node):
            return channel_norm.batchnorm_training_tactics(inputs[0], eps, node.attrs["momentum"])
        found = channel_norm.batchnorm_inference_tactics(inputs[0], inputs[1:5], eps)
        if not found:
            shapes = ", ".join(str(_shape(p)) for p in inputs[1:5])
            raise self.unsupported(node, f"runtime parameters of shapes {shapes} that differ or do not match "
                                   f"X's dims from 1 on", "give scale, B, mean and var one shape, or make them constants")
        return found

    def reference(self, node, inputs):
        x, scale, bias, mean, var = (_wide(i) for i in inputs)
        rank, eps = x.ndim, node.attrs["epsilon"]
        if self._training(node):
            axes = (0,) + tuple(range(2, rank))
            y, batch_mean, inv_std = _normalize(x, axes, eps)
            y = y * _channel_param(scale, rank) + _channel_param(bias, rank)
            momentum = node.attrs["momentum"]
            batch_var = np.var(x, axis=axes)
            running_mean = mean * momentum + batch_mean.reshape(-1) * (1.0 - momentum)
            running_var = var * momentum + batch_var * (1.0 - momentum)
        else:
            inv_std = 1.0 / np.sqrt(_channel_param(var, rank) + eps)
            y = (x - _channel_param(mean, rank)) * inv_std * _channel_param(scale, rank) + _channel_param(bias, rank)
            running_mean, running_var = mean, var
        return [y.astype(inputs[0].dtype), running_mean.astype(inputs[3].dtype), running_var.astype(inputs[4].dtype)]

    def as_scale(self, node, inputs):
        """Inference mode with constant parameters: y = x * scale + shift, where
        scale = gamma / sqrt(var + epsilon) and shift = beta - mean * scale, per channel.

        Running-statistics outputs, if named, equal mean and var; the pass only folds a
        node whose outputs past Y nothing reads.
        """
        if self._training(node):
            return None
        params = [optional(inputs, i) for i in range(1, 5)]
        if any(p is None or p.value is None for p in params):
            return None
        rank = inputs[0].rank
        gamma, beta, mean, var = (_channel_param(_wide(p.value), rank) for p in params)
        scale = gamma / np.sqrt(var + node.attrs["epsilon"])
        return Scale(0, scale, beta - mean * scale)


class InstanceNormalization(NormOp):
    """InstanceNormalization (opset 6 on): per-instance, per-channel statistics over D1..Dn."""

    op_type = "InstanceNormalization"
    since_opset = 6
    inputs = (3, 3)
    attributes = (Attr("epsilon", "float", 1e-5),)

    def infer(self, node, inputs):
        if inputs[0].rank < 3:
            raise ValueError(f"input must have rank >= 3 (N, C, D1, ...), got {inputs[0].rank}")
        return super().infer(node, inputs)

    def tactics(self, node, inputs, outputs):
        shape = _shape(inputs[0])
        view = RowView(shape, tuple(range(2, len(shape))))
        per_channel = param_index(view, _axis_strides(len(shape), 1))
        return row_tactics(RowNorm(view, inputs[0].dtype, node.attrs["epsilon"], scale=1, scale_index=per_channel,
                                   bias=2, bias_index=per_channel))

    def reference(self, node, inputs):
        x, scale, bias = (_wide(i) for i in inputs)
        rank = x.ndim
        y, _, _ = _normalize(x, tuple(range(2, rank)), node.attrs["epsilon"])
        y = y * _channel_param(scale, rank) + _channel_param(bias, rank)
        return [y.astype(inputs[0].dtype)]


class LayerNormalization(NormOp):
    """LayerNormalization (opset 17 on): statistics over axes [axis, rank).

    Outputs Y (X's dtype), and optionally Mean and InvStdDev (float32, the stash type) of
    shape [d0, ..., d(axis-1), 1, ..., 1]. Scale and B broadcast unidirectionally to X.
    """

    op_type = "LayerNormalization"
    since_opset = 17
    inputs = (2, 3)
    outputs = (1, 3)
    attributes = (
        Attr("axis", "int", -1),
        Attr("epsilon", "float", 1e-5),
        Attr("stash_type", "int", _STASH_FLOAT),
    )

    def check(self, node, inputs):
        if node.attrs["stash_type"] != _STASH_FLOAT:
            raise self.unsupported(node, f"stash_type={node.attrs['stash_type']}", "use stash_type=1 (float32)")

    def infer(self, node, inputs):
        x = inputs[0]
        axis = _axis(node.attrs["axis"], x.rank)
        stats = tuple(x.shape[:axis]) + (1,) * (x.rank - axis)
        return [TensorInfo(x.dtype, x.shape), TensorInfo(np.float32, stats), TensorInfo(np.float32, stats)]

    def tactics(self, node, inputs, outputs):
        shape = _shape(inputs[0])
        view = RowView(shape, tuple(range(node.attrs["axis"] % len(shape), len(shape))))
        scale, bias = inputs[1], optional(inputs, 2)
        bias_index = ParamIndex(ABSENT)
        if bias is not None:
            bias_index = param_index(view, broadcast_strides(_shape(bias), shape))
        return row_tactics(RowNorm(
            view, inputs[0].dtype, node.attrs["epsilon"],
            scale=1, scale_index=param_index(view, broadcast_strides(_shape(scale), shape)),
            bias=2 if bias is not None else None, bias_index=bias_index,
            mean_out=1 if optional(outputs, 1) is not None else None,
            stat_out=2 if optional(outputs, 2) is not None else None, second_stat=INV_STD,
        ))

    def reference(self, node, inputs):
        x, scale, bias = _wide(inputs[0]), _wide(inputs[1]), _wide(optional(inputs, 2))
        axis = node.attrs["axis"] % x.ndim
        y, mean, inv_std = _normalize(x, tuple(range(axis, x.ndim)), node.attrs["epsilon"])
        y = y * scale
        if bias is not None:
            y = y + bias
        return [y.astype(inputs[0].dtype), mean.astype(np.float32), inv_std.astype(np.float32)]

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        x, param = TensorInfo(f32, (2, 3, 8)), TensorInfo(f32, (8,))
        return [Example((x, param, param), rtol=2e-4, atol=2e-5),
                Example((TensorInfo(f32, (3, 2, 4)), np.linspace(0.5, 1.5, 8, dtype=f32).reshape(2, 4)), {"axis": 1},
                        rtol=2e-4, atol=2e-5, n_outputs=3, name="no-bias-axis1-stats"),
                Example((TensorInfo(f16, (4, 16)), TensorInfo(f16, (16,))), {"epsilon": 1e-3}, rtol=3e-3, atol=3e-3,
                        name="float16-no-bias")]


class RMSNormalization(NormOp):
    """RMSNormalization (opset 23 on): ``Y = X / sqrt(mean(X^2) + epsilon) * scale`` over
    axes [axis, rank), what LLaMA and T5 call RMSNorm. Y has the scale's dtype (it may
    differ from X's: a float16 X, float32 arithmetic, a float32 scale); scale broadcasts
    unidirectionally to X. The kernels accumulate in float32 (float64 for float64 X).
    """

    op_type = "RMSNormalization"
    since_opset = 23
    inputs = (2, 2)
    attributes = (
        Attr("axis", "int", -1),
        Attr("epsilon", "float", 1e-5),
        Attr("stash_type", "int", _STASH_FLOAT),
    )

    def check(self, node, inputs):
        if node.attrs["stash_type"] != _STASH_FLOAT:
            raise self.unsupported(node, f"stash_type={node.attrs['stash_type']}", "use stash_type=1 (float32)")

    def infer(self, node, inputs):
        x, scale = inputs
        _axis(node.attrs["axis"], x.rank)
        return [TensorInfo(scale.dtype, x.shape)]

    def tactics(self, node, inputs, outputs):
        shape = _shape(inputs[0])
        view = RowView(shape, tuple(range(node.attrs["axis"] % len(shape), len(shape))))
        scale_index = param_index(view, broadcast_strides(_shape(inputs[1]), shape))
        return row_tactics(RowNorm(view, inputs[0].dtype, node.attrs["epsilon"], scale=1, scale_index=scale_index,
                                   centered=False, y_dtype=inputs[1].dtype))

    def reference(self, node, inputs):
        x, scale = _wide(inputs[0]), _wide(inputs[1])
        axes = tuple(range(node.attrs["axis"] % x.ndim, x.ndim))
        mean_square = np.mean(x * x, axis=axes, keepdims=True)
        y = x / np.sqrt(mean_square + node.attrs["epsilon"]) * scale
        return [y.astype(inputs[1].dtype)]

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        tol = dict(rtol=2e-4, atol=2e-5)
        return [Example((TensorInfo(f32, (2, 3, 8)), TensorInfo(f32, (8,))), opset=23, **tol),
                Example((TensorInfo(f32, (3, 2, 4)), np.linspace(0.5, 1.5, 8, dtype=f32).reshape(2, 4)),
                        {"axis": -2, "epsilon": 1e-6}, opset=23, name="two-axes-constant-scale", **tol),
                Example((TensorInfo(f16, (4, 16)), TensorInfo(f16, (16,))), opset=23, rtol=3e-3, atol=3e-3,
                        name="float16"),
                Example((TensorInfo(f16, (2, 2, 8)), TensorInfo(f32, (8,))), opset=23, name="float16-x-float32-scale",
                        **tol)]


class GroupNormalization(NormOp):
    """GroupNormalization: statistics per instance over each group of C / num_groups channels.

    Opset 18: scale and bias have one value per group; opset 21: one per channel.
    """

    op_type = "GroupNormalization"
    since_opset = 18
    inputs = (3, 3)
    attributes = (
        Attr("epsilon", "float", 1e-5),
        Attr("num_groups", "int", REQUIRED),
        Attr("stash_type", "int", _STASH_FLOAT),
    )

    def check(self, node, inputs):
        if node.attrs["stash_type"] != _STASH_FLOAT:
            raise self.unsupported(node, f"stash_type={node.attrs['stash_type']}", "use stash_type=1 (float32)")

    def infer(self, node, inputs):
        x, groups = inputs[0], node.attrs["num_groups"]
        if x.rank < 2:
            raise ValueError(f"X must have rank >= 2, got {x.rank}")
        channels = x.shape[1]
        if groups <= 0 or (isinstance(channels, int) and channels % groups):
            raise ValueError(f"num_groups={groups} does not divide the {channels} channels")
        return super().infer(node, inputs)

    def tactics(self, node, inputs, outputs):
        shape = _shape(inputs[0])
        groups = node.attrs["num_groups"]
        per_group = shape[1] // groups
        view = RowView((shape[0], groups, per_group, int(np.prod(shape[2:], dtype=np.int64))), (2, 3))
        if node.opset < 21:
            strides = _axis_strides(4, 1)
        else:
            strides = np.array([0, per_group, 1, 0], dtype=np.int64)
        index = param_index(view, strides)
        return row_tactics(RowNorm(view, inputs[0].dtype, node.attrs["epsilon"], scale=1, scale_index=index,
                                   bias=2, bias_index=index))

    def reference(self, node, inputs):
        x, scale, bias = (_wide(i) for i in inputs)
        n, c = x.shape[:2]
        groups = node.attrs["num_groups"]
        grouped = x.reshape((n, groups, -1))
        y, _, _ = _normalize(grouped, (2,), node.attrs["epsilon"])
        if node.opset < 21:  # per-group affine parameters
            y = y * scale.reshape(1, groups, 1) + bias.reshape(1, groups, 1)
            y = y.reshape(x.shape)
        else:
            y = y.reshape(x.shape)
            y = y * _channel_param(scale, x.ndim) + _channel_param(bias, x.ndim)
        return [y.astype(inputs[0].dtype)]


class MeanVarianceNormalization(NormOp):
    """MeanVarianceNormalization (opset 9 on): (X - E[X]) / (sqrt(Var[X]) + 1e-9) over ``axes``."""

    op_type = "MeanVarianceNormalization"
    since_opset = 9
    attributes = (Attr("axes", "ints", [0, 2, 3]),)

    def infer(self, node, inputs):
        x = inputs[0]
        axes = [_axis(a, x.rank, "axes entry") for a in node.attrs["axes"]]
        if len(set(axes)) != len(axes):
            raise ValueError(f"duplicate axes {node.attrs['axes']}")
        return super().infer(node, inputs)

    def tactics(self, node, inputs, outputs):
        shape = _shape(inputs[0])
        axes = tuple(sorted({a % len(shape) for a in node.attrs["axes"]})) if shape else ()
        return row_tactics(RowNorm(RowView(shape, axes), inputs[0].dtype, 0.0, eps_out=1e-9))

    def reference(self, node, inputs):
        x = _wide(inputs[0])
        axes = tuple(sorted({a % x.ndim for a in node.attrs["axes"]}))
        mean = np.mean(x, axis=axes, keepdims=True)
        centered = x - mean
        std = np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True))
        return [(centered / (std + 1e-9)).astype(inputs[0].dtype)]


class LRN(NormOp):
    """LRN: y = x / (bias + alpha / size * sum of x^2 over neighbouring channels) ** beta.

    The window over channel c is [c - floor((size-1)/2), c + ceil((size-1)/2)], clipped.
    """

    op_type = "LRN"
    attributes = (
        Attr("alpha", "float", 1e-4),
        Attr("beta", "float", 0.75),
        Attr("bias", "float", 1.0),
        Attr("size", "int", REQUIRED),
    )

    def check(self, node, inputs):
        size = node.attrs["size"]
        if size < 1:
            raise ValueError(f"attribute size must be a positive int, got {size}")

    def infer(self, node, inputs):
        if inputs[0].rank < 2:
            raise ValueError(f"input must have rank >= 2 (N, C, ...), got {inputs[0].rank}")
        return super().infer(node, inputs)

    def tactics(self, node, inputs, outputs):
        a = node.attrs
        return channel_norm.lrn_tactics(inputs[0], a["size"], a["alpha"], a["beta"], a["bias"])

    def reference(self, node, inputs):
        x = _wide(inputs[0])
        size = node.attrs["size"]
        below, above = (size - 1) // 2, size // 2  # floor and ceil of (size - 1) / 2
        squares = x * x
        pad = [(0, 0)] * x.ndim
        pad[1] = (below, above)
        padded = np.pad(squares, pad)
        channels = x.shape[1]
        window = sum(padded[:, k:k + channels] for k in range(size))
        y = x / (node.attrs["bias"] + node.attrs["alpha"] / size * window) ** node.attrs["beta"]
        return [y.astype(inputs[0].dtype)]


OPS = (
    BatchNormalization, InstanceNormalization, LayerNormalization, RMSNormalization, GroupNormalization,
    MeanVarianceNormalization, LRN,
)
