"""Node-level test helpers: run a node's CUDA tactics and compare with its reference.

Plugin authors (built-in and third party) use :func:`check_node` in their tests::

    from plugrt.testing import check_node
    check_node("Relu", {"x": x})                          # every tactic vs the reference
    check_node("Reshape", {"x": x, "shape": s}, constants={"shape"})

Each tactic the plugin offers for the node runs on the device (the GPU, or Numba's CUDA
simulator without one) on the given inputs, and every output is compared with the
plugin's NumPy ``reference``. Inputs named in ``constants`` become initializers, so their
values are known when tactics are made (as weights and shape tensors are in real models).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
from onnx import helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype

from plugrt.errors import PlugrtError, UnsupportedError
from plugrt.ir.graph import Graph, Node
from plugrt.ir.specialize import concretize
from plugrt.launcher import PreparedLaunch
from plugrt.onnx.importer import import_model
from plugrt.tactic import uses_tf32


def single_node_model(op_type: str, feeds: Mapping[str, np.ndarray | None], attrs: Mapping | None = None,
                      constants: Iterable[str] = (), domain: str = "", opset: int = 17, n_outputs: int = 1):
    """An ONNX model with one node; ``None`` feeds are omitted optional inputs."""
    constants = set(constants)
    inputs, inits = [], []
    for name, array in feeds.items():
        if array is None:
            continue
        array = np.asarray(array)
        if name in constants:
            inits.append(numpy_helper.from_array(array, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, np_dtype_to_tensor_dtype(array.dtype), array.shape))
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in feeds.items()], outputs,
                            name=f"test_{op_type.lower()}", domain=domain, **dict(attrs or {}))
    graph = helper.make_graph([node], "test", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=inits)
    opsets = [helper.make_opsetid("", opset if not domain else 17)]
    if domain:
        opsets.append(helper.make_opsetid(domain, opset))
    return helper.make_model(graph, opset_imports=opsets)


def node_tactics(graph: Graph, registry, node: Node | None = None) -> list:
    """The tactics the node's plugin offers at the graph's (static) shapes, and those other
    plugins contribute (see :meth:`plugrt.registry.Registry.tactics`)."""
    node = node or graph.nodes[0]
    ins = [graph.info(n) if n else None for n in node.inputs]
    outs = [graph.info(n) for n in node.outputs if n]  # (the present ones, as the builder gives them)
    return registry.tactics(registry.op(node), node, ins, outs)


def run_tactic(graph: Graph, tactic, feeds: Mapping[str, np.ndarray], node: Node | None = None) -> list[np.ndarray]:
    """Run one tactic of a node on the device and return its outputs as NumPy arrays."""
    from numba import cuda

    node = node or graph.nodes[0]
    env = dict(graph.initializers())
    env.update(feeds)
    ins = []
    for name in node.inputs:
        if not name:
            ins.append(None)
            continue
        value = env[name] if name in env else graph.info(name).value
        ins.append(cuda.to_device(np.array(value, order="C")))  # a copy: canonical strides, as numba's reshape needs
    outs = []
    for name in node.outputs:
        info = graph.info(name)
        outs.append(cuda.device_array(tuple(int(d) for d in info.shape), dtype=info.dtype))
    workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
    bounds = graph.data_dependent.get(node.name)
    reported = cuda.to_device(np.full(sum(map(len, bounds)), -1, np.int64)) if bounds else None
    for launch in tactic.launches(ins, outs + ([reported] if bounds else []), workspace):
        PreparedLaunch(launch)(0)  # the engine's own launch path (raw launches on a GPU)
    cuda.synchronize()
    results = [o.copy_to_host() for o in outs]
    if bounds:  # a data-dependent node: each output cut to the shape its tactic reported
        shapes, at = [], reported.copy_to_host().tolist()
        for bound in bounds:
            shapes.append(tuple(at[:len(bound)]))
            at = at[len(bound):]
        assert all(0 <= d <= b for shape, bound in zip(shapes, bounds) for d, b in zip(shape, bound)), \
            f"{node.describe()}: tactic {tactic.name!r} reported shapes {shapes} outside the bounds {bounds}"
        results = [r.reshape(-1)[:int(np.prod(shape))].reshape(shape) for r, shape in zip(results, shapes)]
    return results


#: TF32 tactics' (``Tactic.math == "tf32"``) allowed error, relative to the reference's largest magnitude.
TF32_TOLERANCE = 5e-3


def check_node(op_type: str, feeds: Mapping[str, np.ndarray | None], attrs: Mapping | None = None, *,
               constants: Iterable[str] = (), domain: str = "", opset: int = 17, n_outputs: int = 1,
               rtol: float = 1e-5, atol: float = 1e-6, registry=None, tactics: Sequence[str] | None = None) -> list:
    """Run every tactic of a one-node model and compare each output with the reference.

    :returns: the reference outputs.
    :raises AssertionError: naming the tactic and output that differ.
    :raises UnsupportedError: when the plugin offers no tactic for the node.
    """
    from plugrt.reference import ReferenceExecutor
    from plugrt.registry import default_registry

    registry = registry or default_registry()
    constants = set(constants)
    model = single_node_model(op_type, feeds, attrs, constants, domain, opset, n_outputs)
    graph = import_model(model, registry=registry)
    runtime_feeds = {k: np.asarray(v) for k, v in feeds.items() if v is not None and k not in constants}
    expected = ReferenceExecutor(graph, registry).run(runtime_feeds)
    # (at the feeds' shapes, data-dependent outputs sized for their bounds)
    graph = concretize(graph, {name: graph.info(name).shape for name in graph.inputs}, registry)
    found = node_tactics(graph, registry)
    if tactics is not None:
        found = [t for t in found if t.name in tactics]
    if not found:
        raise UnsupportedError(f"{graph.nodes[0].describe()}: the plugin offers no CUDA tactic")
    for tactic in found:
        got = run_tactic(graph, tactic, runtime_feeds)
        for index, (name, want) in enumerate(zip(graph.outputs, [expected[o] for o in graph.outputs])):
            out = got[index]
            label = f"{op_type} tactic {tactic.name!r} output {index}"
            assert out.dtype == want.dtype, f"{label}: dtype {out.dtype}, reference {want.dtype}"
            assert out.shape == want.shape, f"{label}: shape {out.shape}, reference {want.shape}"
            if uses_tf32(tactic):  # tensor cores: TF32's error, relative to max |want|
                scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-6)
                err = float(np.max(np.abs(out.astype(np.float64) - want), initial=0.0))
                assert err <= TF32_TOLERANCE * scale, f"{label}: max error {err:.3g} > {TF32_TOLERANCE} * {scale:.3g}"
            elif want.dtype.kind in "fc":
                np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                           err_msg=label, equal_nan=True)
            else:
                np.testing.assert_array_equal(out, want, err_msg=label)
    return [expected[o] for o in graph.outputs]


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh random inputs for every graph input (static shapes): normal floats, small
    integers, random booleans."""
    from plugrt.bindings import random_input

    rng = np.random.default_rng(seed)
    return {name: random_input(rng, graph.info(name).dtype, tuple(int(d) for d in graph.info(name).shape))
            for name in graph.inputs}


def check_pass(model, run, *, registry=None, feeds: Mapping[str, np.ndarray] | None = None, rtol: float = 1e-5,
               atol: float = 1e-6, seed: int = 0) -> tuple[Graph, Graph]:
    """Run one graph pass on a model and compare the reference outputs before and after.

    :param model: an ONNX model (anything :func:`import_model` reads) or a :class:`Graph`.
    :param run: the pass, ``run(graph, registry) -> int`` (a ``plugrt.passes`` module's
        ``run``, or a plugin's :class:`~plugrt.plugin.GraphPass` ``run``).
    :returns: ``(before, after)`` graphs; the caller asserts what the pass should have
        changed (node counts, op types).
    :raises AssertionError: when the outputs differ, or the rewritten graph is invalid.
    """
    from plugrt.ir.validate import validate_graph
    from plugrt.reference import ReferenceExecutor
    from plugrt.registry import default_registry

    registry = registry or default_registry()
    before = model if isinstance(model, Graph) else import_model(model, registry=registry)
    after = before.copy()
    run(after, registry)
    validate_graph(after, registry)
    assert after.inputs == before.inputs and after.outputs == before.outputs, "a pass must keep the bindings"
    feeds = dict(feeds) if feeds is not None else random_feeds(before, seed)
    want = ReferenceExecutor(before, registry).run(feeds)
    got = ReferenceExecutor(after, registry).run(feeds)
    for name in before.outputs:
        assert got[name].dtype == want[name].dtype, f"output {name!r}: dtype {got[name].dtype}, before {want[name].dtype}"
        assert got[name].shape == want[name].shape, f"output {name!r}: shape {got[name].shape}, before {want[name].shape}"
        if want[name].dtype.kind in "fc":
            np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=f"output {name!r} after the pass", equal_nan=True)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r} after the pass")
    return before, after


__all__ = ["check_node", "check_pass", "random_feeds", "node_tactics", "run_tactic", "single_node_model", "PlugrtError"]
