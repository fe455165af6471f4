"""The ``channels_last`` pass: convolutions run channels-last (NHWC) where they have a
tensor-core kernel, and the layout changes between them cancel (TensorRT's format
selection, done as ONNX Runtime's layout transformer does it: with Transposes).

1. Each Conv that can (:func:`plugrt_builtin_ops.conv.nhwc_ops.channels_last_form`: 2-D,
   one group or depthwise, a constant weight) becomes ``Transpose(NCHW -> NHWC) ->
   plugrt.conv::ConvNHWC -> Transpose(NHWC -> NCHW)``, its weight stored ``[M, kh, kw,
   C]``; channels not in whole 16-byte chunks (8 FP16 values; 16 in an INT8 build, whose
   convolutions read int8: an image's 3) are padded with zeros by a Pad after the
   Transpose, the weight with them. One Transpose (and Pad) per tensor serves every Conv
   reading it.
2. The Transposes back to NCHW move down the graph until they meet their inverse:
   - a Transpose of a Transpose becomes one Transpose of the composed permutation, or
     none when that is the identity;
   - a pointwise node (the plugins' ``POINTWISE`` group) whose every input is a constant,
     a Transpose of one permutation, or a tensor that already has a Transpose the other
     way (a residual add's shortcut) reads the Transposes' inputs (constants permuted to
     match; the shortcut's Transpose) and is followed by one Transpose; done where at
     least one of those Transposes has no other reader, so the count never grows;
   - a Concat of such Transposes concatenates their inputs along the permuted axis;
   - a pool reading a Transpose to channels-first becomes its channels-last form
     (:func:`plugrt_builtin_ops.pooling.nhwc_ops.channels_last_form`) followed by it.
3. The family's ``simplify_pairs`` then merges what is left with its neighbours (a
   Transpose of ``[N, 1, 1, C]`` then Flatten is one Reshape).

Graph inputs and outputs keep the model's layout: a Transpose stays at each end. Runs
where channels-last kernels exist (a Hopper GPU; the simulator) on graphs with at least
:data:`MIN_CONVS` convertible Convs; ``--disable-pass channels_last`` keeps every layer in
the model's layout. In an INT8 build it runs before calibration and the ``quantize``
passes, which then quantize the channels-last convolutions
(``plugrt.quant::ConvIntegerNHWC``, on ``wgmma``'s s8 tensor cores).
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import (Graph, Node, add_constant, finish, fresh_name, insert_nodes, make_node, remove_nodes,
                                   replace_value)
from plugrt.plugin import POINTWISE
from plugrt_builtin_ops.common.layout import transpose_perm
from plugrt_builtin_ops.conv import nhwc_ops as conv_nhwc
from plugrt_builtin_ops.matmul.wgmma import hopper
from plugrt_builtin_ops.pooling import nhwc_ops as pool_nhwc

from . import simplify_pairs

#: NCHW -> NHWC, for 4-D tensors.
TO_LAST = [0, 2, 3, 1]
#: The first opset whose Pad takes its pads as an input.
PAD_OPSET = 11
#: Convertible Convs a graph needs for the pass to run: a network of them, whose layout
#: changes amortize; a lone conv or two would pay more in Transposes than they gain.
MIN_CONVS = 4


def to_first(rank: int) -> list[int]:
    """The permutation taking ``[N, spatial..., C]`` to ``[N, C, spatial...]``."""
    return [0, rank - 1, *range(1, rank - 1)]


def run(graph: Graph, registry) -> int:
    """Convert, then sink and cancel; the number of rewrites. An INT8 build
    (``graph.int8``) pads channels to whole int8 chunks instead of FP16's."""
    multiple = conv_nhwc.CHANNEL_MULTIPLE if graph.int8 is None else conv_nhwc.INT8_CHANNEL_MULTIPLE
    if not hopper() or sum(conv_nhwc.channels_last_form(n, graph, multiple) is not None
                           for n in graph.nodes) < MIN_CONVS:
        return 0
    rewrites = _convert_convs(graph, registry, multiple)
    if not rewrites:
        return 0
    finish(graph, registry)
    while _sink_one(graph, registry):
        rewrites += 1
        finish(graph, registry)
    return rewrites + simplify_pairs.run(graph, registry)


# --------------------------------------------------------------------------- step 1


def _convert_convs(graph: Graph, registry, multiple: int) -> int:
    made: dict[tuple[str, int], str] = {}  # (NCHW tensor, channels padded) -> its NHWC form
    converted = 0
    for node in list(graph.nodes):
        form = conv_nhwc.channels_last_form(node, graph, multiple)
        if form is None or (form["pad_channels"] and graph.opsets.get("", 17) < PAD_OPSET):
            continue
        blocked = conv_nhwc.space_to_depth_form(node, graph, form, multiple)
        if blocked is not None:
            form = blocked
        x = _channels_last_input(graph, registry, node, form["pad_channels"], made, blocked)
        if x is None:
            continue
        weight = add_constant(graph, f"{node.inputs[1]}_nhwc", form["weight"])
        y = fresh_name(graph, f"{node.outputs[0]}_nhwc")
        conv = make_node(graph, registry, "ConvNHWC", [x, weight, *node.inputs[2:]], [y], form["attrs"],
                         opset=1, domain=conv_nhwc.DOMAIN, name=node.name, origin=node.origin)
        back = _transpose(graph, registry, y, node.outputs[0], to_first(4), f"{node.name}/to_nchw")
        if conv is None or back is None:
            continue
        graph.opsets.setdefault(conv_nhwc.DOMAIN, 1)
        at, info = graph.nodes.index(node), graph.info(node.outputs[0])
        remove_nodes(graph, [node])
        insert_nodes(graph, at, [conv, back])
        graph.values[node.outputs[0]].info = info  # (the Conv reading it next is converted in this sweep too)
        converted += 1
    return converted


def _channels_last_input(graph: Graph, registry, node: Node, pad: int, made: dict,
                         blocked: dict | None = None) -> str | None:
    """``node``'s input NHWC (one Transpose per tensor, shared), its channels padded with
    ``pad`` zeros (one Pad, shared); with ``blocked``
    (:func:`plugrt_builtin_ops.conv.nhwc_ops.space_to_depth_form`) its blocks made channels
    first (:func:`_blocks`), the channels padded before by ``blocked["pre_pad"]``."""
    x = node.inputs[0]
    if (x, 0) not in made:
        made[x, 0] = fresh_name(graph, f"{x}_nhwc")
        insert_nodes(graph, graph.nodes.index(node), [_transpose(graph, registry, x, made[x, 0], TO_LAST,
                                                                 f"{node.name}/to_nhwc")])
    source, key = made[x, 0], (x,)
    if blocked is not None:
        pre = blocked["pre_pad"]
        if pre:
            source = _padded_channels(graph, registry, node, source, pre, made, (x, "pre", pre))
        key = (x, pre, *blocked["fold"])
        if source is not None and key not in made:
            made[key] = _blocks(graph, registry, node, source, blocked)
        source = made.get(key)
    if source is None or not pad:
        return source
    return _padded_channels(graph, registry, node, source, pad, made, key + ("pad", pad))


def _padded_channels(graph: Graph, registry, node: Node, source: str, pad: int, made: dict, key) -> str | None:
    """``source`` NHWC with ``pad`` zero channels after its last (one Pad per ``key``, shared)."""
    if key not in made:
        pads = add_constant(graph, f"{source}_channel_pads", np.array([0, 0, 0, 0, 0, 0, 0, pad], np.int64))
        padded = fresh_name(graph, f"{source}_padded")
        node_pad = _pad(graph, registry, source, pads, padded, f"{node.name}/pad_channels")
        if node_pad is None:
            return None
        insert_nodes(graph, graph.nodes.index(node), [node_pad])
        made[key] = padded
    return made[key]


def _blocks(graph: Graph, registry, node: Node, x: str, blocked: dict) -> str | None:
    """NHWC ``x`` ``[N, H, W, C]`` as ``[N, H/fh, W/fw, fh * fw * C]`` (channel ``(rh * fw +
    rw) * C + c``; ``blocked["fold"]``: ``[fh, fw]``): zero-padded to whole blocks where
    needed, then, with ``fh`` 1, one Reshape (the pixels of a block are contiguous: no
    copy); else Reshape ``[N, H/fh, fh, W/fw, fw, C]``, Transpose to ``[N, H/fh, W/fw, fh,
    fw, C]`` and Reshape."""
    (fh, fw), (extra_h, extra_w) = blocked["fold"], blocked["spatial_pad"]
    height, width = graph.info(node.inputs[0]).shape[2:]  # (x is node's input's NHWC form)
    channels = graph.info(node.inputs[0]).shape[1] + blocked["pre_pad"]
    opset, nodes = graph.opsets.get("", 17), []
    if extra_h or extra_w:
        pads = add_constant(graph, f"{x}_block_pads", np.array([0, 0, 0, 0, 0, extra_h, extra_w, 0], np.int64))
        nodes.append(_pad(graph, registry, x, pads, fresh_name(graph, f"{x}_whole_blocks"), f"{node.name}/pad_blocks"))
        x = nodes[-1].outputs[0] if nodes[-1] is not None else x
    hb, wb = (height + extra_h) // fh, (width + extra_w) // fw
    joined = add_constant(graph, f"{x}_blocked_shape", np.array([0, hb, wb, fh * fw * channels], np.int64))
    depth = fresh_name(graph, f"{x}_depth")
    if fh == 1:
        nodes.append(make_node(graph, registry, "Reshape", [x, joined], [depth], opset=opset,
                               name=fresh_name(graph, f"{node.name}/join_blocks")))
    else:
        split = add_constant(graph, f"{x}_block_shape", np.array([0, hb, fh, wb, fw, channels], np.int64))
        names = [fresh_name(graph, f"{x}_{suffix}") for suffix in ("split", "blocked")]
        nodes += [make_node(graph, registry, "Reshape", [x, split], [names[0]], opset=opset,
                            name=fresh_name(graph, f"{node.name}/split_blocks")),
                  _transpose(graph, registry, names[0], names[1], [0, 1, 3, 2, 4, 5],
                             f"{node.name}/blocks_to_channels"),
                  make_node(graph, registry, "Reshape", [names[1], joined], [depth], opset=opset,
                            name=fresh_name(graph, f"{node.name}/join_blocks"))]
    if any(made is None for made in nodes):
        return None
    insert_nodes(graph, graph.nodes.index(node), nodes)
    return depth


def _pad(graph: Graph, registry, x: str, pads: str, target: str, name: str) -> Node | None:
    return make_node(graph, registry, "Pad", [x, pads], [target], {"mode": "constant"},
                     opset=graph.opsets.get("", 17), name=fresh_name(graph, name))


def _transpose(graph: Graph, registry, source: str, target: str, perm: list[int], name: str) -> Node | None:
    return make_node(graph, registry, "Transpose", [source], [target], {"perm": list(perm)},
                     opset=graph.opsets.get("", 17), name=fresh_name(graph, name))


# --------------------------------------------------------------------------- step 2


def _perm(graph: Graph, node: Node) -> list[int] | None:
    """A Transpose's permutation (None for any other node)."""
    if node is None or node.domain or node.op_type != "Transpose":
        return None
    return transpose_perm(node, graph.info(node.inputs[0]).rank)


def _sink_one(graph: Graph, registry) -> bool:
    producers = {name: node for node in graph.nodes for name in node.outputs if name}
    for node in graph.nodes:  # compositions first: they free Transposes for the others
        if _compose(graph, node, producers):
            return True
    readers = graph.consumers()
    for node in graph.nodes:
        for rule in (_through_pointwise, _through_concat, _into_pool):
            if rule(graph, registry, node, producers, readers):
                return True
    return False


def _compose(graph: Graph, node: Node, producers: dict) -> bool:
    outer = _perm(graph, node)
    source = producers.get(node.inputs[0]) if outer is not None else None
    inner = _perm(graph, source)
    if inner is None:
        return False
    composed = [inner[axis] for axis in outer]
    if composed == list(range(len(composed))):
        if not replace_value(graph, node.outputs[0], source.inputs[0]):
            return False
        remove_nodes(graph, [node])
        return True
    graph.nodes[graph.nodes.index(node)] = node.replace(inputs=(source.inputs[0],), attrs={**node.attrs, "perm": composed})
    return True


def _through_pointwise(graph: Graph, registry, node: Node, producers: dict, readers: dict) -> bool:
    outs = [name for name in node.outputs if name]
    if len(outs) != 1 or POINTWISE not in registry.op(node).groups:
        return False
    found = _untransposed(graph, node, producers, readers, graph.info(outs[0]).rank)
    if found is None:
        return False
    perm, inputs = found
    inner = fresh_name(graph, f"{outs[0]}_inner")
    _replace_with(graph, registry, node, node.replace(inputs=tuple(inputs), outputs=(inner,)), inner, outs[0], perm)
    return True


def _through_concat(graph: Graph, registry, node: Node, producers: dict, readers: dict) -> bool:
    """``Concat(T(a), T(b), axis)`` -> ``T(Concat(a, b, axis'))``: a DenseNet's or a
    U-Net's channel concatenations stay channels-last."""
    outs = [name for name in node.outputs if name]
    if node.domain or node.op_type != "Concat" or len(outs) != 1:
        return False
    rank = graph.info(outs[0]).rank
    found = _untransposed(graph, node, producers, readers, rank, constants=False)
    if found is None:
        return False
    perm, inputs = found
    inner = fresh_name(graph, f"{outs[0]}_inner")
    axis = perm[int(node.attrs["axis"]) % rank]
    concat = node.replace(inputs=tuple(inputs), outputs=(inner,), attrs={**node.attrs, "axis": axis})
    _replace_with(graph, registry, node, concat, inner, outs[0], perm)
    return True


def _untransposed(graph: Graph, node: Node, producers: dict, readers: dict, rank: int, constants: bool = True):
    """``(perm, inputs)``: ``node``'s inputs before the Transposes of one permutation that
    make them (a tensor in the model's layout read through its existing Transpose the other
    way, constants permuted to match), or None where they are not all such, or no
    Transpose would be freed (each of those has another reader)."""
    perm, freed, inputs, plain = None, False, list(node.inputs), []
    for i, name in enumerate(node.inputs):
        info = graph.info(name) if name else None
        if info is None or info.value is not None:
            if info is not None and not constants:
                return None
            continue
        found = _perm(graph, producers.get(name))
        if found is None:
            plain.append(i)
            continue
        if len(found) != rank or (perm is not None and found != perm):
            return None
        perm = found
        freed |= all(reader is node for reader in readers.get(name, []))
    if perm is None or not freed:
        return None
    inverse = [int(p) for p in np.argsort(perm)]
    for i in plain:
        twin = next((r for r in readers.get(node.inputs[i], []) if _perm(graph, r) == inverse), None)
        if twin is None or graph.info(node.inputs[i]).rank != rank:
            return None
        inputs[i] = twin.outputs[0]
    for i, name in enumerate(node.inputs):
        info = graph.info(name) if name else None
        if info is None or i in plain:
            continue
        if info.value is None:
            inputs[i] = producers[name].inputs[0]
        elif info.rank > 0:
            full = np.asarray(info.value).reshape((1,) * (rank - info.rank) + tuple(info.value.shape))
            inputs[i] = add_constant(graph, f"{name}_permuted", np.ascontiguousarray(np.transpose(full, inverse)))
    return perm, inputs


def _into_pool(graph: Graph, registry, node: Node, producers: dict, readers: dict) -> bool:
    if not node.inputs or not node.inputs[0]:
        return False
    source = producers.get(node.inputs[0])
    perm = _perm(graph, source)
    if perm is None or perm != to_first(len(perm)) or len(readers.get(node.inputs[0], [])) != 1:
        return False
    form = pool_nhwc.channels_last_form(node, graph)
    if form is None:
        return False
    domain, op_type, attrs = form
    inner = fresh_name(graph, f"{node.outputs[0]}_nhwc")
    pool = make_node(graph, registry, op_type, [source.inputs[0]], [inner], attrs, opset=1, domain=domain,
                     name=node.name, origin=node.origin)
    if pool is None:
        return False
    graph.opsets.setdefault(domain, 1)
    _replace_with(graph, registry, node, pool, inner, node.outputs[0], to_first(len(perm)))
    return True


def _replace_with(graph: Graph, registry, node: Node, replacement: Node, inner: str, output: str, perm) -> None:
    """``node`` becomes ``replacement`` (writing ``inner``) then a Transpose to ``output``."""
    back = _transpose(graph, registry, inner, output, perm, f"{node.name}/transpose")
    at = graph.nodes.index(node)
    remove_nodes(graph, [node])
    insert_nodes(graph, at, [replacement, back])
