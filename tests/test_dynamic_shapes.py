"""Shapes a context has not seen compile nothing (issue 19, part 2): a layer runs its tuned
tactic at the profile's opt shapes and a generic one elsewhere (:mod:`plugrt.engine.generic`),
whose kernels the plan carries (:func:`plugrt.engine.plan_kernels.planned_keys`); a
transformer export with dynamic batch and sequence runs every sequence length of its
profile against onnxruntime, each shape's launches among the plan's."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnxruntime
import pytest

from plugrt.cli import main
from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile, generic, plan_kernels
from plugrt.errors import PlugrtError

from test_profiles import build, conv_model, expected, fresh

EXPORTS = pathlib.Path(__file__).resolve().parent / "data" / "exports"


def bert_with_dynamic_sequence():
    """The tiny HF BERT export (hidden 32, two layers) with its sequence axis made dynamic
    (the exported graph computes its shapes from the input's)."""
    model = onnx.load(EXPORTS / "bert.onnx")
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    del model.graph.value_info[:]
    return model


def test_probe_shapes_are_min_max_an_odd_shape_between_and_powers_of_two():
    profile = OptimizationProfile().set_shape("x", (1, 1, 8), (2, 8, 8), (4, 16, 8))
    assert generic.probe_shapes(profile) == [{"x": (1, 1, 8)}, {"x": (4, 16, 8)}, {"x": (3, 9, 8)}]
    ranged = OptimizationProfile().set_shape("x", (3, 1), (4, 64), (7, 100))
    assert generic.probe_shapes(ranged) == [{"x": (3, 1)}, {"x": (7, 100)}, {"x": (5, 51)}, {"x": (4, 64)}]
    assert generic.probe_shapes(OptimizationProfile().set_shape("x", (2, 3), (2, 3), (2, 3))) == []
    assert generic.probe_shapes(OptimizationProfile().set_shape("x", (0, 3), (0, 3), (0, 3))) == []  # (empty)


def test_a_transformer_runs_every_sequence_length_with_the_plans_kernels(tmp_path):
    model = bert_with_dynamic_sequence()
    profile = OptimizationProfile().set_shape("input_ids", (1, 1), (1, 3), (2, 5))  # probes (1|2, 1|5|3|4)
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(profile)
    path = tmp_path / "bert.plan"
    Builder().build_engine(model, config).save(str(path))
    engine = Engine.load(str(path))
    planned = plan_kernels.planned_keys(engine)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(19)
    with engine.create_execution_context() as context:
        for batch, seq in [(1, s) for s in range(1, 6)] + [(2, 4)]:
            ids = rng.integers(0, 100, (batch, seq)).astype(np.int64)
            got = context.execute({"input_ids": ids})
            want = session.run(None, {"input_ids": ids})[0]
            np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"batch {batch}, seq {seq}")
            needed = {generic.launch_key(launch.key, launch.launch.kernel) for launch in context.current.launches}
            assert needed <= planned, f"batch {batch}, seq {seq}: {len(needed - planned)} kernel(s) not in the plan"


def test_a_layer_whose_tuned_tactic_bakes_shapes_in_runs_a_generic_one_elsewhere(monkeypatch, rng):
    """The tuned tactic of every layer is made to look shape-specialized (its signature
    names the shape): each layer with another tactic that is not gets that one as its
    generic tactic, kept in the plan and run at any shape but opt."""
    real = generic.signature

    def signature(registry, node, graph, tactic, weights=None):
        found = real(registry, node, graph, tactic, weights)
        tuned = {layer.tactic["name"] for layer in tuned_layers}
        return found + ((str(graph.info(node.outputs[0]).shape),) if tactic.name in tuned else ())

    tuned_layers = build(1, conv_model(7), optimization_level=0).layers
    monkeypatch.setattr(generic, "signature", signature)
    model = conv_model(7)
    engine = Engine.deserialize(build(1, model, optimization_level=0).serialize())
    switched = [layer for layer in engine.layers if layer.generic_tactics and layer.generic_tactics[0]]
    assert switched and all(layer.generic_for(0) != layer.tactic for layer in switched)
    assert all(layer.generic_for(0) == layer.tactic for layer in engine.layers if layer not in switched)
    names = {engine.graph.nodes[layer.node_index].name: layer for layer in engine.layers}
    with engine.create_execution_context() as context:
        for batch in (1, 2):  # opt, then another shape
            x = fresh(rng, batch)
            np.testing.assert_allclose(context.execute({"x": x})["y"], expected(model, x), 1e-4, 1e-5)
            for name, tactic in context.current.tactics.items():
                layer = names[name]
                assert tactic == (layer.tactic if batch == 1 else layer.generic_for(0))["name"]
    inspected = {layer["name"]: layer for layer in engine.inspect()["layers"]}
    assert any(entry["generic_tactics"] for entry in inspected.values())


@pytest.mark.skipif(simulated(), reason="kernels are compiled only on a GPU")
def test_on_a_gpu_a_loaded_plan_compiles_no_kernel_for_any_shape_of_its_profile(tmp_path, rng):
    from plugrt import binaries

    model = conv_model(8)
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 3, 4, 4), (4, 3, 4, 4), (9, 3, 4, 4)))
    path = tmp_path / "conv.plan"
    Builder().build_engine(model, config).save(str(path))
    binaries.clear()
    engine = Engine.load(str(path))
    with engine.create_execution_context() as context:
        for batch in (2, 3, 7, 8):  # none of them the opt shape or a probe shape
            x = fresh(rng, batch)
            np.testing.assert_allclose(context.execute({"x": x})["y"], expected(model, x), 1e-4, 1e-5)
    assert binaries.stats()["compiled"] == 0, binaries.stats()


@pytest.mark.parametrize("in_dims, perm", [(["batch", 3, 4], [1, 0, 2]), ([3, 2, "batch", 4], [0, 2, 1, 3])])
def test_a_transpose_moving_the_batch_axis_has_a_generic_tactic(in_dims, perm, rng, caplog):
    """A Transpose moving a dynamic batch axis inward (a sequence-first RNN's glue: [B, T, C]
    to [T, B, C]; its [T, 2, B, H] output to [T, B, 2, H]) coalesces to a lower rank, or to a
    plain copy, at batch 1: the strided copy of any rank serves every batch of the profile,
    so no shape compiles a kernel at run time, and each batch matches onnxruntime."""
    from onnx import TensorProto, helper

    out_dims = [in_dims[p] for p in perm]
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=perm, name="swap_batch")], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    shape = lambda batch: [batch if d == "batch" else d for d in in_dims]  # noqa: E731
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", shape(1), shape(2), shape(3)))
    with caplog.at_level("WARNING", logger="plugrt.builder"):
        engine = Builder().build_engine(model, config)
    assert "no tactic that runs the same kernels" not in caplog.text
    (layer,) = engine.layers
    assert layer.generic_for(0)["name"] == "strided_any_rank", layer.generic_for(0)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with engine.create_execution_context() as context:
        for batch in (1, 3):
            x = rng.standard_normal(shape(batch)).astype(np.float32)
            np.testing.assert_allclose(context.execute({"x": x})["y"], session.run(None, {"x": x})[0], 1e-4, 1e-5)


@pytest.mark.parametrize("op", ["Slice", "Expand"])
def test_a_slice_or_expand_over_a_dynamic_batch_has_a_generic_tactic(op, rng, caplog):
    """ViT's class-token drop (``x[:, 1:]``) and an Expand of [B, 1, C] over tokens coalesce
    to another rank, or a plain copy, at batch 1: the strided copy of any rank serves the
    profile's every batch, and each matches onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    if op == "Slice":
        node = helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"], name="drop_cls")
        inits, in_dims, out_dims = [ints("starts", [1]), ints("ends", [4]), ints("axes", [1])], [4, 3], [3, 3]
    else:
        node = helper.make_node("Expand", ["x", "target"], ["y"], name="over_tokens")
        inits, in_dims, out_dims = [ints("target", [1, 4, 3])], [1, 3], [4, 3]
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *in_dims])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", *out_dims])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, *in_dims), (2, *in_dims), (3, *in_dims)))
    with caplog.at_level("WARNING", logger="plugrt.builder"):
        engine = Builder().build_engine(model, config)
    assert "no tactic that runs the same kernels" not in caplog.text
    assert engine.layers[0].generic_for(0)["name"] == "strided_any_rank", engine.layers[0].generic_for(0)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with engine.create_execution_context() as context:
        for batch in (1, 3):
            x = rng.standard_normal((batch, *in_dims)).astype(np.float32)
            np.testing.assert_allclose(context.execute({"x": x})["y"], session.run(None, {"x": x})[0], 1e-4, 1e-5)


@pytest.mark.skipif(simulated(), reason="the simulator's arena views are NumPy slices")
def test_an_arena_view_is_the_slice_viewed_and_reshaped_on_a_gpu(rng):
    """A new shape's tensors are views of the arena made in one step
    (:func:`plugrt.engine.specialization.arena_view`): the same memory, shape, strides and
    dtype as slicing, ``view`` and ``reshape``, holding what is written through either."""
    from numba import cuda

    from plugrt.engine.specialization import arena_view

    arena = cuda.device_array(1 << 16, np.uint8)
    for offset, dtype, shape in ((0, np.float32, (3, 5, 7)), (256, np.float16, (1, 9)), (1024, np.int64, (4,)),
                                 (4096, np.float32, (2, 1, 3, 1))):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        made = arena_view(arena, offset, nbytes, dtype, shape)
        sliced = arena[offset:offset + nbytes].view(dtype).reshape(shape)
        assert (made.shape, made.strides, made.dtype) == (sliced.shape, sliced.strides, sliced.dtype)
        assert made.__cuda_array_interface__["data"][0] == sliced.__cuda_array_interface__["data"][0]
        values = rng.standard_normal(shape).astype(dtype) if dtype != np.int64 else rng.integers(-9, 9, shape)
        made.copy_to_device(values)
        np.testing.assert_array_equal(sliced.copy_to_host(), values)


def test_specialized_shapes_run_the_tactics_tuned_at_them(rng, tmp_path):
    """``--specialize-shapes``: a measure under which the tactic sorting first is fastest
    at batch 1 (opt) and the one sorting last elsewhere: at batch 4, a specialized shape,
    the layers run what was tuned at 4; at batch 3 their generic tactics; the plan keeps
    both, ``inspect`` shows them, and the outputs are onnxruntime's."""
    def measure(run):
        batch = run.shapes[run.node.outputs[0]][0]
        order = int.from_bytes(run.tactic.name.encode()[:6].ljust(6, b"\0"), "big") / 2.0 ** 48
        return 1.0 + (order if batch == 1 else 1.0 - order)

    model = conv_model(9)
    config = BuilderConfig(progress=False, optimization_level=5, tf32=False,  # (FP32 tolerances below)
                           specialize_shapes=[{"x": (4, 3, 4, 4)}])
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 3, 4, 4), (1, 3, 4, 4), (6, 3, 4, 4)))
    engine = Engine.deserialize(Builder(measure=measure).build_engine(model, config).serialize())
    assert engine.specialized == [{"profile": 0, "shapes": {"x": [4, 3, 4, 4]}}]
    varied = [layer for layer in engine.layers if layer.specialized_tactics
              and layer.specialized_tactics[0]["name"] != layer.tactic["name"]]
    assert varied
    names = {engine.graph.nodes[layer.node_index].name: layer for layer in engine.layers}
    with engine.create_execution_context() as context:
        for batch in (4, 3):
            x = fresh(rng, batch)
            np.testing.assert_allclose(context.execute({"x": x})["y"], expected(model, x), 1e-4, 1e-5)
            for name, tactic in context.current.tactics.items():
                layer = names[name]
                want = layer.specialized_tactics[0] if batch == 4 else layer.generic_for(0)
                assert tactic == want["name"], (batch, name)
    inspected = engine.inspect()
    assert inspected["specialized"] == engine.specialized
    assert any(entry["specialized_tactics"] for entry in inspected["layers"])
    with pytest.raises(PlugrtError, match=r"specialized shapes 0 \(x:\[9, 3, 4, 4\]\): they lie in no optimization"):
        Builder().build_engine(model, BuilderConfig(progress=False, specialize_shapes=[{"x": (9, 3, 4, 4)}],
                                                    profiles=config.profiles))


def test_the_cli_specializes_shapes(tmp_path, capsys):
    model, plan = tmp_path / "m.onnx", tmp_path / "m.plan"
    onnx.save(conv_model(10), model)
    flags = ["--min-shapes", "x:1x3x4x4", "--max-shapes", "x:6x3x4x4", "--specialize-shapes", "x:4x3x4x4",
             "--specialize-shapes", "x:6x3x4x4"]
    assert main(["build", str(model), "-o", str(plan), "--no-progress", *flags]) == 0
    engine = Engine.load(str(plan))
    assert [entry["shapes"]["x"] for entry in engine.specialized] == [[4, 3, 4, 4], [6, 3, 4, 4]]
    capsys.readouterr()
    assert main(["inspect", str(plan)]) == 0
    assert "also runs at {'x': [4, 3, 4, 4]}: " in capsys.readouterr().out
    assert all(len(layer.specialized_tactics) == 2 for layer in engine.layers if layer.alias is None)
    assert main(["build", str(model), "-o", str(tmp_path / "bad.plan"), "--no-progress", *flags[:4],
                 "--specialize-shapes", "x:7x3x4x4"]) != 0
    assert "lie in no optimization profile" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["bert", "conv"])
def test_asking_for_a_tactic_by_identity_offers_it_as_every_tactic_list_does(which):
    """A new shape asks each layer's supplier for the recorded tactic alone (``wanted``):
    for every layer of a transformer and a CNN and every tactic offered at a shape the
    profile did not tune for, the answer holds a tactic of that identity (name, parameters,
    supplier), and no more than the full list (fewer from the plugins taking the hint)."""
    from plugrt.ir.specialize import concretize

    if which == "bert":
        profile = OptimizationProfile().set_shape("input_ids", (1, 1), (1, 3), (1, 6))
        config = BuilderConfig(progress=False, tf32=False)
        config.add_optimization_profile(profile)
        engine = Builder().build_engine(bert_with_dynamic_sequence(), config)
        shapes = {"input_ids": (1, 5)}
    else:
        engine = build(1, conv_model(3))
        shapes = {"x": (3, 3, 4, 4)}
    graph = concretize(engine.graph, shapes, engine.registry)
    checked, offered, answered = 0, 0, 0
    for layer in engine.layers:
        node = graph.nodes[layer.node_index]
        if layer.alias is not None or all(graph.info(n).value is not None for n in node.outputs if n):
            continue
        op = engine.registry.op(node)
        ins = [graph.info(n) if n else None for n in node.inputs]
        outs = [graph.info(n) for n in node.outputs if n]
        full = engine.registry.tactics(op, node, ins, outs)
        for tactic in full:
            asked = engine.registry.tactics(op, node, ins, outs, wanted=tactic.identity())
            same = [t for t in asked if t.identity() == tactic.identity()]
            assert same, f"{node.name}: {tactic.identity()} not offered when asked for"
            assert len(asked) <= len(full)
            offered, answered, checked = offered + len(full), answered + len(asked), checked + 1
    assert checked >= 10 and (answered < offered or which == "conv"), (checked, answered, offered)


def test_a_shape_one_context_prepared_is_ready_for_the_engines_other_contexts(monkeypatch, rng):
    """Shape inference and each layer's tactic depend on the engine and the shapes only:
    a pool's second context meeting a shape the first one prepared finds no tactic and
    infers nothing again, makes its own launches (into its own buffers), and both give
    onnxruntime's outputs; an engine keeps :data:`shared_shapes.KEPT` shapes."""
    from plugrt.engine import shared_shapes, specialization

    model = bert_with_dynamic_sequence()
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("input_ids", (1, 1), (1, 3), (2, 6)))
    engine = Builder().build_engine(model, config)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    found, inferred = [], []
    real_find, real_concretize = specialization.find_tactic, specialization.concretize
    monkeypatch.setattr(specialization, "find_tactic", lambda *a: found.append(a[1].name) or real_find(*a))
    monkeypatch.setattr(specialization, "concretize", lambda *a: inferred.append(1) or real_concretize(*a))
    ids = rng.integers(0, 100, (1, 5)).astype(np.int64)
    want = session.run(None, {"input_ids": ids})[0]
    first = engine.create_execution_context()  # (it prepares the opt shapes)
    assert found and inferred == [1]
    found.clear(), inferred.clear()
    second = engine.create_execution_context()
    assert not found and not inferred
    np.testing.assert_allclose(next(iter(first.execute({"input_ids": ids}).values())), want, rtol=1e-4, atol=1e-5)
    assert found and inferred == [1]
    found.clear()
    np.testing.assert_allclose(next(iter(second.execute({"input_ids": ids}).values())), want, rtol=1e-4, atol=1e-5)
    assert not found and inferred == [1]
    assert second.current is not first.current and second.current.graph is first.current.graph
    assert {id(launch) for launch in second.current.launches}.isdisjoint(id(launch) for launch in first.current.launches)
    monkeypatch.setattr(shared_shapes, "KEPT", 2)
    for seq in (1, 2, 4):
        first.specialize({"input_ids": (1, seq)})
    assert len(shared_shapes._BY_ENGINE[engine]) == 2
