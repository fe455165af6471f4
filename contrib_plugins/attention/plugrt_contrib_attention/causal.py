"""Causal masks as exports write them, recognized for the op's ``causal`` attribute.

A causal mask lets query row ``i`` see keys ``j <= i + diag``: ``diag = 0`` (alignment 1,
upper left: PyTorch's ``is_causal``, ``tril(ones(Sq, Sk))``) or ``diag = Sk - Sq``
(alignment 2, lower right: the queries are the last of the keys' positions, as GPT-2's
``bias[:, :, Sk - Sq : Sk, :Sk]`` says). Both give every row a key when ``Sk >= Sq``, and
the first also when not, so a fused row is never empty where the graph's was not.

Exports write it as a condition (``Where(cond, scores, fill)``) or as an additive mask:

- a constant (folded from static shapes) whose last two dims are the scores' and whose
  leading slices are equal: nonzero where seen (a condition) or 0 where seen and
  ``<= FILL_LIMIT`` elsewhere (additive);
- ``Trilu`` of a tensor filled with one value: ones, lower (a condition; ``Trilu(...,
  upper=1, k=1)`` of ones is its complement), or the fill, upper from ``k = 1`` (additive,
  LLaMA's ``triu(full(min), 1)``), the Trilu's last two dims the scores';
- a constant lower-triangular ``bias`` buffer sliced to rows ``[end - Sq, end)`` and columns
  ``[0, end)`` (GPT-2; the two ends one value, the result's last two dims the scores');
- wrapped in ``Cast`` (to or from bool), ``Not``, ``Equal(x, 0)``, ``Where(c, fill, 0)``
  and layout ops that keep the last two dims (``Unsqueeze``, ``Expand``, ``Reshape``).

An additive mask's fill must be at or below ``FILL_LIMIT``: the op replaces the scores of
hidden keys by the fill, where the graph adds it to them; with ``finfo.min`` the two are
the same float32, and with any such fill both weigh nothing (``exp(-1e4)`` is 0) unless
every key a row sees is masked as well.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import constant_value

from plugrt_contrib_attention.problem import MASKED_FILL

#: The additive fills read as "masked": at or below this (finfo.min, -1e4, -inf).
FILL_LIMIT = MASKED_FILL
_LEADING_ONLY = ("Unsqueeze", "Expand", "Reshape")


def alignment(allowed: np.ndarray) -> int:
    """1 or 2 for a 2-D boolean ``allowed`` that is a causal pattern, else 0."""
    rows, cols = allowed.shape
    if rows == 0 or cols == 0:
        return 0
    if np.array_equal(allowed, np.tri(rows, cols, 0, dtype=bool)):
        return 1
    if cols >= rows and np.array_equal(allowed, np.tri(rows, cols, cols - rows, dtype=bool)):
        return 2
    return 0


class CausalReader:
    """Reads whether values of a graph are causal masks of one attention's scores."""

    def __init__(self, graph, dims, scores: str):
        self.graph, self.dims, self.scores = graph, dims, scores
        self.producers = graph.producers()

    # ------------------------------------------------------------------ entry points

    def condition(self, name: str, keep: bool) -> int:
        """The alignment of a condition true where keys are seen (``keep``) or masked."""
        name, node = self._unwrap(name, booleans=True)
        array = constant_value(self.graph, name)
        if array is not None:
            return self._constant(name, (array != 0) if keep else (array == 0))
        if node is None:
            return 0
        if node.op_type == "Not":
            return self.condition(node.inputs[0], not keep)
        if node.op_type == "Equal":
            other = self._other_than_zero(node)
            return self.condition(other, not keep) if other else 0
        if node.op_type == "Trilu":
            return self._trilu(node, keep)
        if node.op_type == "Slice" and keep:
            return self._sliced_buffer(node)
        return 0

    def additive(self, name: str) -> tuple[int, float]:
        """``(alignment, fill)`` of an additive mask: 0 where seen, one ``fill`` at most
        ``FILL_LIMIT`` elsewhere; ``(0, 0.0)`` for any other tensor."""
        name, node = self._unwrap(name, booleans=False)
        array = constant_value(self.graph, name)
        if array is not None:
            fills = np.unique(array[array != 0]) if array.dtype.kind == "f" else np.zeros(2)
            if fills.size != 1 or not _is_fill(float(fills[0])):
                return 0, 0.0
            return self._constant(name, array == 0), float(fills[0])
        if node is None:
            return 0, 0.0
        if node.op_type == "Where":
            first, second = (constant_value(self.graph, n) for n in node.inputs[1:])
            if _is_fill(first) and _is_zero(second):
                return self.condition(node.inputs[0], keep=False), float(first.reshape(-1)[0])
            if _is_zero(first) and _is_fill(second):
                return self.condition(node.inputs[0], keep=True), float(second.reshape(-1)[0])
            return 0, 0.0
        if node.op_type == "Trilu" and node.attrs.get("upper") == 1 and self._k(node) == 1:
            fill = self._filled_with(node.inputs[0])
            if _is_fill(fill) and self._scores_sized(node.outputs[0]):
                return 1, fill
        return 0, 0.0

    # ------------------------------------------------------------------ forms

    def _constant(self, name: str, allowed: np.ndarray) -> int:
        if allowed.ndim < 2 or not self._scores_sized(name, static=allowed.shape[-2:]):
            return 0
        return alignment(_uniform(allowed))

    def _trilu(self, node, keep: bool) -> int:
        """``Trilu`` of ones: lower from the diagonal seen, or upper from ``k = 1`` masked."""
        k, upper = self._k(node), node.attrs.get("upper")
        ones = self._filled_with(node.inputs[0])
        if ones is None or ones != 1 or not self._scores_sized(node.outputs[0]):
            return 0
        if (keep and upper == 0 and k == 0) or (not keep and upper == 1 and k == 1):
            return 1
        return 0

    def _sliced_buffer(self, node) -> int:
        """GPT-2's ``bias[:, :, end - Sq : end, :end]`` of a constant lower-triangular square
        buffer, as one Slice or a chain of them (one per axis): columns from 0, both axes
        to one ``end``, the result's last two dims the scores' (so rows from ``end - Sq``)."""
        sliced, spans = node.outputs[0], {}
        while node is not None and node.op_type == "Slice":
            found = self._slice_spans(node)
            if found is None or set(found) & set(spans):
                return 0
            spans.update(found)
            source = node.inputs[0]
            node = self.producers.get(source)
        buffer = constant_value(self.graph, source)
        if buffer is None or buffer.ndim < 2 or buffer.shape[-1] != buffer.shape[-2] or set(spans) != {-2, -1}:
            return 0
        if alignment(_uniform(buffer != 0)) != 1:
            return 0
        (_, row_end), (col_start, col_end) = spans[-2], spans[-1]
        if col_start != 0 or row_end != col_end:
            return 0
        return 2 if self._scores_sized(sliced) else 0

    def _slice_spans(self, node):
        """``{axis from the end: (start, end)}`` of a Slice over the last two axes with
        steps 1; a bound is its int when constant, else ``(value name, index)``."""
        rank = self.graph.info(node.inputs[0]).rank
        count = self.graph.info(node.inputs[1]).shape[0]
        extra = list(node.inputs[3:5]) + ["", ""]
        axes = constant_value(self.graph, extra[0]) if extra[0] else np.arange(count if isinstance(count, int) else 0)
        steps = constant_value(self.graph, extra[1]) if extra[1] else None
        if axes is None or axes.size == 0 or (extra[1] and (steps is None or np.any(steps != 1))):
            return None
        spans = {}
        for index, axis in enumerate(int(a) % rank for a in axes.reshape(-1)):
            if axis < rank - 2:
                return None
            spans[axis - rank] = (self._bound(node.inputs[1], index), self._bound(node.inputs[2], index))
        return spans

    def _bound(self, name: str, index: int):
        """Item ``index`` of a Slice's starts or ends: an int, or ``(value name, index)``."""
        array = constant_value(self.graph, name)
        return int(array.reshape(-1)[index]) if array is not None else (name, index)

    # ------------------------------------------------------------------ helpers

    def _unwrap(self, name: str, booleans: bool):
        """Step back over casts and layout ops that keep the last two dims; ``(value, its producer)``."""
        while True:
            node = self.producers.get(name)
            if node is None:
                return name, None
            source = node.inputs[0] if node.inputs else None
            if node.op_type == "Cast" and source:
                kinds = {self.graph.info(source).dtype.kind, self.graph.info(name).dtype.kind}
                if ("b" in kinds) if booleans else (kinds == {"f"}):
                    name = source
                    continue
            if node.op_type in _LEADING_ONLY and source and self.dims.last_two_kept(source, name):
                name = source
                continue
            return name, node

    def _scores_sized(self, name: str, static=None) -> bool:
        """Whether the value's last two dims are the scores' ``[Sq, Sk]`` (``static``: a
        constant's dims)."""
        rank, scores = self.graph.info(name).rank, self.scores
        if static is not None:
            return all(self.dims.is_size(scores, axis, int(n)) for axis, n in zip((2, 3), static))
        return rank >= 2 and self.dims.equal(name, rank - 2, scores, 2) and self.dims.equal(name, rank - 1, scores, 3)

    def _filled_with(self, name: str):
        """The one value a tensor is filled with (a constant, or Expand/ConstantOfShape of one)."""
        array = constant_value(self.graph, name)
        node = self.producers.get(name)
        if array is None and node is not None and node.op_type == "Expand":
            array = constant_value(self.graph, node.inputs[0])
        elif array is None and node is not None and node.op_type == "ConstantOfShape":
            value = node.attrs.get("value")
            array = np.zeros(1, np.float32) if value is None else np.asarray(value)
        if array is None or array.size == 0 or np.any(array != array.reshape(-1)[0]):
            return None
        return float(array.reshape(-1)[0])

    def _k(self, node):
        """A Trilu's diagonal offset (``None``: not a constant)."""
        if len(node.inputs) < 2 or not node.inputs[1]:
            return 0
        k = constant_value(self.graph, node.inputs[1])
        return None if k is None else int(k.reshape(-1)[0])

    def _other_than_zero(self, node):
        """The input of ``Equal(x, 0)`` (either order) that is not the zero, or ``None``."""
        a, b = node.inputs
        if _is_zero(constant_value(self.graph, b)):
            return a
        if _is_zero(constant_value(self.graph, a)):
            return b
        return None


def _is_zero(array) -> bool:
    return array is not None and array.size == 1 and float(array.reshape(-1)[0]) == 0


def _is_fill(array) -> bool:
    """A masking fill: one float at most ``FILL_LIMIT`` (an array of one element, or a float)."""
    if isinstance(array, float):
        return array <= FILL_LIMIT
    return array is not None and array.size == 1 and array.dtype.kind == "f" and float(array.reshape(-1)[0]) <= FILL_LIMIT


def _uniform(allowed: np.ndarray) -> np.ndarray:
    """The one 2-D slice ``allowed`` repeats over its leading dims (empty if they differ)."""
    slices = allowed.reshape((-1,) + allowed.shape[-2:])
    return slices[0] if all(np.array_equal(x, slices[0]) for x in slices[1:]) else np.zeros((0, 0), bool)
