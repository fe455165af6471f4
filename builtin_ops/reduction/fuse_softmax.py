"""Fuse softmax written in primitive ops into one Softmax node (opset 13, one axis).

Exporters and hand-written attention write softmax over axis ``a`` as::

    e = Exp(Sub(x, ReduceMax(x, axes=[a], keepdims=1)))     # or plainly Exp(x)
    y = Div(e, ReduceSum(e, axes=[a], keepdims=1))

Reduce axes are attributes or constant inputs, by opset. Softmax subtracts the maximum
itself, so both forms become ``Softmax(x, axis=a)``; the form with the subtraction is
tried first so that the ReduceMax and Sub go too.
"""

from __future__ import annotations

from plugrt.passes.pattern import Rule, capture, const, either, op, reduce_axes, rewrite_matches

OPSET = 13


def _reduce(op_type, of, name):
    """A keepdims=1 reduction, axes as an attribute or as a constant input."""
    keep = {"keepdims": 1}
    return either(op(op_type, of, name=name, attrs=keep),
                  op(op_type, of, const(f"{name}_axes"), name=name, attrs=keep))


def _softmax_of(exp):
    return op("Div", exp, _reduce("ReduceSum", exp, "sum"))


_x = capture("x")
_shifted_exp = op("Exp", op("Sub", _x, _reduce("ReduceMax", _x, "max")), name="e")
_plain_exp = op("Exp", _x, name="e")


def _fuse(graph, registry, match):
    if registry.find_op("", "Softmax", OPSET) is None:
        return None
    x = graph.info(match.values["x"])
    if x is None or x.dtype.kind != "f" or x.rank == 0:
        return None
    axes = reduce_axes(graph, match.node("sum"), x.rank)
    if axes is None or len(axes) != 1:
        return None
    if "max" in match.values and reduce_axes(graph, match.node("max"), x.rank) != axes:
        return None
    return match.fused(registry, "Softmax", [match.values["x"]], {"axis": axes[0]}, opset=OPSET)


RULES = [
    Rule("softmax_shifted", _softmax_of(_shifted_exp), _fuse),
    Rule("softmax", _softmax_of(_plain_exp), _fuse),
]


def run(graph, registry) -> int:
    """Replace each primitive-op softmax by a Softmax node."""
    return rewrite_matches(graph, registry, RULES)
