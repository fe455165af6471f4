"""The family's ``fold_transposes`` pass: ``MatMul(A, Transpose(B))`` whose Transpose swaps
only the last two dims becomes ``com.microsoft::FusedMatMul(A, B, transB=1)`` (and the same
for A), when nothing else reads the Transpose's output.

Exports write attention scores as ``MatMul(Q, Transpose(K, [0, 1, 3, 2]))``: a Transpose
kernel, then a product whose B is not K-contiguous. Folded, the product reads K through
swapped strides: no transpose kernel, and K is K-contiguous, which the tensor-core tactics
(FP16 ``wgmma``) need. Runs after the contrib plugins' fusions (priority 200), which may
match the unfolded form (the attention plugin does).
"""

from __future__ import annotations

from plugrt.passes.pattern import Rule, capture, op, rewrite_matches

#: Where the fused op lives, and its opset.
DOMAIN, OPSET = "com.microsoft", 1


def _swaps_last_two(graph, node) -> bool:
    info = graph.info(node.inputs[0])
    if info is None or info.rank < 2:
        return False
    rank = info.rank
    perm = node.attrs.get("perm")
    if perm is None:
        return rank == 2  # the default reverses all dims: the last two only at rank 2
    return [int(p) % rank for p in perm] == list(range(rank - 2)) + [rank - 1, rank - 2]


def _fold(graph, registry, match):
    flags = {}
    for side, transposed in (("a", "ta"), ("b", "tb")):
        if transposed in match.values:
            if not _swaps_last_two(graph, match.node(transposed)):
                return None
            flags[side] = 1
    fused = match.fused(registry, "FusedMatMul", [match.values["a"], match.values["b"]],
                        {"transA": flags.get("a", 0), "transB": flags.get("b", 0)}, opset=OPSET, domain=DOMAIN)
    if fused is not None:
        graph.opsets.setdefault(DOMAIN, OPSET)
    return fused


RULES = [
    Rule("both", op("MatMul", op("Transpose", capture("a"), name="ta"), op("Transpose", capture("b"), name="tb")),
         _fold),
    Rule("b", op("MatMul", capture("a"), op("Transpose", capture("b"), name="tb")), _fold),
    Rule("a", op("MatMul", op("Transpose", capture("a"), name="ta"), capture("b")), _fold),
]


def run(graph, registry) -> int:
    """Fold every such Transpose into its MatMul; the number of MatMuls rewritten."""
    return rewrite_matches(graph, registry, RULES)
