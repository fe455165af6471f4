"""Head layouts taken into fused attention: the Reshape/Transpose pairs exports write
around attention, and grouped K/V heads' repeat, become the op's ``layout``,
``num_heads`` and ``kv_num_heads`` instead of kernels of their own.

Around a ``MultiHeadAttention`` node (run after :mod:`.fuse`):

- the head merge after it, ``Reshape(Transpose(y, [0, 2, 1, 3]), [B, Sq, H * Dv])``, makes
  the output ``bsh`` (``bshd`` for the Transpose alone);
- before each of its inputs: grouped-query attention's ``repeat_kv`` on K and V,
  ``Reshape(Expand(Unsqueeze(x, 2), [B, Hk, n, S, D]), [B, Hk * n, S, D])``, becomes K/V
  with ``Hk`` heads (query head ``h`` reads ``h // n``, as the repeat did; where the cleanup
  merged the Unsqueeze into a Reshape, a Squeeze of that Reshape's output); the head split
  ``Transpose(x, [0, 2, 1, 3])`` makes it ``bshd``; and ``Reshape(x, [B, S, H, D])`` of a
  ``[B, S, H * D]`` projection then makes it ``bsh``.

Only nodes whose output the attention alone reads are taken; they are removed when nothing
reads them any more.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import (Rule, add_constant, capture, either, finish, fresh_name, make_node,
                                   op, origin_of, remove_nodes, rewrite_matches)

from plugrt_contrib_attention.facts import Dims, ints_of, perm_of
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE
from plugrt_contrib_attention.problem import parse_layout

_HEAD_SWAP = [0, 2, 1, 3]
_fused = either(op(OP_TYPE, capture("q"), capture("k"), capture("v"), domain=DOMAIN, name="mha"),
                op(OP_TYPE, capture("q"), capture("k"), capture("v"), capture("mask"), domain=DOMAIN, name="mha"))
_swapped = op("Transpose", _fused, name="merge_t")


def _merge(graph, registry, match):
    """The output's head merge (or the Transpose alone) into the fused node."""
    node, swap = match.node("mha"), match.node("merge_t")
    layout = list(parse_layout(node.attrs.get("layout")))
    out = node.outputs[0]
    if layout[3] != "bhsd" or perm_of(swap) != _HEAD_SWAP or graph.info(out) is None:
        return None
    attrs = dict(node.attrs)
    if match.root is swap:
        layout[3] = "bshd"
    else:
        dims, merged, swapped = Dims(graph, registry), match.root.outputs[0], swap.outputs[0]
        heads = dims.fixed(out, 1)
        if graph.info(merged).rank != 3 or not isinstance(heads, int) or attrs.get("num_heads") not in (0, None, heads):
            return None
        if not (dims.equal(merged, 0, swapped, 0) and dims.equal(merged, 1, swapped, 1)
                and dims.product(swapped, (2, 3), merged, 2)):
            return None
        layout[3], attrs["num_heads"] = "bsh", heads
    attrs["layout"] = ",".join(layout)
    return _renewed(node, match, node.inputs, attrs)


def _renewed(node, match, inputs, attrs, taken=()):
    """The fused node under its own name, reading ``inputs``, producing the match root's
    outputs, standing for every matched ONNX node and those ``taken``."""
    return node.replace(inputs=tuple(inputs), outputs=tuple(match.root.outputs), attrs=attrs,
                        origin=origin_of(list(match.nodes) + list(taken)))


class _Sources:
    """Walks back from the fused node's inputs over what it can read in their place."""

    def __init__(self, graph, registry, node):
        self.graph, self.registry, self.node, self.dims = graph, registry, node, Dims(graph, registry)
        self.producers, self.readers = graph.producers(), graph.consumers()
        self.bypassed = []

    def _only_ours(self, name: str, reader) -> object | None:
        """The producer of ``name`` when ``reader`` alone reads it, else ``None``."""
        if name in self.graph.outputs or any(r is not reader for r in self.readers.get(name, ())):
            return None
        return self.producers.get(name)

    def repeat(self, name: str):
        """``(source, its producers)`` of ``repeat_kv``'s output ``name``, or ``None``."""
        reshape = self._only_ours(name, self.node)
        if reshape is None or reshape.op_type != "Reshape":
            return None
        expand = self._only_ours(reshape.inputs[0], reshape)
        if expand is None or expand.op_type != "Expand":
            return None
        narrow, wide, dims = expand.inputs[0], expand.outputs[0], self.dims
        if self.graph.info(narrow).rank != 5 or self.graph.info(wide).rank != 5 or self.graph.info(name).rank != 4:
            return None
        if not (dims.one_or_equal(narrow, 0, wide, 0) and dims.equal(narrow, 1, wide, 1) and dims.is_size(narrow, 2, 1)
                and all(dims.equal(narrow, axis, wide, axis) for axis in (3, 4))
                and dims.equal(name, 0, wide, 0) and dims.product(wide, (1, 2), name, 1)
                and all(dims.equal(name, axis, wide, axis + 1) for axis in (2, 3))):
            return None
        unsqueeze = self._only_ours(narrow, expand)
        if unsqueeze is not None and unsqueeze.op_type == "Unsqueeze" and self._axes(unsqueeze) == [2]:
            return unsqueeze.inputs[0], [reshape, expand, unsqueeze]
        return self._squeezed(narrow), [reshape, expand]  # the cleanup merged the Unsqueeze into a Reshape

    def _squeezed(self, name: str) -> str:
        """A new ``Squeeze(name, axes=[2])``: the repeat's source as ``[B, Hk, S, D]``."""
        out, opset = fresh_name(self.graph, f"{name}/heads"), self.graph.opsets.get("", 13)
        axes = [add_constant(self.graph, f"{name}/axes", np.array([2], np.int64))] if opset >= 13 else []
        node = make_node(self.graph, self.registry, "Squeeze", [name] + axes, [out], {} if axes else {"axes": [2]},
                         opset=opset, name=out, origin=self.node.origin)
        self.graph.add_node(node)
        return out

    def _axes(self, node) -> list[int] | None:
        axes = ints_of(self.graph, node, "axes")
        return None if axes is None else [a % 5 for a in axes]

    def swapped(self, name: str, reader):
        """The ``[B, S, H, D]`` value whose head swap ``name`` is, or ``None``."""
        node = self._only_ours(name, reader)
        if node is None or node.op_type != "Transpose" or perm_of(node) != _HEAD_SWAP:
            return None
        return node.inputs[0], node

    def split(self, name: str, reader):
        """``(the [B, S, H * D] value, H, node)`` whose head split ``name`` is, or ``None``."""
        node = self._only_ours(name, reader)
        if node is None or node.op_type != "Reshape":
            return None
        source, dims = node.inputs[0], self.dims
        heads = dims.fixed(name, 2) if self.graph.info(name).rank == 4 else None
        if self.graph.info(source).rank != 3 or self.graph.info(name).rank != 4 or not isinstance(heads, int):
            return None
        if not (dims.equal(name, 0, source, 0) and dims.equal(name, 1, source, 1) and dims.product(name, (2, 3), source, 2)):
            return None
        return source, heads, node

    def absorb(self, index: int, layout: str, kv_heads):
        """``(value, layout, heads of a bsh value)`` the node can read for input ``index``."""
        name, reader, heads = self.node.inputs[index], self.node, None
        if index > 0 and layout == "bhsd":
            found = self.repeat(name)
            if found is not None:
                name, nodes = found
                self.bypassed += nodes
                reader = nodes[-1]
        if layout == "bhsd":
            found = self.swapped(name, reader)
            if found is not None:
                (name, reader), layout = found, "bshd"
                self.bypassed.append(reader)
        if layout == "bshd":
            found = self.split(name, reader)
            if found is not None and (index == 0 or kv_heads in (None, found[1])):
                name, heads, reader = found
                layout = "bsh"
                self.bypassed.append(reader)
        return name, layout, heads


def _split(graph, registry, match, bypassed: list):
    """The input side: repeat_kv, head swaps and head splits into the fused node."""
    node = match.root
    layout = list(parse_layout(node.attrs.get("layout")))
    attrs, inputs = dict(node.attrs), list(node.inputs)
    sources = _Sources(graph, registry, node)
    kv_heads = attrs.get("kv_num_heads") or None
    for index in range(3):
        name, layout[index], heads = sources.absorb(index, layout[index], kv_heads)
        if heads is not None:
            key = "num_heads" if index == 0 else "kv_num_heads"
            attrs[key] = heads
            kv_heads = heads if index > 0 else kv_heads
        inputs[index] = name
    if inputs == list(node.inputs):
        return None
    if layout[1] == "bsh" or layout[2] == "bsh":
        attrs["kv_num_heads"] = kv_heads
    attrs["layout"] = ",".join(layout)
    bypassed.extend(sources.bypassed)
    return _renewed(node, match, inputs, attrs, sources.bypassed)


def remove_unread(graph, nodes: list) -> None:
    """Remove those of ``nodes`` whose outputs nothing reads any more, and then the
    producers that leaves unread (the shape computations only they read)."""
    pending = list(nodes)
    while pending:
        readers, producers = graph.consumers(), graph.producers()
        dead = [n for n in pending if not any(o in readers or o in graph.outputs for o in n.outputs if o)]
        if not dead:
            return
        remove_nodes(graph, dead)
        fed = [producers[name] for node in dead for name in node.inputs if name in producers]
        pending = [n for n in pending + fed if all(n is not d for d in dead) and any(n is m for m in graph.nodes)]


def run(graph, registry) -> int:
    """Take the head layouts around every fused attention node into it (again after each
    round: a repeat taken in leaves its source's shape reads dead, which may free a head
    transpose for the next)."""
    count = rewrite_matches(graph, registry, [Rule("merge_heads", op("Reshape", _swapped, capture("merge_shape")),
                                                   _merge), Rule("swap_heads", _swapped, _merge)])
    while True:
        bypassed: list = []
        taken = rewrite_matches(graph, registry, [Rule("split_heads", _fused,
                                                       lambda g, r, m: _split(g, r, m, bypassed))])
        if not taken:
            return count
        count += taken
        remove_unread(graph, bypassed)
        finish(graph, registry)
