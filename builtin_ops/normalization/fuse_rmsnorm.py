"""Fuse RMS normalization written in primitive ops into one RMSNormalization (opset 23).

LLaMA's and T5's ``RMSNorm`` (``x * rsqrt(mean(x^2, -1) + eps) * weight``), as the PyTorch
exporters write it::

    ms = ReduceMean(Pow(x, 2), axes=last k, keepdims=1)       # or Mul(x, x)
    y = Div(x, Sqrt(Add(ms, eps)))                            # or x * Reciprocal(Sqrt(.)),
                                                              # or x * Div(1, Sqrt(.)) (rsqrt)
    y = Mul(y, weight)                                        # optional

Hugging Face's float16 models upcast around it: ``x`` reaches the Pow and the product
through a ``Cast`` to float32, and ``y`` goes back through a ``Cast`` before the weight.
The fused node reads the model's ``x`` and computes in float32 (float64 for float64),
rounding once to the result's dtype, which its scale carries (ones when there is no
weight). A widening Cast is absorbed; a narrowing one is not (the fused op would read
values the model rounds away): the rules without Casts then fuse what follows it. eps must
be a constant.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import Rule, add_constant, capture, close_to, const, either, is_scalar, op, reduce_axes, \
    rewrite_matches

from .fuse_layernorm import affine_parameter, mean_of, square_of

OPSET = 23

_x = capture("x")


def _normed(x):
    """``x / sqrt(mean(x^2) + eps)``, the division written any of the exporters' ways."""
    rms = op("Sqrt", op("Add", mean_of(square_of(x, "x"), "mean_square"), const("eps", is_scalar)))
    return either(op("Div", x, rms),
                  op("Mul", x, op("Reciprocal", rms)),
                  op("Mul", x, op("Div", const("one", close_to(1.0)), rms)))


_widened = _normed(either(op("Cast", _x), _x))  # float16 models upcast x first; float32 ones have no Cast
_upcast = either(op("Cast", _widened), _widened)  # and cast the result back before the weight
_plain = _normed(_x)


def _casts_widen(graph, match, x) -> bool:
    """Every matched Cast converts between float dtypes, and those reading x lose nothing."""
    for node in match.nodes:
        if node.op_type != "Cast":
            continue
        source, target = graph.info(node.inputs[0]), graph.info(node.outputs[0])
        if source is None or target is None or source.dtype.kind != "f" or target.dtype.kind != "f":
            return False
        if node.inputs[0] == match.values["x"] and target.dtype.itemsize < x.dtype.itemsize:
            return False
    return True


def _fuse(graph, registry, match):
    if registry.find_op("", "RMSNormalization", OPSET) is None:
        return None
    x, y = graph.info(match.values["x"]), graph.info(match.root.outputs[0])
    if x is None or y is None or x.dtype.kind != "f" or y.dtype.kind != "f" or not _casts_widen(graph, match, x):
        return None
    axes = reduce_axes(graph, match.node("mean_square"), x.rank)
    if not axes:
        return None
    first = x.rank - len(axes)
    shape = tuple(x.shape[first:])
    if axes != tuple(range(first, x.rank)) or not all(isinstance(d, int) for d in shape):
        return None
    if "gamma" in match.values:
        scale = affine_parameter(match.const("gamma"), shape, y.dtype, x.rank)
    else:
        scale = np.ones(shape, y.dtype)
    if scale is None:
        return None
    inputs = [match.values["x"], add_constant(graph, f"{match.root.name}/scale", scale)]
    attrs = {"axis": -len(axes), "epsilon": float(match.const("eps").reshape(-1)[0])}
    return match.fused(registry, "RMSNormalization", inputs, attrs, opset=OPSET)


RULES = [
    Rule("rmsnorm_upcast_scale", op("Mul", _upcast, const("gamma")), _fuse),
    Rule("rmsnorm_upcast", _upcast, _fuse),
    Rule("rmsnorm_scale", op("Mul", _plain, const("gamma")), _fuse),
    Rule("rmsnorm", _plain, _fuse),
]


def run(graph, registry) -> int:
    """Replace each primitive-op RMS normalization by an RMSNormalization node."""
    return rewrite_matches(graph, registry, RULES)
