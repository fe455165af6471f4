"""Fuse layer normalization written in primitive ops into one LayerNormalization (opset 17).

The PyTorch TorchScript exporter (opsets 11-16) writes ``nn.LayerNorm`` as::

    mean = ReduceMean(x, axes=last k, keepdims=1);  d = Sub(x, mean)
    var = ReduceMean(Pow(d, 2));  y = Div(d, Sqrt(Add(var, eps)))
    y = Add(Mul(y, gamma), beta)                     # gamma and beta optional

``ReduceMean``'s axes are an attribute before opset 18 and a constant input from then on;
``Mul(d, d)`` may stand for the square, ``Mul(d, Reciprocal(...))`` for the division, and
the variance may be ``ReduceMean(x * x) - mean * mean``. The fused node normalizes over
``axis=-k`` with constant scale (ones when gamma is absent) and bias (omitted when beta is).
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import (Rule, add_constant, capture, close_to, const, either, is_scalar, op, reduce_axes,
                                   rewrite_matches)

OPSET = 17


def mean_of(of, name):
    """ReduceMean(of) with keepdims=1, axes as an attribute or as a constant input."""
    keep = {"keepdims": 1}
    return either(op("ReduceMean", of, name=name, attrs=keep),
                  op("ReduceMean", of, const(f"{name}_axes"), name=name, attrs=keep))


def square_of(of, name):
    """Pow(of, 2) or Mul(of, of)."""
    return either(op("Pow", of, const(f"{name}_two", close_to(2.0))), op("Mul", of, of))


_x = capture("x")
_d = op("Sub", _x, mean_of(_x, "mean"), name="d")
_variance = either(mean_of(square_of(_d, "d"), "var"),
                   op("Sub", mean_of(square_of(_x, "x"), "var"), square_of(capture("mean"), "mean")))
_std = op("Sqrt", op("Add", _variance, const("eps", is_scalar)))
_normed = either(op("Div", _d, _std, name="normed"), op("Mul", _d, op("Reciprocal", _std), name="normed"))


def affine_parameter(array, shape, dtype, rank):
    """``array`` as a tensor of the normalized ``shape``, or ``None`` if it would change
    the output's shape or dtype (it must broadcast into the normalized axes)."""
    if array.dtype != dtype or array.ndim > rank:
        return None
    lead = array.ndim - len(shape)
    if lead > 0:
        if any(d != 1 for d in array.shape[:lead]):
            return None
        array = array.reshape(array.shape[lead:])
    try:
        return np.ascontiguousarray(np.broadcast_to(array, shape))
    except ValueError:
        return None


def _fuse(graph, registry, match):
    if registry.find_op("", "LayerNormalization", OPSET) is None:
        return None
    x = graph.info(match.values["x"])
    if x is None or x.dtype.kind != "f":
        return None
    axes = reduce_axes(graph, match.node("mean"), x.rank)
    if not axes or axes != reduce_axes(graph, match.node("var"), x.rank):
        return None
    first = x.rank - len(axes)
    shape = tuple(x.shape[first:])
    if axes != tuple(range(first, x.rank)) or not all(isinstance(d, int) for d in shape):
        return None
    scale = np.ones(shape, x.dtype) if "gamma" not in match.values else \
        affine_parameter(match.const("gamma"), shape, x.dtype, x.rank)
    bias = None if "beta" not in match.values else affine_parameter(match.const("beta"), shape, x.dtype, x.rank)
    if scale is None or ("beta" in match.values and bias is None):
        return None
    root = match.root.name
    inputs = [match.values["x"], add_constant(graph, f"{root}/scale", scale)]
    if bias is not None:
        inputs.append(add_constant(graph, f"{root}/bias", bias))
    attrs = {"axis": -len(axes), "epsilon": float(match.const("eps").reshape(-1)[0])}
    return match.fused(registry, "LayerNormalization", inputs, attrs, opset=OPSET)


RULES = [
    Rule("layernorm_scale_bias", op("Add", op("Mul", _normed, const("gamma")), const("beta")), _fuse),
    Rule("layernorm_scale", op("Mul", _normed, const("gamma")), _fuse),
    Rule("layernorm_bias", op("Add", _normed, const("beta")), _fuse),
    Rule("layernorm", _normed, _fuse),
]


def run(graph, registry) -> int:
    """Replace each primitive-op layer normalization by a LayerNormalization node."""
    return rewrite_matches(graph, registry, RULES)
