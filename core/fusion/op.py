"""The fused layer op: a body of inner nodes the core's fusion passes composed into one.

A ``plugrt.fused::Fused`` node carries its inner nodes in the ``body`` attribute (JSON-safe
dicts, so plan files store them). Its inputs are the values the body reads from outside,
its outputs the body values read outside. Two kinds, by the body's first node:

- a pointwise chain: every inner node is pointwise; one generated kernel computes them
  all (:func:`plugrt.fusion.codegen.chain_tactics`);
- an anchor with an epilogue: the first node is an anchor (Conv, Gemm, MatMul: any op in
  the ANCHOR group), the rest pointwise; the anchor plugin's own tactics run, given the
  epilogue composed from the rest (:func:`plugrt.fusion.codegen.epilogue`). The node's
  inputs are the anchor's inputs followed by the epilogue's.

Shape inference and the reference run the inner nodes through their own plugins, so the
fused op has no math of its own. It is registered by the core in every registry.
"""

from __future__ import annotations

import weakref
from typing import Sequence

from plugrt import API_VERSION, hookimpl
from plugrt.errors import UnsupportedError
from plugrt.fusion import codegen
from plugrt.fusion.codegen import Program, Step
from plugrt.ir.graph import Node, origin_of
from plugrt.plugin import ANCHOR, POINTWISE, REQUIRED, VARIADIC, Attr, OpPlugin

FUSED_DOMAIN = "plugrt.fused"
FUSED_OP = "Fused"


def body_entry(node: Node, registry) -> dict:
    """One inner node as JSON-safe data, with the plugin that provides it (a plan's load
    checks it is installed at that version)."""
    op = registry.op(node)
    owner = registry.owner(op)
    return {"name": node.name, "op_type": node.op_type, "domain": node.domain, "opset": node.opset,
            "inputs": list(node.inputs), "outputs": list(node.outputs), "attrs": dict(node.attrs),
            "origin": list(node.origin or (node.name,)), "plugin": owner.name,
            "distribution": owner.distribution, "version": owner.version, "op_version": op.version}


def body_nodes(node: Node) -> list[Node]:
    return [Node(e["name"], e["op_type"], e["domain"], tuple(e["inputs"]), tuple(e["outputs"]), dict(e["attrs"]),
                 int(e["opset"]), tuple(e.get("origin", ()))) for e in node.attrs["body"]]


def fused_node(name: str, members: Sequence[Node], inputs: Sequence[str], outputs: Sequence[str], registry) -> Node:
    """The node standing for ``members`` (in order: an anchor first, if any)."""
    return Node(name, FUSED_OP, FUSED_DOMAIN, tuple(inputs), tuple(outputs),
                {"body": [body_entry(m, registry) for m in members]}, 1, origin_of(members))


def is_fused(node: Node) -> bool:
    return node.domain == FUSED_DOMAIN and node.op_type == FUSED_OP


def label(node: Node) -> str:
    """``Conv+Add+Relu``: the inner op types."""
    return "+".join(entry["op_type"] for entry in node.attrs["body"])


class FusedOp(OpPlugin):
    """The op of every fused layer; see the module doc."""

    op_type = FUSED_OP
    domain = FUSED_DOMAIN
    version = "1"
    inputs = (0, VARIADIC)
    outputs = (1, VARIADIC)
    attributes = (Attr("body", "graph", REQUIRED),)

    def __init__(self, registry):
        self.registry = registry
        #: node -> (inputs, env): the body's inference at the inputs last inferred, which a
        #: specialization's ``tactics`` call reads again (the same TensorInfo objects);
        #: dropped with the node.
        self._inferred: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def infer(self, node, inputs):
        env = self._run(node, inputs, _infer)
        self._inferred[node] = (tuple(inputs), env)
        return [env[name] for name in node.outputs]

    def _infos(self, node, inputs) -> dict:
        """The body's TensorInfo of every value at ``inputs``: remembered from :meth:`infer`
        at the very same input objects, else inferred."""
        found = self._inferred.get(node)
        if found is not None and len(found[0]) == len(inputs) and all(a is b for a, b in zip(found[0], inputs)):
            return found[1]
        return self._run(node, inputs, _infer)

    def reference(self, node, inputs):
        env = self._run(node, inputs, lambda op, inner, args: op.reference(inner, args))
        return [env[name] for name in node.outputs]

    def _run(self, node, inputs, call) -> dict:
        env = {name: value for name, value in zip(node.inputs, inputs) if name}
        for inner in body_nodes(node):
            results = call(self.registry.op(inner), inner, [env[name] if name else None for name in inner.inputs])
            env.update((name, value) for name, value in zip(inner.outputs, results) if name)
        return env

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        body = body_nodes(node)
        infos = self._infos(node, inputs)
        first = self.registry.op(body[0])
        if ANCHOR in first.groups:
            anchor = body[0]
            count = len(anchor.inputs)
            program = self._program(body[1:], node.inputs[count:], inputs[count:], infos, anchor.outputs[0],
                                    node.outputs)
            out = infos[anchor.outputs[0]]
            _same_shapes(node, [out] + list(outputs))
            fused = codegen.epilogue(program, out.shape, count, label(node))
            return self.registry.tactics(first, anchor, list(inputs[:count]), [out], epilogue=fused, wanted=wanted)
        _same_shapes(node, outputs)
        program = self._program(body, node.inputs, inputs, infos, None, node.outputs)
        return codegen.chain_tactics(program, outputs, "fused_pointwise", wanted)

    def _program(self, steps: list[Node], leaf_names, leaf_infos, infos: dict, value: str | None, results) -> Program:
        """The body's pointwise nodes as a :class:`Program` over the given leaves."""
        leaf_index = {}
        for k, name in enumerate(leaf_names):
            leaf_index.setdefault(name, k)
        step_index, program_steps = {}, []
        for inner in steps:
            op = self.registry.op(inner)
            fn = op.pointwise(inner, [infos[n] if n else None for n in inner.inputs]) if POINTWISE in op.groups else None
            if fn is None:
                raise UnsupportedError(f"{inner.describe()}: plugin {type(op).__name__} gives no pointwise device "
                                       "function, so it cannot be part of a fused layer; rebuild with --no-fusion")
            args = []
            for name in inner.inputs:
                if not name:
                    continue
                if name == value:
                    args.append(("value",))
                elif name in step_index:
                    args.append(("step", step_index[name]))
                else:
                    args.append(("leaf", leaf_index[name]))
            step_index[inner.outputs[0]] = len(program_steps)
            program_steps.append(Step(fn, tuple(args)))
        return Program(tuple(leaf_infos), tuple(program_steps), tuple(step_index[name] for name in results))


def _same_shapes(node, infos) -> None:
    """A fused kernel writes one index space: the fusion pass proved the shapes equal at the
    profile's shapes; refuse (rather than compute wrongly) a shape where they differ."""
    shapes = {tuple(int(d) for d in info.shape) for info in infos}
    if len(shapes) > 1:
        raise UnsupportedError(f"{node.describe()}: the fused values have different shapes "
                               f"{sorted(shapes)} at these input shapes; rebuild with --no-fusion")


def _infer(op, inner, args):
    from plugrt.ir.infer import run_infer

    return run_infer(op, inner, args)


class FusionPlugin:
    """The core's own plugin: provides :class:`FusedOp` to the registry it is given."""

    #: Part of the core: always the core's own API.
    PLUGRT_API = (API_VERSION, API_VERSION)

    def __init__(self, registry):
        self.op = FusedOp(registry)

    @hookimpl
    def plugrt_ops(self):
        return [self.op]


def is_fusible_pointwise(graph, registry, node: Node) -> bool:
    """A pointwise node with one output whose plugin gives a device function for it."""
    op = registry.find_op(node.domain, node.op_type, node.opset)
    if op is None or POINTWISE not in op.groups or len([o for o in node.outputs if o]) != 1 or not node.outputs[0]:
        return False
    try:
        return op.pointwise(node, [graph.info(n) if n else None for n in node.inputs]) is not None
    except Exception:  # a plugin that cannot say at symbolic shapes: leave the node alone
        return False


def is_anchor(registry, node: Node) -> bool:
    op = registry.find_op(node.domain, node.op_type, node.opset)
    return op is not None and ANCHOR in op.groups and len(node.outputs) == 1
