"""The family's ``fold_transposes`` pass: a MatMul whose operands are Transposes (and/or
multiplied by scalar constants) reads them through permuted strides instead.

Exports write attention as ``MatMul(Mul(Transpose(Q), s), Mul(Transpose(K), s))``: a
Transpose kernel per operand (the head split ``[B, S, H, D] -> [B, H, S, D]``, K's
``[0, 2, 3, 1]``), a scaling kernel each, then a product whose B is not K-contiguous.
Folded, the product reads Q and K in place (K-contiguous, which the FP16 ``wgmma`` tactic
needs) and the scales become its ``alpha``. A Transpose swapping only the last two dims
gives ONNX Runtime's ``com.microsoft::FusedMatMul`` (``transA``/``transB``); any other
gives ``plugrt.matmul::PermutedMatMul``. Only a Transpose or Mul nothing else reads is
folded, and a scale only when it is one value that keeps the operand's rank. Runs after
the contrib plugins' fusions (priority 200): the attention plugin matches the unfolded
form.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import Rule, capture, const, either, is_scalar, op, rewrite_matches
from plugrt_builtin_ops.common.layout import transpose_perm

#: The fused ops' domains and opsets.
FUSED_MATMUL = ("com.microsoft", "FusedMatMul", 1)
PERMUTED_MATMUL = ("plugrt.matmul", "PermutedMatMul", 1)


def _side(name: str):
    """An operand: ``Mul(Transpose(x), s)``, ``Mul(x, s)``, ``Transpose(x)`` or ``x``."""
    transposed = op("Transpose", capture(name), name=f"t{name}")
    scale = const(f"s{name}", is_scalar)
    return either(op("Mul", transposed, scale, name=f"m{name}"), op("Mul", capture(name), scale, name=f"m{name}"),
                  transposed, capture(name))


def _perm(graph, node) -> list[int] | None:
    rank = graph.info(node.inputs[0]).rank
    perm = transpose_perm(node, rank)
    return None if perm == list(range(rank)) else perm


def _fold(graph, registry, match):
    perms, alpha = {}, 1.0
    for side in ("a", "b"):
        source = graph.info(match.values[side])
        if source is None or source.rank < 2:
            return None
        if f"t{side}" in match.values:
            perms[side] = _perm(graph, match.node(f"t{side}"))
        if f"s{side}" in match.values:
            scaled = graph.info(match.node(f"m{side}").outputs[0])
            if scaled is None or scaled.rank != source.rank:
                return None  # the scale widens the operand: not a plain factor
            alpha *= float(np.asarray(match.const(f"s{side}")).reshape(-1)[0])
    if not any(perms.values()) and alpha == 1.0:
        return None  # a plain MatMul
    ranks = {side: graph.info(match.values[side]).rank for side in ("a", "b")}
    last_two = {side: list(range(ranks[side] - 2)) + [ranks[side] - 1, ranks[side] - 2] for side in ranks}
    if all(perms.get(side) in (None, last_two[side]) for side in ("a", "b")):
        domain, op_type, opset = FUSED_MATMUL
        attrs = {"transA": int(perms.get("a") is not None), "transB": int(perms.get("b") is not None), "alpha": alpha}
    else:
        domain, op_type, opset = PERMUTED_MATMUL
        attrs = {"perm_a": perms.get("a") or [], "perm_b": perms.get("b") or [], "alpha": alpha}
    fused = match.fused(registry, op_type, [match.values["a"], match.values["b"]], attrs, opset=opset, domain=domain)
    if fused is not None:
        graph.opsets.setdefault(domain, opset)
    return fused


RULES = [Rule("fold_transposes", op("MatMul", _side("a"), _side("b")), _fold)]


def run(graph, registry) -> int:
    """Fold every such MatMul; the number rewritten."""
    return rewrite_matches(graph, registry, RULES)
