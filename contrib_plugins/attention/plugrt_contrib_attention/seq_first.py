"""The graph pass ``read_seq_first``: ``torch.nn.MultiheadAttention``'s sequence-first
projections, taken around a fused attention so that it reads and writes batch-first.

``nn.MultiheadAttention`` (``batch_first=False`` inside, as torchvision's ViT calls it
after transposing its ``[B, S, E]`` input) exports, around the attention :mod:`.fuse`
makes::

    x' = Transpose(x, [1, 0, 2])                      [S, B, E]
    p = MatMul(x', W) [+ b]                           [S, B, 3E]   (_in_projection_packed:)
    q, k, v = Gather(Squeeze(Transpose(Unsqueeze(Reshape(p, [S, B, 3, E]), 0),
                                       [3, 1, 2, 0, 4]), 3), 0 / 1 / 2, axis 0)
    each: Reshape(Transpose(Reshape(., [S, B * H, D]), [1, 0, 2]), [B, H, S, D])
    o = attention(q, k, v)                            [B, H, S, D]
    y = Transpose(Reshape(Gemm(Reshape(Transpose(o, [2, 0, 1, 3]), [S * B, E]), Wo, bo),
                  [S, B, E]), [1, 0, 2])              [B, S, E]

so ``q[b, h, s, d] = p[s, b, h * D + d]`` (K and V at columns ``E`` and ``2E`` on): a
sequence-first packed projection. A MatMul of a constant 2-D weight acts on rows, so it
commutes with a Transpose that keeps the last axis: ``p`` is the transpose of
``MatMul(x, W) [+ b]``, which the attention reads in place as its packed ``bsh`` input
(``packed = [E, E, E]``). On the output side the Gemm between a merge of the leading
dims and its split is a MatMul on ``[S, B, E]`` rows, which commutes with the Transposes
around it the same way: the attention writes ``bsh`` ``[B, S, E]`` and ``MatMul(o, Wo^T)
[+ bo]`` makes ``y``, where epilogue fusion then takes the bias and the residual Add. No
layout kernel is left. Each side is checked op by op (perms, axes, the Gather's index, the
Reshapes' dims by :class:`.facts.Dims`) and rewritten alone; the old nodes go when nothing
else reads them. Where a side does not match, ``-v`` says why.

Not taken: a sequence-first projection not made from a batch-first input by such a
Transpose (it would need a sequence-first layout in the op), K and V of another input
(cross-attention's ``_in_projection``), ``batch_first=True`` modules (they export other ops).
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.passes.pattern import (add_constant, constant_value, finish, fresh_name, insert_nodes, make_node,
                                   origin_of, remove_nodes, replace_node)

from plugrt_contrib_attention.facts import Dims, ints_of, perm_of
from plugrt_contrib_attention.heads import remove_unread
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE
from plugrt_contrib_attention.pack import ProjectionReader
from plugrt_contrib_attention.problem import parse_layout

NAME = "read_seq_first"
log = logging.getLogger("plugrt.passes.read_seq_first")
ROLES = ("Q", "K", "V")


class _Walk:
    """Steps back from a value through named ops, collecting why a step fails."""

    def __init__(self, graph, registry):
        self.graph, self.dims, self.producers = graph, Dims(graph, registry), graph.producers()

    def rank(self, name: str) -> int:
        return self.graph.info(name).rank

    def made_by(self, name: str, op_type: str, rank_in: int, rank_out: int):
        node = self.producers.get(name)
        if node is None or node.op_type != op_type:
            return None
        info = self.graph.info(node.inputs[0])
        return node if info is not None and info.rank == rank_in and self.rank(name) == rank_out else None

    def head_split(self, name: str):
        """``(the [S, B, E] value, B*H dims checked)`` of ``Reshape(Transpose(Reshape(x, [S, B * H, D]),
        [1, 0, 2]), [B, H, S, D])``, or why not."""
        dims = self.dims
        outer = self.made_by(name, "Reshape", 3, 4)
        swap = outer and self.made_by(outer.inputs[0], "Transpose", 3, 3)
        inner = swap and self.made_by(swap.inputs[0], "Reshape", 3, 3)
        if not inner or perm_of(swap) != [1, 0, 2]:
            return "not Reshape(Transpose(Reshape(x, [S, B * H, D]), [1, 0, 2]), [B, H, S, D])"
        merged, x = inner.outputs[0], inner.inputs[0]
        if not (dims.product(name, (0, 1), merged, 1) and dims.equal(name, 0, x, 1) and dims.equal(name, 2, x, 0)
                and dims.equal(merged, 0, x, 0) and dims.equal(name, 3, merged, 2)):
            return "the head split's dims are not [S, B, E] -> [S, B * H, D] -> [B, H, S, D]"
        return x, [outer, swap, inner]

    def unpacked(self, name: str, index: int):
        """``(p [S, B, 3E], nodes)`` of ``Gather(Squeeze(Transpose(Unsqueeze(Reshape(p, [S, B, 3, E]), 0),
        [3, 1, 2, 0, 4]), 3), index, axis 0)``, or why not."""
        gather = self.made_by(name, "Gather", 4, 3)
        squeeze = gather and self.made_by(gather.inputs[0], "Squeeze", 5, 4)
        swap = squeeze and self.made_by(squeeze.inputs[0], "Transpose", 5, 5)
        unsqueeze = swap and self.made_by(swap.inputs[0], "Unsqueeze", 4, 5)
        split = unsqueeze and self.made_by(unsqueeze.inputs[0], "Reshape", 3, 4)
        lead = 0
        if swap and not unsqueeze:  # the cleanup merged the Unsqueeze into the Reshape: [S, B, 3E] -> [1, S, B, 3, E]
            split, lead = self.made_by(swap.inputs[0], "Reshape", 3, 5), 1
        if not split:
            return "not a Gather of Squeeze(Transpose(Unsqueeze(Reshape(p)))) (PyTorch's _in_projection_packed)"
        at = constant_value(self.graph, gather.inputs[1])
        if (int(gather.attrs.get("axis") or 0) != 0 or at is None or at.size != 1 or int(at.reshape(-1)[0]) != index
                or ints_of(self.graph, squeeze, "axes") not in ([3], [-2]) or perm_of(swap) != [3, 1, 2, 0, 4]
                or (unsqueeze and ints_of(self.graph, unsqueeze, "axes") != [0])):
            return f"the Gather, Squeeze, Transpose or Unsqueeze do not pick {ROLES[index]} as part {index} of 3"
        p, parts, dims = split.inputs[0], split.outputs[0], self.dims
        if not ((not lead or dims.is_size(parts, 0, 1)) and dims.equal(parts, lead, p, 0)
                and dims.equal(parts, lead + 1, p, 1) and dims.is_size(parts, lead + 2, 3)
                and dims.product(parts, (lead + 2, lead + 3), p, 2)):
            return "the Reshape is not [S, B, 3E] -> [S, B, 3, E]"
        return p, [node for node in (gather, squeeze, swap, unsqueeze, split) if node]


def _read_in(graph, registry, node) -> str | bool:
    """The input side: the attention reads ``MatMul(x, W) [+ b]`` packed; ``True`` or why not."""
    if parse_layout(node.attrs.get("layout"))[:3] != ("bhsd",) * 3 or node.attrs.get("packed"):
        return "Q, K and V are not all read as [B, H, S, D]"
    walk, found, bypassed = _Walk(graph, registry), [], []
    for index in range(3):
        split = walk.head_split(node.inputs[index])
        part = split if isinstance(split, str) else walk.unpacked(split[0], index)
        if isinstance(part, str):
            return f"{ROLES[index]}: {part}"
        found.append(part[0])
        bypassed += split[1] + part[1]
    if len(set(found)) != 1:
        return "Q, K and V are parts of different projections"
    projection = ProjectionReader(graph, registry, node).projection(0, found[0])
    if isinstance(projection, str):
        return f"the packed {projection}"
    swap = walk.made_by(projection.x, "Transpose", 3, 3)
    if swap is None or perm_of(swap) != [1, 0, 2]:
        return "the packed projection is of a sequence-first value that no Transpose [1, 0, 2] made"
    heads, width = walk.dims.fixed(node.inputs[0], 1), walk.dims.fixed(node.inputs[0], 3)
    if not isinstance(heads, int) or not isinstance(width, int):
        return "the head count or size is not fixed"
    matmul = projection.nodes[0]
    origin = origin_of(list(projection.nodes) + [swap] + bypassed)
    packed = fresh_name(graph, f"{node.name}/qkv")
    made = [make_node(graph, registry, "MatMul", [swap.inputs[0], matmul.inputs[1]], [packed], opset=matmul.opset,
                      name=fresh_name(graph, f"{node.name}/QKV"), origin=origin)]
    if projection.bias is not None:
        bias = add_constant(graph, f"{node.name}/qkv_bias", projection.bias)
        unbiased, packed = packed, fresh_name(graph, f"{node.name}/qkv_biased")
        made.append(make_node(graph, registry, "Add", [unbiased, bias], [packed], opset=projection.nodes[-1].opset,
                              name=fresh_name(graph, f"{node.name}/QKV bias"), origin=origin))
    if any(m is None for m in made):
        return "no installed plugin provides MatMul or Add"
    insert_nodes(graph, graph.nodes.index(matmul), made)
    hidden = heads * width
    layout = ",".join(("bsh",) * 3 + (parse_layout(node.attrs.get("layout"))[3],))
    attrs = dict(node.attrs, layout=layout, num_heads=heads, kv_num_heads=heads, packed=[hidden] * 3)
    replace_node(graph, node, node.replace(inputs=(packed,) * 3 + tuple(node.inputs[3:]), attrs=attrs,
                                           origin=origin_of([node] + bypassed)))
    remove_unread(graph, bypassed + list(projection.nodes) + [swap])
    return True


class _Chain:
    """The nodes after the attention's output, each the only reader of the one before."""

    def __init__(self, graph, registry, node):
        self.graph, self.readers, self.walk = graph, graph.consumers(), _Walk(graph, registry)
        self.nodes, self.value = [], node.outputs[0]

    def next(self, op_type: str, rank_out: int):
        """The value's one reader if it is an ``op_type`` making rank ``rank_out``, else ``None``
        (Shape nodes reading the value are set aside: see :meth:`shape_readers`)."""
        readers = [r for r in self.readers.get(self.value, ()) if r.op_type != "Shape"]
        if self.value in self.graph.outputs or len(readers) != 1 or readers[0].op_type != op_type:
            return None
        node = readers[0]
        if node.inputs[0] != self.value or self.graph.info(node.outputs[0]).rank != rank_out:
            return None
        self.nodes.append(node)
        self.value = node.outputs[0]
        return node

    def shape_readers(self) -> list | None:
        """The shape computations reading the chain's values (but its last), which must feed
        only the chain (the Reshapes' targets); ``None`` where one feeds anything else."""
        chain = {id(n) for n in self.nodes}
        found = [r for n in self.nodes[:-1] for r in self.readers.get(n.outputs[0], ()) if r.op_type == "Shape"]
        closure, pending = {}, list(found)
        while pending:
            node = pending.pop()
            if id(node) in closure or id(node) in chain:
                continue
            closure[id(node)] = node
            for out in node.outputs:
                if out in self.graph.outputs:
                    return None
                pending += self.readers.get(out, ())
        if any(r is self.nodes[-1] for node in closure.values() for out in node.outputs
               for r in self.readers.get(out, ())):
            return None  # the last Transpose stays the value's maker: nothing may read into it
        return list(closure.values())


def _out_projection(graph, gemm):
    """``(weight [K, N], bias [N] or None)`` of ``alpha * A @ B' + beta * C`` with constants, or why not."""
    weight = constant_value(graph, gemm.inputs[1])
    bias = constant_value(graph, gemm.inputs[2]) if len(gemm.inputs) > 2 and gemm.inputs[2] else None
    if weight is None or weight.ndim != 2 or (len(gemm.inputs) > 2 and gemm.inputs[2] and bias is None):
        return "the out-projection Gemm's weight or bias is not a constant"
    if gemm.attrs.get("transA"):
        return "the out-projection Gemm transposes its input"
    weight = (weight.T if gemm.attrs.get("transB") else weight) * np.asarray(gemm.attrs.get("alpha", 1.0), weight.dtype)
    if bias is not None:
        if bias.size not in (1, weight.shape[1]) or (bias.ndim == 2 and bias.shape[0] != 1):
            return f"the out-projection's bias of shape {list(bias.shape)} is not one value per output column"
        beta = np.asarray(gemm.attrs.get("beta", 1.0), weight.dtype)
        bias = np.broadcast_to(bias.reshape(-1) * beta, (weight.shape[1],)).astype(weight.dtype)
    return np.ascontiguousarray(weight), bias


def _write_out(graph, registry, node) -> str | bool:
    """The output side: the attention writes ``[B, S, E]`` and a MatMul on its rows replaces
    the Gemm between the Transposes; ``True`` or why not."""
    layout = list(parse_layout(node.attrs.get("layout")))
    chain = _Chain(graph, registry, node)
    found = (chain.next("Transpose", 4), chain.next("Reshape", 2), chain.next("Gemm", 2), chain.next("Reshape", 3),
             chain.next("Transpose", 3))
    if layout[3] != "bhsd" or not all(found):
        return "the output is not Transpose(Reshape(Gemm(Reshape(Transpose(o)))), each read only there"
    merge, flat, gemm, unflat, back = found
    o, dims = node.outputs[0], chain.walk.dims
    heads, out = dims.fixed(o, 1), flat.inputs[0]
    if (perm_of(merge) != [2, 0, 1, 3] or perm_of(back) != [1, 0, 2] or not isinstance(heads, int)
            or node.attrs.get("num_heads") not in (0, None, heads)):
        return "the Transposes are not [2, 0, 1, 3] after the attention and [1, 0, 2] after the projection"
    rows, projected = flat.outputs[0], gemm.outputs[0]
    if not (dims.product(out, (0, 1), rows, 0) and dims.product(out, (2, 3), rows, 1)
            and dims.equal(unflat.outputs[0], 0, out, 0) and dims.equal(unflat.outputs[0], 1, out, 1)
            and dims.equal(unflat.outputs[0], 2, projected, 1)):
        return "the Reshapes are not [S, B, H, D] -> [S * B, E] and [S * B, N] -> [S, B, N]"
    projection = _out_projection(graph, gemm)
    if isinstance(projection, str):
        return projection
    shapes = chain.shape_readers()
    if shapes is None:
        return "a shape computation on the chain is read elsewhere than by its Reshapes"
    weight, bias = projection
    origin, written = origin_of(chain.nodes), fresh_name(graph, f"{o}/bsh")
    y = back.outputs[0]
    opset, rows = graph.opsets.get("", 13), add_constant(graph, f"{gemm.inputs[1]}/rows", weight)
    unbiased = y if bias is None else fresh_name(graph, f"{gemm.name}/unbiased")
    made = [make_node(graph, registry, "MatMul", [written, rows], [unbiased], opset=opset,
                      name=fresh_name(graph, f"{gemm.name}/MatMul"), origin=origin)]
    if bias is not None:
        biases = add_constant(graph, f"{gemm.name}/bias", bias)
        made.append(make_node(graph, registry, "Add", [unbiased, biases], [y], opset=opset,
                              name=fresh_name(graph, f"{gemm.name}/Add"), origin=origin))
    if any(m is None for m in made):
        return "no installed plugin provides MatMul or Add"
    layout[3] = "bsh"
    replace_node(graph, node, node.replace(outputs=(written,) + tuple(node.outputs[1:]),
                                           attrs=dict(node.attrs, layout=",".join(layout), num_heads=heads)))
    at = graph.nodes.index(back)
    del graph.nodes[at]
    insert_nodes(graph, at, made)  # y keeps its name (and readers); its producer is new
    remove_nodes(graph, chain.nodes[:-1] + shapes)
    graph.values.pop(o, None)
    graph.values[y].info = None
    return True


def run(graph, registry) -> int:
    """Take the sequence-first projections around every attention node into it (see the
    module doc); return how many sides it rewrote."""
    count = 0
    for name in [n.name for n in graph.nodes if (n.domain, n.op_type) == (DOMAIN, OP_TYPE)]:
        for side in (_read_in, _write_out):
            node = next(n for n in graph.nodes if n.name == name)
            done = side(graph, registry, node)
            if done is True:
                count += 1
                finish(graph, registry)
            else:
                log.info("%s: %s: %s", NAME, node.describe(), done)
    return count
