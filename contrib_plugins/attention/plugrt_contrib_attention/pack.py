"""The graph pass ``pack_projections``: a fused attention's Q, K and V projections of one
input become one GEMM, whose output the attention reads in place.

When it pays, the rule: always, when Q, K and V of a ``MultiHeadAttention`` are
``MatMul(x, W)`` of the same ``x`` with constant weights of one dtype, each maybe ``+ b``
(a constant bias over the last axis). One GEMM ``x [M, K] @ [Wq | Wk | Wv]`` does the
three's work in one launch with three times the columns to spread over the SMs: never
slower on a GPU at transformer sizes (BERT-base, batch 32: 36 GEMMs of 4096 x 768 x 768
become 12 of 4096 x 768 x 2304). The biases become one ``[bq | bk | bv]`` (zeros for a
projection without one), an ``Add`` after the packed MatMul, so epilogue fusion puts it in
that GEMM's epilogue as it did for each. The attention reads Q, K and V as column slices
of the packed ``[B, S, Nq + Nk + Nv]`` (its ``packed`` attribute, layout ``bsh``): no
Split, no copy. A projection's output that something else reads too (T5's first block
takes the key length from K's shape) is made for that reader by a ``Slice`` of the packed
output: a copy of its columns instead of its own GEMM.

GPT-2's form, one packed GEMM and ``Split`` (last axis, three outputs in Q, K, V order)
feeding Q, K and V: the attention reads the Split's input; the Split stays only for other
readers. timm's ViT form (and any ``q, k, v = p.view(B, S, 3, H, D).permute(2, 0, 3, 1,
4)``): ``Reshape(p, [B, S, 3, H, D])``, ``Transpose([2, 0, 3, 1, 4])``, then Q, K and V
taken apart along axis 0 (``Split`` + ``Squeeze``, ``Slice`` + ``Squeeze`` or ``Gather``,
as the exporters write ``unbind``, unpacking and indexing): the attention reads ``p`` in
place (packed ``[H * D] * 3``), and the 5-D transpose kernel is gone.

Q, K and V are found as the attention reads them: in layout ``bsh`` (the head split taken
in), or ``bshd`` through a head-split ``Reshape`` of a ``[B, S, H * D]`` value. Anything
else stays unpacked and ``-v`` says why: a projection of another input (cross-attention),
a weight that is not a constant (a graph input, a DequantizeLinear), a Gemm, a head
transpose left between, Q or K computed after the projection (LLaMA's rotary embedding),
K and V of different head counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from plugrt.passes.pattern import (add_constant, constant_value, finish, fresh_name, insert_nodes, make_node, origin_of,
                                   remove_nodes, replace_node)

from plugrt_contrib_attention.facts import Dims, ints_of, perm_of
from plugrt_contrib_attention.heads import remove_unread
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE
from plugrt_contrib_attention.problem import parse_layout

NAME = "pack_projections"
log = logging.getLogger("plugrt.passes.pack_projections")
ROLES = ("Q", "K", "V")


def kept_apart(node, why: str) -> bool:
    """Say (``-v``) why the attention at ``node`` keeps its projections apart; ``False``."""
    log.info("%s: %s keeps Q, K and V apart: %s", NAME, node.describe(), why)
    return False


@dataclass(frozen=True)
class Projection:
    """``value = MatMul(x, weight) [+ bias]``: its nodes (the Add last) and constants."""

    value: str
    x: str
    nodes: tuple
    weight: np.ndarray
    bias: np.ndarray | None


class ProjectionReader:
    """Finds the values behind an attention node's Q, K and V."""

    def __init__(self, graph, registry, node):
        self.graph, self.node, self.dims = graph, node, Dims(graph, registry)
        self.producers, self.readers = graph.producers(), graph.consumers()

    def source(self, index: int):
        """``(value [B, S, H * D], heads, head-split Reshape or None)`` input ``index`` reads, or why not."""
        attrs, name = self.node.attrs, self.node.inputs[index]
        layout = parse_layout(attrs.get("layout"))[index]
        if layout == "bsh":
            heads = attrs.get("num_heads") if index == 0 else attrs.get("kv_num_heads") or attrs.get("num_heads")
            return name, int(heads), None
        producer = self.producers.get(name)
        if layout == "bshd" and producer is not None and producer.op_type == "Reshape":
            source, dims = producer.inputs[0], self.dims
            heads = dims.fixed(name, 2)
            if (self.graph.info(source).rank == 3 and isinstance(heads, int) and dims.equal(name, 0, source, 0)
                    and dims.equal(name, 1, source, 1) and dims.product(name, (2, 3), source, 2)):
                return source, heads, producer
        made = f"made by {producer.qualified_op}" if producer is not None else "a graph input"
        return f"{ROLES[index]} is read in layout {layout} ({made}), not as a projection's [B, S, H * D]"

    def only_read_by(self, name: str, reader) -> bool:
        return name not in self.graph.outputs and all(r is reader for r in self.readers.get(name, ()))

    def projection(self, index: int, value: str):
        """The :class:`Projection` making ``value``, or why it is none."""
        role, node = ROLES[index], self.producers.get(value)
        bias, nodes = None, []
        if node is not None and node.op_type == "Add":
            for a, b in (node.inputs, node.inputs[::-1]):
                maker = self.producers.get(a)
                constant = constant_value(self.graph, b)
                if maker is not None and maker.op_type == "MatMul" and constant is not None:
                    if not self.only_read_by(a, node):
                        return f"{role}'s MatMul is also read before its bias Add"
                    bias, nodes, node = constant, [node], maker
                    break
        if node is None or node.op_type != "MatMul":
            what = node.qualified_op if node is not None else "a graph input"
            return f"{role} is not a MatMul of a constant weight (+ a constant bias) but {what}"
        weight = constant_value(self.graph, node.inputs[1])
        if weight is None or weight.ndim != 2:
            return f"{role}'s MatMul weight {node.inputs[1]!r} is not a constant 2-D matrix"
        if bias is not None:
            out_rank = self.graph.info(value).rank
            if bias.size != weight.shape[1] or bias.ndim > out_rank or bias.shape[-1] != weight.shape[1]:
                return f"{role}'s bias of shape {list(bias.shape)} is not one value per output column"
            bias = bias.reshape(-1)
        return Projection(value, node.inputs[0], tuple([node] + nodes), weight, bias)

    def split(self, values: list[str]):
        """The Split node whose outputs are Q, K and V in that order, over the last axis; or ``None``."""
        split = self.producers.get(values[0])
        if split is None or split.op_type != "Split" or list(split.outputs) != values:
            return None
        rank = self.graph.info(split.inputs[0]).rank
        return split if int(split.attrs.get("axis") or 0) % rank == rank - 1 else None


#: The permute of timm's ``qkv.reshape(B, N, 3, H, D)``: Q, K, V first, then ``[B, H, N, D]``.
_UNBOUND_PERM = [2, 0, 3, 1, 4]


class Unbound:
    """Q, K and V as entries 0, 1, 2 along axis 0 of ``Transpose(Reshape(p, [B, S, 3, H, D]),
    [2, 0, 3, 1, 4])``: :meth:`find` gives ``(p, H, H * D, the nodes between)``, or ``None``."""

    def __init__(self, graph, reader: ProjectionReader):
        self.graph, self.reader = graph, reader

    def find(self, values: list[str]):
        taken = [self._taken(value) for value in values]
        if any(t is None for t in taken):
            return None
        sources = {t[0] for t in taken}
        if len(sources) != 1 or [t[1] for t in taken] != [0, 1, 2]:
            return None
        transpose = self.reader.producers.get(sources.pop())
        if transpose is None or transpose.op_type != "Transpose" or perm_of(transpose) != _UNBOUND_PERM:
            return None
        reshape = self.reader.producers.get(transpose.inputs[0])
        if reshape is None or reshape.op_type != "Reshape":
            return None
        packed, split, dims = reshape.inputs[0], reshape.outputs[0], self.reader.dims
        info = self.graph.info(packed)
        if info is None or info.rank != 3 or self.graph.info(split).rank != 5:
            return None
        three, heads, size = (dims.fixed(split, axis) for axis in (2, 3, 4))
        if three != 3 or not isinstance(heads, int) or not isinstance(size, int) or info.shape[2] != 3 * heads * size:
            return None
        if not (dims.equal(split, 0, packed, 0) and dims.equal(split, 1, packed, 1)):
            return None
        between = [node for t in taken for node in t[2]] + [transpose, reshape]
        return packed, heads, heads * size, between

    def _taken(self, value: str):
        """``(source, index, nodes)`` where ``value`` is entry ``index`` of ``source`` along axis 0."""
        graph, producers = self.graph, self.reader.producers
        node = producers.get(value)
        if node is None:
            return None
        if node.op_type == "Gather" and int(node.attrs.get("axis") or 0) == 0:
            index = constant_value(graph, node.inputs[1])
            if index is not None and index.ndim == 0:
                return node.inputs[0], int(index), [node]
            return None
        if node.op_type != "Squeeze" or ints_of(graph, node, "axes") != [0]:
            return None
        piece = producers.get(node.inputs[0])
        if piece is not None and piece.op_type == "Split" and int(piece.attrs.get("axis") or 0) == 0 \
                and len(piece.outputs) == 3 and all(graph.info(o) is not None and graph.info(o).shape[0] == 1
                                                    for o in piece.outputs):
            return piece.inputs[0], list(piece.outputs).index(node.inputs[0]), [node, piece]
        if piece is not None and piece.op_type == "Slice":
            bounds = [constant_value(graph, name) if name else None for name in piece.inputs[1:5]]
            if len(bounds) >= 3 and all(b is not None for b in bounds[:3]) and bounds[2].reshape(-1).tolist() == [0] \
                    and (len(bounds) < 4 or bounds[3] is None or bounds[3].reshape(-1).tolist() == [1]):
                start, end = int(bounds[0].reshape(-1)[0]), int(bounds[1].reshape(-1)[0])
                if end == start + 1:
                    return piece.inputs[0], start, [node, piece]
        return None


def _read_unbound(graph, node, reader: ProjectionReader) -> bool:
    """The attention reads timm's packed projection in place (see the module doc), if Q, K
    and V are its entries; ``False`` where they are not."""
    layout = parse_layout(node.attrs.get("layout"))
    if layout[:3] != ("bhsd", "bhsd", "bhsd"):
        return False
    found = Unbound(graph, reader).find(list(node.inputs[:3]))
    if found is None:
        return False
    packed, heads, width, between = found
    attrs = dict(node.attrs, num_heads=heads, kv_num_heads=heads, packed=[width] * 3,
                 layout=",".join(("bsh", "bsh", "bsh", layout[3])))
    replace_node(graph, node, node.replace(inputs=(packed,) * 3 + tuple(node.inputs[3:]), attrs=attrs))
    remove_unread(graph, between)
    return True


def _widths(graph, values) -> tuple[int, ...] | None:
    widths = tuple(graph.info(value).shape[-1] for value in values)
    return widths if all(isinstance(w, int) for w in widths) else None


def _packed_projection(graph, registry, node, projections: list[Projection]) -> str | None:
    """Add the packed MatMul (and bias Add) before the first projection; its output's name."""
    weights = [p.weight for p in projections]
    members = [n for p in projections for n in p.nodes]
    matmul = projections[0].nodes[0]
    origin = origin_of(members)
    packed = fresh_name(graph, f"{node.name}/qkv")
    weight = add_constant(graph, f"{matmul.inputs[1]}/qkv", np.concatenate(weights, axis=1))
    nodes = [make_node(graph, registry, "MatMul", [projections[0].x, weight], [packed], opset=matmul.opset,
                       name=fresh_name(graph, f"{node.name}/QKV"), origin=origin)]
    if any(p.bias is not None for p in projections):
        biases = [p.bias if p.bias is not None else np.zeros(p.weight.shape[1], p.weight.dtype) for p in projections]
        bias = add_constant(graph, f"{node.name}/qkv_bias", np.concatenate(biases).astype(weights[0].dtype))
        add = next((n for p in projections for n in p.nodes[1:]), None)
        unbiased, packed = packed, fresh_name(graph, f"{node.name}/qkv_biased")
        nodes.append(make_node(graph, registry, "Add", [unbiased, bias], [packed], opset=add.opset,
                               name=fresh_name(graph, f"{node.name}/QKV bias"), origin=origin))
    if any(made is None for made in nodes):
        return None  # no MatMul or Add plugin installed: nothing inserted, the constants go as dead code
    insert_nodes(graph, min(graph.nodes.index(n) for n in members), nodes)
    return packed


def _check_projections(projections: list[Projection]) -> str | None:
    x = projections[0].x
    for role, projection in zip(ROLES, projections):
        if projection.x != x:
            return f"{role} is a projection of {projection.x!r}, Q of {x!r}"
        if projection.weight.dtype != projections[0].weight.dtype or projection.weight.shape[0] != \
                projections[0].weight.shape[0]:
            return f"{role}'s weight is {projection.weight.dtype}{list(projection.weight.shape)}, " \
                   f"Q's {projections[0].weight.dtype}{list(projections[0].weight.shape)}"
    if len({id(p.nodes[0]) for p in projections}) < 3:
        return "Q, K and V are not three different projections"
    return None


def _sliced(graph, registry, projection: Projection, packed: str, start: int) -> None:
    """Make ``projection.value`` a Slice of the packed output's columns (for its other readers)."""
    end, opset = start + projection.weight.shape[1], graph.opsets.get("", 13)
    name = projection.value
    if opset >= 10:
        bounds = [add_constant(graph, f"{name}/{tag}", np.array([v], np.int64))
                  for tag, v in (("starts", start), ("ends", end), ("axes", -1))]
        node = make_node(graph, registry, "Slice", [packed] + bounds, [name], opset=opset,
                         name=fresh_name(graph, f"{name}/Slice"), origin=origin_of(projection.nodes))
    else:
        node = make_node(graph, registry, "Slice", [packed], [name], {"starts": [start], "ends": [end], "axes": [-1]},
                         opset=opset, name=fresh_name(graph, f"{name}/Slice"), origin=origin_of(projection.nodes))
    replace_node(graph, projection.nodes[-1], node)
    remove_nodes(graph, projection.nodes[:-1])
    graph.values[name].info = None  # inferred again by finish()


def _pack(graph, registry, node) -> bool:
    """Rewrite one attention node; ``False`` (and why, at INFO) where it cannot."""
    reader = ProjectionReader(graph, registry, node)
    sources = [reader.source(index) for index in range(3)]
    why = next((s for s in sources if isinstance(s, str)), None)
    if why is not None:
        return kept_apart(node, why)
    values, heads, head_splits = zip(*sources)
    if heads[1] != heads[2]:
        return kept_apart(node, f"K has {heads[1]} heads and V {heads[2]}: packed, they share kv_num_heads")
    widths = _widths(graph, values)
    split = reader.split(list(values))
    projections = []
    if split is None:
        projections = [reader.projection(index, value) for index, value in enumerate(values)]
        why = next((p for p in projections if isinstance(p, str)), None) or _check_projections(projections)
        if why is not None:
            return kept_apart(node, why)
        widths = tuple(int(p.weight.shape[1]) for p in projections)
    elif widths is None:
        return kept_apart(node, "the Split's output widths are not known")
    packed = split.inputs[0] if split is not None else _packed_projection(graph, registry, node, projections)
    if packed is None:
        return kept_apart(node, "no installed plugin provides MatMul or Add")
    attrs = dict(node.attrs, num_heads=heads[0], kv_num_heads=heads[1], packed=list(widths),
                 layout=",".join(("bsh", "bsh", "bsh", parse_layout(node.attrs.get("layout"))[3])))
    replace_node(graph, node, node.replace(inputs=(packed,) * 3 + tuple(node.inputs[3:]), attrs=attrs))
    remove_unread(graph, [n for n in head_splits if n is not None] + ([split] if split is not None else [])
                  + [n for p in projections for n in p.nodes])
    readers = graph.consumers()
    for projection, start in zip(projections, (0, widths[0], widths[0] + widths[1])):
        if projection.value in readers or projection.value in graph.outputs:
            _sliced(graph, registry, projection, packed, start)
    return True


def run(graph, registry) -> int:
    """Pack the projections of every attention node that has three of one input (see the
    module doc); return how many it packed."""
    count = 0
    for node in list(graph.nodes):
        if (node.domain, node.op_type) != (DOMAIN, OP_TYPE) or node.attrs.get("packed"):
            continue
        if _read_unbound(graph, node, ProjectionReader(graph, registry, node)) or _pack(graph, registry, node):
            count += 1
    if count:
        finish(graph, registry)
    return count
