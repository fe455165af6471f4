"""Fuse rotary position embeddings into one ``plugrt.elementwise::RotaryEmbedding``.

Hugging Face's ``apply_rotary_pos_emb`` (LLaMA, Mistral, Qwen, GPT-NeoX), exported::

    x1 = Slice(x, [0], [D/2], axes=[-1]);  x2 = Slice(x, [D/2], [end], axes=[-1])
    y = Add(Mul(x, cos), Mul(Concat(Neg(x2), x1, axis=-1), sin))

The slice bounds must be constants after constant folding (an export computes D/2 from
``Shape(x)``; D is static in every such model); steps, if given, 1. cos and sin may be any
tensors of X's dtype that broadcast unidirectionally to X (``[B, 1, S, D]`` against
``[B, H, S, D]``), computed at run time or constant. Without the fusion the pattern costs
two slices, a Neg, a Concat and a pointwise chain; fused, one pass over X.
"""

from __future__ import annotations

from plugrt.passes.pattern import Rule, capture, const, either, op, rewrite_matches

from .rotary_ops import DOMAIN

OPSET = 1

_x = capture("x")


def _slice(name: str):
    """Slice(x, starts, ends[, axes[, steps]]) with constant parameters (opset 10 on)."""
    parameters = [const(f"{name}_{p}") for p in ("starts", "ends", "axes", "steps")]
    return either(*(op("Slice", _x, *parameters[:count], name=name) for count in (4, 3, 2)))


_rotated = op("Concat", op("Neg", _slice("second")), _slice("first"), name="rotated")
_rope = op("Add", op("Mul", _x, capture("cos")), op("Mul", _rotated, capture("sin")))


def _last_axis_range(match, name: str, rank: int, size: int) -> tuple[int, int] | None:
    """The ``[start, end)`` a matched Slice takes of the last axis (of ``size``), or ``None``
    when it slices another axis, several, or with a step other than 1."""
    starts, ends = match.const(f"{name}_starts"), match.const(f"{name}_ends")
    axes, steps = match.const(f"{name}_axes"), match.const(f"{name}_steps")
    if starts.size != 1 or ends.size != 1 or (axes is not None and axes.size != 1):
        return None
    axis = int(axes.reshape(-1)[0]) if axes is not None else 0
    if not -rank <= axis < rank or axis % rank != rank - 1:
        return None
    if steps is not None and (steps.size != 1 or int(steps.reshape(-1)[0]) != 1):
        return None
    bounds = []
    for value in (int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])):
        value = value + size if value < 0 else value
        bounds.append(min(max(value, 0), size))
    return bounds[0], bounds[1]


def _broadcasts_to(table, x) -> bool:
    """Whether ``table``'s shape stretches to ``x``'s without growing it (dims equal or 1)."""
    if table.rank > x.rank:
        return False
    return all(t == 1 or t == d for t, d in zip(table.shape[::-1], x.shape[::-1]))


def _fuse(graph, registry, match):
    if registry.find_op(DOMAIN, "RotaryEmbedding", OPSET) is None:
        return None
    x, cos, sin = (graph.info(match.values[name]) for name in ("x", "cos", "sin"))
    if x is None or cos is None or sin is None or x.dtype.kind != "f" or x.rank < 1:
        return None
    if cos.dtype != x.dtype or sin.dtype != x.dtype or not (_broadcasts_to(cos, x) and _broadcasts_to(sin, x)):
        return None
    size = x.shape[-1]
    if not isinstance(size, int) or size % 2:
        return None
    half = size // 2
    if _last_axis_range(match, "first", x.rank, size) != (0, half) or \
            _last_axis_range(match, "second", x.rank, size) != (half, size):
        return None
    if match.node("rotated").attrs.get("axis", 0) % x.rank != x.rank - 1:
        return None
    inputs = [match.values[name] for name in ("x", "cos", "sin")]
    return match.fused(registry, "RotaryEmbedding", inputs, opset=OPSET, domain=DOMAIN)


RULES = [Rule("rotary_embedding", _rope, _fuse)]


def run(graph, registry) -> int:
    """Replace each rotate-half rotary embedding by a RotaryEmbedding node."""
    return rewrite_matches(graph, registry, RULES)
