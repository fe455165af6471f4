"""The ``io_formats`` pass (stage ``bindings``): bindings the build asks to be channels-last.

``--io-format NAME:channels_last`` (:attr:`plugrt.engine.BuilderConfig.io_formats`) binds an
``[N, C, spatial...]`` input or output as ``[N, spatial..., C]``, as TensorRT's
``--inputIOFormats``/``--outputIOFormats`` do for its HWC formats. The binding keeps its
name and takes the new shape; a Transpose inside the engine gives the rest of the model its
own layout back (an input's readers read ``Transpose(NHWC -> NCHW)`` of it, an output is
``Transpose(NCHW -> NHWC)`` of what the model computed). Where the ``channels_last`` pass
then runs the convolutions channels-last, its own Transposes meet these and cancel
(:mod:`.simplify_pairs`), so a channels-last image goes straight into the first
convolution: no layout kernel at the engine's edge.
"""

from __future__ import annotations

from plugrt import ModelError
from plugrt.passes.pattern import Graph, finish, fresh_name, insert_nodes, make_node, replace_value
from plugrt.plugin import TensorInfo

FORMAT = "channels_last"


def run(graph: Graph, registry) -> int:
    """Rewrite every binding asked for channels-last; take it out of ``graph.io_formats``."""
    done = 0
    for name, form in list(graph.io_formats.items()):
        if form != FORMAT:
            continue
        info = graph.info(name)
        if info is None or info.rank < 3:
            shape = "unknown" if info is None else list(info.shape)
            raise ModelError(f"--io-format {name}:{FORMAT}: binding {name!r} has shape {shape}; channels-last takes "
                             "an [N, C, spatial...] tensor (rank 3 or more)")
        if name in graph.inputs and name in graph.outputs:
            raise ModelError(f"--io-format {name}:{FORMAT}: {name!r} is both an input and an output of the model; "
                             "give it no format")
        rank = info.rank
        to_last, to_first = [0, *range(2, rank), 1], [0, rank - 1, *range(1, rank - 1)]
        inner = fresh_name(graph, f"{name}_channels_first")
        if name in graph.inputs:
            replace_value(graph, name, inner)  # (not an output: refused above)
            graph.values[name].info = TensorInfo(info.dtype, tuple(info.shape[p] for p in to_last))
            _transpose(graph, registry, name, inner, to_first, 0)
        else:
            producer = graph.producers()[name]
            at = graph.nodes.index(producer)
            graph.nodes[at] = producer.replace(outputs=tuple(inner if o == name else o for o in producer.outputs))
            for index, node in enumerate(graph.nodes):  # (the graph's other readers of the output)
                if name in node.inputs:
                    graph.nodes[index] = node.replace(inputs=tuple(inner if i == name else i for i in node.inputs))
            graph.values[inner] = type(graph.values[name])(inner, info)
            graph.values[name].info = None
            _transpose(graph, registry, inner, name, to_last, at + 1)
        del graph.io_formats[name]
        done += 1
    if done:
        finish(graph, registry)
    return done


def _transpose(graph: Graph, registry, source: str, target: str, perm: list[int], at: int) -> None:
    node = make_node(graph, registry, "Transpose", [source], [target], {"perm": perm},
                     opset=graph.opsets.get("", 17), name=fresh_name(graph, f"{target}/{FORMAT}"))
    if node is None:
        raise ModelError(f"--io-format: no installed plugin provides Transpose at opset {graph.opsets.get('', 17)}")
    insert_nodes(graph, at, [node])
