"""Fuse ``x * Sigmoid(x)`` into one Swish node (opset 24).

PyTorch exports ``nn.SiLU`` (LLaMA's MLP gate, YOLO's convolutions) as
``Mul(x, Sigmoid(x))`` and CLIP's QuickGELU as ``Mul(x, Sigmoid(Mul(x, 1.702)))``; both are
Swish, with alpha 1 and 1.702. As one pointwise op with a device function, the activation
fuses into the epilogue of the MatMul or Conv before it, which the two-node form, whose
input is read twice, cannot.
"""

from __future__ import annotations

from plugrt.passes.pattern import Rule, capture, const, is_scalar, op, rewrite_matches

OPSET = 24

_x = capture("x")


def _fuse(graph, registry, match):
    x = graph.info(match.values["x"])
    if x is None or x.dtype.kind != "f" or registry.find_op("", "Swish", OPSET) is None:
        return None
    alpha = 1.0 if "alpha" not in match.values else float(match.const("alpha").reshape(-1)[0])
    return match.fused(registry, "Swish", [match.values["x"]], {"alpha": alpha}, opset=OPSET)


RULES = [
    Rule("silu", op("Mul", _x, op("Sigmoid", _x)), _fuse),
    Rule("swish", op("Mul", _x, op("Sigmoid", op("Mul", _x, const("alpha", is_scalar)))), _fuse),
]


def run(graph, registry) -> int:
    """Replace each ``x * Sigmoid(alpha * x)`` by a Swish node."""
    return rewrite_matches(graph, registry, RULES)
