"""Fuse rotary position embeddings into one ``plugrt.elementwise::RotaryEmbedding``.

Hugging Face's ``apply_rotary_pos_emb`` (LLaMA, Mistral, Qwen, GPT-NeoX), exported::

    x1 = Slice(x, [0], [D/2], axes=[-1]);  x2 = Slice(x, [D/2], [end], axes=[-1])
    y = Add(Mul(x, cos), Mul(Concat(Neg(x2), x1, axis=-1), sin))

The half ``D/2`` is a constant, or computed the way the TorchScript exporter writes
``x.shape[-1] // 2``, ``Unsqueeze(Div(Gather(Shape(x), -1), 2))`` (integer Casts between):
half of X's last dim at every shape, so the fused op computes the same. Steps, if given,
are 1; the second slice runs to the end. cos and sin are any tensors of X's dtype that
broadcast to X without growing it (``[B, 1, S, D]`` against ``[B, H, S, D]``), computed at
run time or constant. Where X's dims are symbols inference cannot pin (a Reshape to a
shape computed at run time), these dim checks hold at every sample shape of the build,
and the kernel checks them again at its concrete shapes.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.passes.pattern import Rule, capture, const, constant_value, either, op, rewrite_matches, shape_facts

from .rotary_ops import DOMAIN

OPSET = 1
#: A slice bound computed as half of X's last dim.
HALF = "half"
#: An end at or past this runs to the end of any axis.
END = 2**31 - 1

_x = capture("x")


def _slice(name: str):
    """Slice(x, starts, ends[, axes[, steps]]): bounds of any value, axes and steps constant."""
    parameters = [capture(f"{name}_starts"), capture(f"{name}_ends"), const(f"{name}_axes"), const(f"{name}_steps")]
    return either(*(op("Slice", _x, *parameters[:count], name=name) for count in (4, 3, 2)))


_rotated = op("Concat", op("Neg", _slice("second")), _slice("first"), name="rotated")
_rope = op("Add", op("Mul", _x, capture("cos")), op("Mul", _rotated, capture("sin")))


def _is_half_of_last_dim(graph, value: str, x: str, rank: int) -> bool:
    """Whether ``value`` is computed as ``x.shape[-1] // 2``, as TorchScript exports it."""
    producers = graph.producers()

    def source(name):
        node = producers.get(name)
        while node is not None and node.op_type == "Cast" and graph.info(node.outputs[0]).dtype.kind in "iu":
            node = producers.get(node.inputs[0])
        return node

    node = source(value)
    if node is not None and node.op_type == "Unsqueeze":
        node = source(node.inputs[0])
    two = constant_value(graph, node.inputs[1]) if node is not None and node.op_type == "Div" else None
    if two is None or two.size != 1 or two.reshape(-1)[0] != 2:
        return False
    gather = source(node.inputs[0])
    if gather is None or gather.op_type != "Gather" or gather.attrs.get("axis", 0) != 0:
        return False
    index, shape = constant_value(graph, gather.inputs[1]), producers.get(gather.inputs[0])
    if index is None or index.size != 1 or int(index.reshape(-1)[0]) % rank != rank - 1:
        return False
    whole = shape is not None and shape.op_type == "Shape" and shape.inputs[0] == x
    return whole and not shape.attrs.get("start") and shape.attrs.get("end") is None


def _bound(graph, match, name: str, rank: int) -> int | str | None:
    """A slice bound: its value if constant, ``HALF``, or ``None`` (anything else)."""
    value = match.values[name]
    array = constant_value(graph, value)
    if array is not None:
        return int(array.reshape(-1)[0]) if array.size == 1 and array.dtype.kind in "iu" else None
    return HALF if _is_half_of_last_dim(graph, value, match.values["x"], rank) else None


def _slices_halve(graph, match, rank: int, size: int | None) -> bool:
    """Whether the slices take ``[0, D/2)`` and ``[D/2, D)`` of the last axis, step 1
    (``size``: D where inference knows it)."""
    half = HALF if size is None else size // 2
    for name in ("first", "second"):
        axes, steps = match.const(f"{name}_axes"), match.const(f"{name}_steps")
        axis = 0 if axes is None else int(axes.reshape(-1)[0])  # absent axes: 0, 1, ...
        if axes is not None and axes.size != 1 or not -rank <= axis < rank or axis % rank != rank - 1:
            return False
        if steps is not None and (steps.size != 1 or int(steps.reshape(-1)[0]) != 1):
            return False
    start, end = _bound(graph, match, "first_starts", rank), _bound(graph, match, "first_ends", rank)
    if start != 0 or end not in (HALF, half):
        return False
    start, end = _bound(graph, match, "second_starts", rank), _bound(graph, match, "second_ends", rank)
    to_end = isinstance(end, int) and (end >= END or size is not None and end >= size)
    return start in (HALF, half) and to_end


class SampledShapes:
    """Values' shapes at every sample shape of the build, worked out once per pass run (a
    rewrite keeps the names and shapes of the values the next match reads)."""

    def __init__(self, graph, registry):
        self.graph, self.registry, self._facts = graph, registry, None

    def __call__(self, name: str) -> tuple | None:
        if not self.graph.sample_inputs:
            return None
        if self._facts is None:
            self._facts = shape_facts(self.graph, self.registry)
        try:
            return self._facts(name)
        except KeyError:  # a value made after the samples were run
            self._facts = shape_facts(self.graph, self.registry)
            return self._facts(name)


def _dims_fit(graph, match, sampled: SampledShapes) -> bool:
    """X's last dim is even and cos, sin broadcast to X without growing it: by the inferred
    shapes where static, else at every sample shape of the build."""
    names = [match.values[name] for name in ("x", "cos", "sin")]
    shapes = [tuple(graph.info(name).shape) for name in names]
    if all(isinstance(d, int) for shape in shapes for d in shape):
        return _fit(*shapes)
    samples = [sampled(name) for name in names]
    return samples[0] is not None and all(_fit(*sample) for sample in zip(*samples))


def _fit(x, cos, sin) -> bool:
    if not x or x[-1] % 2:
        return False
    try:
        return all(np.broadcast_shapes(x, table) == tuple(x) for table in (cos, sin))
    except ValueError:
        return False


def _fuse(graph, registry, match, sampled: SampledShapes | None = None):
    if registry.find_op(DOMAIN, "RotaryEmbedding", OPSET) is None:
        return None
    x, cos, sin = (graph.info(match.values[name]) for name in ("x", "cos", "sin"))
    if x is None or cos is None or sin is None or x.dtype.kind != "f" or x.rank < 1:
        return None
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        return None
    if match.node("rotated").attrs.get("axis", 0) % x.rank != x.rank - 1:
        return None
    size = x.shape[-1] if isinstance(x.shape[-1], int) else None
    if not _slices_halve(graph, match, x.rank, size) or \
            not _dims_fit(graph, match, sampled or SampledShapes(graph, registry)):
        return None
    inputs = [match.values[name] for name in ("x", "cos", "sin")]
    return match.fused(registry, "RotaryEmbedding", inputs, opset=OPSET, domain=DOMAIN)


RULES = [Rule("rotary_embedding", _rope, _fuse)]


def run(graph, registry) -> int:
    """Replace each rotate-half rotary embedding by a RotaryEmbedding node."""
    sampled = SampledShapes(graph, registry)
    rules = [Rule(rule.name, rule.pattern, functools.partial(rule.rewrite, sampled=sampled)) for rule in RULES]
    return rewrite_matches(graph, registry, rules)
