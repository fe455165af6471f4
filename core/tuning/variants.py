"""A layer's candidates in another precision: the builder's precision step (FP32 against
FP16) and the INT8 timer (an integer form against the float layer) time a node with its
inputs retyped, beside the graph, without changing it."""

from __future__ import annotations

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.ir.graph import Graph, Value
from plugrt.ir.infer import run_infer
from plugrt.ir.tensor import TensorInfo


def retyped(opt: Graph, node, dtypes: dict, registry, op, tuner):
    """A graph where ``node`` (one of ``opt``'s, or one made beside them that reads its
    tensors) reads input ``i`` as ``dtypes[i]`` (a constant converted), its outputs
    inferred, and the node's candidate tactics there; raises when it has none."""
    scratch = Graph.__new__(Graph)
    scratch.__dict__.update(opt.__dict__)
    scratch.values = dict(opt.values)
    ins = []
    for i, name in enumerate(node.inputs):
        info = opt.info(name) if name else None
        if info is not None and i in dtypes and info.dtype != dtypes[i]:
            dtype = np.dtype(dtypes[i])
            with np.errstate(over="ignore", invalid="ignore"):  # beyond FP16's range: inf, as the kernel would see
                value = None if info.value is None else info.value.astype(dtype)
            info = TensorInfo(dtype, info.shape, value)
            scratch.values[name] = Value(name, info)
        ins.append(info)
    outs = run_infer(op, node, ins)
    for name, info in zip(node.outputs, outs):
        if name:
            scratch.values[name] = Value(name, info)
    tactics = registry.tactics(op, node, ins, [info for name, info in zip(node.outputs, outs) if name])
    if tuner is not None:
        tactics = tuner.allowed(tactics)
    if not tactics:
        raise PlugrtError(f"no tactic for inputs {', '.join(str(i.dtype) for i in ins if i is not None)}")
    return scratch, tactics
