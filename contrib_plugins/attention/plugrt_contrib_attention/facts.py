"""Dim facts for the attention rewrites' checks, the int lists they read off nodes, and the
log line a rewrite that cannot apply leaves.

Inferred dims decide where they are ints or the same symbol; where they are symbols that
differ (a Reshape whose target is computed from another tensor's shape), the dims at the
graph's sample shapes do (see :func:`plugrt.passes.pattern.shape_facts`).
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.passes.pattern import constant_value, shape_facts

log = logging.getLogger("plugrt.passes.fuse_attention")


def perm_of(node) -> list[int] | None:
    """A Transpose's ``perm`` (``None`` where it is left to the default)."""
    perm = node.attrs.get("perm")
    return None if perm is None else [int(p) for p in perm]


def ints_of(graph, node, attr: str) -> list[int] | None:
    """An int list given as attribute ``attr`` or (later opsets) as constant input 1:
    Squeeze's and Unsqueeze's ``axes``."""
    values = node.attrs.get(attr)
    if len(node.inputs) > 1 and node.inputs[1]:
        values = constant_value(graph, node.inputs[1])
    if values is None:
        return None
    return [int(v) for v in np.asarray(values).reshape(-1)]


def not_fused(where, why: str) -> None:
    """Say (``-v``) why the attention at node ``where`` stays as it is (a rule's ``None``)."""
    log.info("fuse_attention: %s stays unfused: %s", where.describe(), why)


class Dims:
    """Questions about the dims of a graph's values, answered by inference or, where its
    symbols differ, at every sample shape."""

    def __init__(self, graph, registry):
        self.graph, self.registry, self._facts = graph, registry, None

    def shape(self, name: str) -> tuple:
        return tuple(self.graph.info(name).shape)

    def _sampled(self, name: str, axis: int) -> tuple:
        if self._facts is None:
            self._facts = shape_facts(self.graph, self.registry)
        return tuple(shape[axis] for shape in self._facts(name))

    def _sampling(self) -> bool:
        return bool(self.graph.sample_inputs)

    def equal(self, a: str, a_axis: int, b: str, b_axis: int) -> bool:
        if self.graph.info(a).shape[a_axis] == self.graph.info(b).shape[b_axis]:
            return True
        return self._sampling() and self._sampled(a, a_axis) == self._sampled(b, b_axis)

    def one_or_equal(self, a: str, a_axis: int, b: str, b_axis: int) -> bool:
        return self.is_size(a, a_axis, 1) or self.equal(a, a_axis, b, b_axis)

    def is_size(self, name: str, axis: int, size: int) -> bool:
        """Whether the dim is ``size`` (everywhere the graph runs, as far as facts tell)."""
        dim = self.graph.info(name).shape[axis]
        if isinstance(dim, int):
            return dim == size
        return self._sampling() and set(self._sampled(name, axis)) == {size}

    def fixed(self, name: str, axis: int) -> int | None:
        """The dim as an int: inferred, or the one value it has at every sample; else ``None``."""
        dim = self.graph.info(name).shape[axis]
        if isinstance(dim, int):
            return dim
        sampled = set(self._sampled(name, axis)) if self._sampling() else set()
        return sampled.pop() if len(sampled) == 1 else None

    def product(self, name: str, axes, b: str, b_axis: int) -> bool:
        """Whether the product of ``name``'s dims ``axes`` is ``b``'s dim ``b_axis``."""
        dims = [self.graph.info(name).shape[axis] for axis in axes]
        want = self.graph.info(b).shape[b_axis]
        if all(isinstance(d, int) for d in dims) and isinstance(want, int):
            total = 1
            for d in dims:
                total *= d
            return total == want
        if not self._sampling():
            return False
        columns = [self._sampled(name, axis) for axis in axes]
        totals = []
        for row in zip(*columns):
            total = 1
            for d in row:
                total *= d
            totals.append(total)
        return tuple(totals) == self._sampled(b, b_axis)

    def last_two_kept(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` end in the same two dims (a layout op between them only
        moved or broadcast leading dims)."""
        ra, rb = self.graph.info(a).rank, self.graph.info(b).rank
        return ra >= 2 and rb >= 2 and self.equal(a, ra - 2, b, rb - 2) and self.equal(a, ra - 1, b, rb - 1)
