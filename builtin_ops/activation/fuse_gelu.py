"""Fuse GELU written in primitive ops into one Gelu node (opset 20).

Exact GELU, ``x * 0.5 * (1 + Erf(x / sqrt(2)))``, as exporters write it: the division
may be ``Mul(x, 1/sqrt(2))``, and the 0.5 multiplies x first, the ``1 + erf`` term, or
the product. The tanh approximation (``approximate="tanh"``)::

    0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * Pow(x, 3))))    # or x * x * x

with the 0.5 in the same three places, and Hugging Face's ``FastGELU``, the same function
with ``sqrt(2/pi) * (x + 0.044715 * x^3)`` written ``x * sqrt(2/pi) * (1 + 0.044715 * x * x)``.
Constants match within 1e-4 relative, as scalars or one-element tensors; Add and Mul match
in either input order.
"""

from __future__ import annotations

import math

from plugrt.passes.pattern import Rule, capture, close_to, const, either, op, rewrite_matches

OPSET = 20

_x = capture("x")


def _half_times(x, term):
    """``0.5 * x * term``, the 0.5 applied to x, to ``term`` or to the product."""
    half = const("half", close_to(0.5))
    return either(op("Mul", op("Mul", x, half), term),
                  op("Mul", x, op("Mul", term, half)),
                  op("Mul", op("Mul", x, term), half))


def _one_plus(term):
    return op("Add", term, const("one", close_to(1.0)))


_scaled = either(op("Div", _x, const("root_two", close_to(math.sqrt(2.0)))),
                 op("Mul", _x, const("inv_root_two", close_to(1.0 / math.sqrt(2.0)))))
_exact = _half_times(_x, _one_plus(op("Erf", _scaled)))

_cube = either(op("Pow", _x, const("three", close_to(3.0))), op("Mul", op("Mul", _x, _x), _x))
_inner = op("Add", _x, op("Mul", _cube, const("coefficient", close_to(0.044715))))
_tanh = _half_times(_x, _one_plus(op("Tanh", op("Mul", _inner, const("root_two_by_pi",
                                                                    close_to(math.sqrt(2.0 / math.pi)))))))

_square_term = op("Mul", op("Mul", _x, const("coefficient", close_to(0.044715))), _x)
_fast_inner = op("Mul", op("Mul", _x, const("root_two_by_pi", close_to(math.sqrt(2.0 / math.pi)))),
                 op("Add", _square_term, const("inner_one", close_to(1.0))))
_fast_tanh = _half_times(_x, _one_plus(op("Tanh", _fast_inner)))


def _fuse_as(approximate: str):
    def fuse(graph, registry, match):
        x = graph.info(match.values["x"])
        if x is None or x.dtype.kind != "f" or registry.find_op("", "Gelu", OPSET) is None:
            return None
        return match.fused(registry, "Gelu", [match.values["x"]], {"approximate": approximate}, opset=OPSET)
    return fuse


RULES = [
    Rule("gelu", _exact, _fuse_as("none")),
    Rule("gelu_tanh", _tanh, _fuse_as("tanh")),
    Rule("gelu_tanh_fast", _fast_tanh, _fuse_as("tanh")),
]


def run(graph, registry) -> int:
    """Replace each primitive-op GELU by a Gelu node."""
    return rewrite_matches(graph, registry, RULES)
