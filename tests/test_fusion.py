"""Epilogue and pointwise-chain fusion: the passes on tiny graphs (reference before/after),
fused engines against onnxruntime, plan files of fused layers, and property-based random
pointwise DAGs with broadcasting."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, Engine
from plugrt.fusion.op import FUSED_DOMAIN
from plugrt.passes import fuse_epilogues, fuse_pointwise
from plugrt.testing import check_pass, random_feeds


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def fused(graph):
    return [n for n in graph.nodes if n.domain == FUSED_DOMAIN]


def onnxruntime_outputs(onnx_model, feeds):
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def conv_block(rng):
    """Conv -> Add(residual) -> Relu -> Mul(scalar): one fused layer."""
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), node("Add", ["c", "r"], ["a"]),
             node("Relu", ["a"], ["y0"]), node("Mul", ["y0", "half"], ["y"])]
    return model(nodes, [("x", [1, 3, 4, 4]), ("r", [1, 4, 4, 4])], ["y"],
                 [("w", w), ("b", b), ("half", np.array(0.5, np.float32))])


def test_conv_epilogue_takes_residual_activation_and_scale(rng, registry):
    before, after = check_pass(conv_block(rng), fuse_epilogues.run, registry=registry)
    assert len(before.nodes) == 4 and len(after.nodes) == 1
    (layer,) = fused(after)
    assert [e["op_type"] for e in layer.attrs["body"]] == ["Conv", "Add", "Relu", "Mul"]
    assert layer.inputs == ("x", "w", "b", "r", "half") and layer.outputs == ("y",)
    assert layer.origin == tuple(n.name for n in before.nodes)


def test_matmul_epilogue_with_broadcast_bias(rng, registry):
    wt = rng.standard_normal((6, 5)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    nodes = [node("MatMul", ["x", "wt"], ["m"]), node("Add", ["m", "bias"], ["a"]), node("Tanh", ["a"], ["y"])]
    onnx_model = model(nodes, [("x", [2, 3, 6])], ["y"], [("wt", wt), ("bias", bias)])
    before, after = check_pass(onnx_model, fuse_epilogues.run, registry=registry)
    assert len(after.nodes) == 1 < len(before.nodes)


def test_no_epilogue_when_the_anchor_output_has_two_readers(rng, registry):
    w = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["y"]), node("Sigmoid", ["c"], ["z"])]
    onnx_model = model(nodes, [("x", [1, 3, 2, 2])], ["y", "z"], [("w", w)])
    before, after = check_pass(onnx_model, fuse_epilogues.run, registry=registry)
    assert len(after.nodes) == len(before.nodes) and not fused(after)


def test_epilogue_stops_where_the_shape_grows(rng, registry):
    w = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["a"]), node("Add", ["a", "big"], ["y"])]
    onnx_model = model(nodes, [("x", [1, 3, 2, 2]), ("big", [2, 4, 2, 2])], ["y"], [("w", w)])
    before, after = check_pass(onnx_model, fuse_epilogues.run, registry=registry)
    assert len(after.nodes) == 2
    assert [e["op_type"] for e in fused(after)[0].attrs["body"]] == ["Conv", "Relu"]


def test_pointwise_diamond_with_intermediate_output(registry):
    nodes = [node("Sigmoid", ["x"], ["s"]), node("Mul", ["x", "s"], ["m"]), node("Add", ["m", "b"], ["a"]),
             node("Tanh", ["s"], ["t"]), node("Sub", ["a", "t"], ["y"])]
    onnx_model = model(nodes, [("x", [2, 3]), ("b", [3])], ["y", "s"])
    before, after = check_pass(onnx_model, fuse_pointwise.run, registry=registry)
    assert len(before.nodes) == 5 and len(after.nodes) == 1
    assert set(fused(after)[0].outputs) == {"y", "s"}


def test_pointwise_groups_stay_convex(registry):
    """Relu -> Softmax (not pointwise, same shape) -> Add(relu, softmax): fusing Relu and Add
    would make the fused node both feed and read the Softmax."""
    nodes = [node("Relu", ["x"], ["r"]), node("Softmax", ["r"], ["s"], axis=-1), node("Add", ["r", "s"], ["a"]),
             node("Neg", ["a"], ["y"])]
    before, after = check_pass(model(nodes, [("x", [2, 5])], ["y"]), fuse_pointwise.run, registry=registry)
    groups = [[e["op_type"] for e in n.attrs["body"]] for n in fused(after)]
    assert groups == [["Add", "Neg"]] and len(after.nodes) == 3


# --------------------------------------------------------------------------- engines


def test_fused_engine_matches_onnxruntime_and_survives_a_plan_file(rng, registry, tmp_path):
    onnx_model = conv_block(rng)
    engine = Builder(registry).build_engine(onnx_model)
    report = engine.inspect()
    assert len(report["layers"]) == 1
    assert report["layers"][0]["op"] == "Conv+Add+Relu+Mul"
    assert report["layers"][0]["onnx_nodes"] == [n.name for n in onnx_model.graph.node]
    assert any(p["name"] == "fuse_epilogues" and p["nodes_after"] < p["nodes_before"] for p in report["passes"])
    unfused = Builder(registry).build_engine(onnx_model, BuilderConfig(fusion=False))
    assert len(unfused.inspect()["layers"]) == 4
    path = tmp_path / "fused.plan"
    engine.save(str(path))
    loaded = Engine.load(str(path), registry)
    feeds = {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32),
             "r": rng.standard_normal((1, 4, 4, 4)).astype(np.float32)}
    want = onnxruntime_outputs(onnx_model, feeds)["y"]
    for built in (engine, loaded, unfused):
        got = built.create_execution_context().execute(feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_disable_pass_by_name_and_unknown_names(rng, registry):
    config = BuilderConfig(disabled_passes={"fuse_epilogues"})
    layers = Builder(registry).build_engine(conv_block(rng), config).inspect()["layers"]
    assert [layer["op"] for layer in layers] == ["Conv", "Add+Relu+Mul"]
    with pytest.raises(Exception, match="no such pass.*fuse_pointwise"):
        Builder(registry).build_engine(conv_block(rng), BuilderConfig(disabled_passes={"fuse_everything"}))


# --------------------------------------------------------------------------- random DAGs

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Erf", "Softsign"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
SHAPES = [(2, 3, 4), (3, 4), (4,), (1, 3, 1), (2, 1, 4), ()]


@st.composite
def pointwise_dags(draw):
    """Random chains and diamonds: each node reads one or two earlier values (inputs of
    broadcastable shapes, or earlier node outputs)."""
    inputs = [("x0", (2, 3, 4))] + [(f"x{k}", draw(st.sampled_from(SHAPES))) for k in range(1, draw(st.integers(1, 3)))]
    values = [name for name, _ in inputs]
    nodes = []
    for index in range(draw(st.integers(2, 7))):
        out = f"v{index}"
        if draw(st.booleans()):
            nodes.append(node(draw(st.sampled_from(UNARY)), [draw(st.sampled_from(values))], [out]))
        else:
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            nodes.append(node(draw(st.sampled_from(BINARY)), [a, b], [out]))
        values.append(out)
    produced = [n.output[0] for n in nodes]
    read = {i for n in nodes for i in n.input}
    outputs = [v for v in produced if v not in read] or [produced[-1]]
    if draw(st.booleans()) and produced[0] not in outputs:
        outputs.append(produced[0])  # an intermediate that is also read: an extra output
    return model(nodes, inputs, outputs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pointwise_dags())
def test_random_pointwise_dags_fuse_and_match_onnxruntime(onnx_model):
    from plugrt.registry import default_registry

    registry = default_registry()
    engine = Builder(registry).build_engine(onnx_model)
    feeds = random_feeds(engine.graph, seed=len(onnx_model.graph.node))
    want = onnxruntime_outputs(onnx_model, feeds)
    got = engine.create_execution_context().execute(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # Every producer -> reader edge between two layers of one shape was fused: in a DAG of
    # pointwise ops no other op can stand between two of them.
    layers = engine.inspect()["layers"]
    for producer in layers:
        for reader in layers:
            shared = set(producer["outputs"]) & set(reader["inputs"])
            assert not shared or list(producer["outputs"].values())[0] != list(reader["outputs"].values())[0], \
                f"{producer['name']} -> {reader['name']} left unfused"


def test_epilogue_fuses_across_a_reshape_computed_from_a_dynamic_shape(rng, registry):
    """As exported models reshape: the target shape comes from Shape(x) at run time, so the
    MatMul's output dims are fresh symbols that symbolic inference cannot match with the
    residual's N; the profile's min/opt/max shapes prove them equal."""
    from plugrt.engine import OptimizationProfile

    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    nodes = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "zero"], ["n"], axis=0),
             node("Unsqueeze", ["n", "axes"], ["n1"]), node("Concat", ["n1", "flat"], ["target"], axis=0),
             node("Reshape", ["x", "target"], ["x2"]), node("MatMul", ["x2", "w"], ["m"]),
             node("Add", ["m", "r"], ["y"])]
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3]),
                     helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in
                     (("zero", np.array(0, np.int64)), ("axes", i64(0)), ("flat", i64(6)),
                      ("w", rng.standard_normal((6, 5)).astype(np.float32)))])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig()
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 2, 3), (2, 2, 3), (4, 2, 3))
                                    .set_shape("r", (1, 5), (2, 5), (4, 5)))
    engine = Builder(registry).build_engine(onnx_model, config)
    assert [layer["op"] for layer in engine.inspect()["layers"]] == ["Reshape", "MatMul+Add"]
    feeds = {"x": rng.standard_normal((3, 2, 3)).astype(np.float32), "r": rng.standard_normal((3, 5)).astype(np.float32)}
    got = engine.create_execution_context().execute(feeds)["y"]
    np.testing.assert_allclose(got, onnxruntime_outputs(onnx_model, feeds)["y"], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- generated kernels


@pytest.mark.parametrize("size", [7, 32, 100])
@pytest.mark.parametrize("unroll", [1, 4])
def test_chain_kernel_unrolled_and_tail_trips(size, unroll, registry, rng):
    """sigmoid(x * s + b) with a scalar s, a same-shape b and, for unroll 1, a strided c:
    the unrolled fast trips and the partial last trip both store every element once."""
    from plugrt.fusion.codegen import Program, Step, chain_tactic
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo
    from numba import cuda

    from plugrt.launcher import PreparedLaunch

    f32 = np.float32
    x, b = rng.standard_normal(size).astype(f32), rng.standard_normal(size).astype(f32)
    s = np.array(1.5, f32)
    info = lambda a: TensorInfo.of(a)  # noqa: E731
    fn = {op: registry.find_op("", op, 17).pointwise(Node(op, op, "", (), ("y",)), [info(x), info(x)])
          for op in ("Mul", "Add", "Sigmoid")}
    steps = (Step(fn["Mul"], (("leaf", 0), ("leaf", 1))), Step(fn["Add"], (("step", 0), ("leaf", 2))),
             Step(fn["Sigmoid"], (("step", 1),)))
    tactic = chain_tactic(Program((info(x), info(s), info(b)), steps, (2, 0)), [info(x)], unroll=unroll)
    assert tactic.params == {"unroll": unroll}
    outs = [cuda.device_array(size, f32), cuda.device_array(size, f32)]
    for launch in tactic.launches([cuda.to_device(a) for a in (x, s, b)], outs, None):
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    np.testing.assert_allclose(outs[0].copy_to_host(), 1 / (1 + np.exp(-(x * s + b))), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(outs[1].copy_to_host(), x * s, rtol=1e-6)


@pytest.mark.parametrize("size", [4, 13, 40])
@pytest.mark.parametrize("unroll", [1, 2])
def test_vector_chain_kernel_whole_vectors_and_tail(size, unroll, registry, rng):
    """The float32 vector tactic (16-byte loads and stores): whole vectors, the partial
    last trip and the n % 4 scalar tail each store every element once; a misaligned
    output makes it launch the scalar kernel instead."""
    from numba import cuda

    from plugrt.launcher import PreparedLaunch
    from plugrt.fusion.codegen import Program, Step, chain_tactics
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo

    f32 = np.float32
    x, b = rng.standard_normal(size).astype(f32), rng.standard_normal(size).astype(f32)
    s = np.array(-0.5, f32)
    fn = {op: registry.find_op("", op, 17).pointwise(Node(op, op, "", (), ("y",)), [TensorInfo.of(x)] * 2)
          for op in ("Mul", "Add")}
    steps = (Step(fn["Mul"], (("leaf", 0), ("leaf", 1))), Step(fn["Add"], (("step", 0), ("leaf", 2))))
    program = Program((TensorInfo.of(x), TensorInfo.of(s), TensorInfo.of(b)), steps, (1, 0))
    tactics = {t.name: t for t in chain_tactics(program, [TensorInfo.of(x)] * 2)}
    tactic = tactics[f"pointwise_vec4x{unroll}"]
    assert tactic.params == {"unroll": unroll, "vector": 4}
    for offset in (0, 1):  # 1: the outputs start 4 bytes past an aligned address
        outs = [cuda.device_array(size + 1, f32)[offset:offset + size] for _ in range(2)]
        launches = tactic.launches([cuda.to_device(a) for a in (x, s, b)], outs, None)
        assert (launches[0].kernel is tactics["pointwise"].launches(
            [cuda.to_device(a) for a in (x, s, b)], outs, None)[0].kernel) == bool(offset)
        for launch in launches:
            PreparedLaunch(launch)(0)
        cuda.synchronize()
        np.testing.assert_allclose(outs[0].copy_to_host(), x * s + b, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(outs[1].copy_to_host(), x * s, rtol=1e-6)


@pytest.mark.parametrize("size, strided", [(8, False), (21, False), (48, False), (16, True), (48, True)])
@pytest.mark.parametrize("unroll", [1, 2])
def test_vector8_chain_kernel_float16(size, strided, unroll, registry, rng):
    """The 8-wide vector tactic for chains touching float16 (16-byte float16 vectors, two
    of float32): whole vectors, the partial last trip, the n % 8 scalar tail, a per-column
    strided leaf (last axis a multiple of 8) and a scalar leaf; both outputs stored once;
    a misaligned output launches the scalar kernel."""
    from numba import cuda

    from plugrt.launcher import PreparedLaunch
    from plugrt.fusion.codegen import Program, Step, chain_tactics
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo

    f16, f32 = np.float16, np.float32
    shape = (size // 8, 8) if strided else (size,)
    x = rng.standard_normal(shape).astype(f16)
    b = rng.standard_normal(shape[-1:] if strided else shape).astype(f32)
    s = np.array(-0.5, f32)
    fn = {op: registry.find_op("", op, 17).pointwise(Node(op, op, "", (), ("y",)), [TensorInfo.of(x)] * 2)
          for op in ("Mul", "Add")}
    steps = (Step(fn["Mul"], (("leaf", 0), ("leaf", 1))), Step(fn["Add"], (("step", 0), ("leaf", 2))))
    program = Program((TensorInfo.of(x), TensorInfo.of(s), TensorInfo.of(b)), steps, (1, 0))
    outputs = [TensorInfo(np.dtype(f32), shape), TensorInfo(np.dtype(f16), shape)]
    tactics = {t.name: t for t in chain_tactics(program, outputs)}
    assert not any("vec4" in name for name in tactics)
    tactic = tactics[f"pointwise_vec8x{unroll}"]
    assert tactic.params == {"unroll": unroll, "vector": 8}
    want = x.astype(np.float64) * -0.5 + b
    for offset in (0, 1):  # 1: the outputs start one element past an aligned address
        outs = [cuda.device_array(size + 1, o.dtype)[offset:offset + size].reshape(shape) for o in outputs]
        ins = [cuda.to_device(a) for a in (x, s, b)]
        launches = tactic.launches(ins, outs, None)
        assert (launches[0].kernel is tactics["pointwise"].launches(ins, outs, None)[0].kernel) == bool(offset)
        for launch in launches:
            PreparedLaunch(launch)(0)
        cuda.synchronize()
        np.testing.assert_allclose(outs[0].copy_to_host(), want, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(outs[1].copy_to_host().astype(np.float64), x.astype(np.float64) * -0.5, rtol=2e-3)


def test_float32_chains_keep_the_4_wide_kernel_and_narrow_rows_get_no_vector8():
    from plugrt.fusion.codegen import Program, Step, vectorizable8
    from plugrt.plugin import TensorInfo

    leaves = (TensorInfo(np.dtype(np.float16), (3, 12)), TensorInfo(np.dtype(np.float32), (12,)))
    program = Program(leaves, (Step(None, (("leaf", 0), ("leaf", 1))),), (0,))
    assert not vectorizable8(program, [TensorInfo(np.dtype(np.float16), (3, 12))])  # strided, 12 % 8
    assert vectorizable8(Program(leaves[:1], program.steps, (0,)), [TensorInfo(np.dtype(np.float16), (3, 12))])
    f32 = (TensorInfo(np.dtype(np.float32), (3, 16)),)
    assert not vectorizable8(Program(f32, program.steps, (0,)), list(f32))


def test_generated_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile generated chain kernels (unrolled, strided
    and float16 leaves) and an epilogue for sm_90, free of float64 arithmetic."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt.fusion import codegen
        from plugrt.plugin import TensorInfo

        @cuda.jit(device=True)
        def fma(a, b, c):
            return a * b + c

        f32, f16 = np.dtype("float32"), np.dtype("float16")
        for out_shape, shapes, dts, unroll in (((64,), [(64,), (1,), (64,)], [f32, f32, f32], 4),
                                               ((4, 8), [(4, 8), (8,), (4, 1)], [f16, f32, f32], 1)):
            leaves = tuple(TensorInfo(dt, shape) for dt, shape in zip(dts, shapes))
            program = codegen.Program(leaves, (codegen.Step(fma, (("leaf", 0), ("leaf", 1), ("leaf", 2))),), (0,))
            kernel, _ = codegen.chain_kernel(program, out_shape, unroll)
            check(f"chain unroll={unroll}", kernel, [I64, arr(np.int64), arr(f32)] + [arr(dt) for dt in dts], True)
            fn = codegen.epilogue(codegen.Program(leaves[1:], (codegen.Step(fma, (("value",), ("leaf", 0), ("leaf", 1))),),
                                                  (0,)), out_shape, 2).fn

            @cuda.jit
            def anchor(out, ops):
                out[0] = fn(float32(1), np.int64(0), ops)

            check(f"epilogue {out_shape}", anchor, [arr(f32), types.Tuple((arr(np.int64),) + tuple(arr(dt) for dt in dts[1:]))],
                  True)

        leaves = tuple(TensorInfo(f32, shape) for shape in [(64,), (1,), (64,)])
        program = codegen.Program(leaves, (codegen.Step(fma, (("leaf", 0), ("leaf", 1), ("leaf", 2))),), (0,))
        for unroll in codegen.VECTOR_UNROLLS:
            kernel, _ = codegen.vector_kernel(program, (64,), unroll)
            check(f"vector chain unroll={unroll}", kernel, [I64, arr(np.int64), arr(f32)] + [arr(f32)] * 3, True)
            ir = compile_cuda(kernel.py_func, types.void, (I64, arr(np.int64), arr(f32), arr(f32), arr(f32), arr(f32)),
                              cc=(9, 0)).library.get_llvm_str()
            if "load <4 x float>" not in ir or "store <4 x float>" not in ir:
                RESULTS.append(f"vector chain unroll={unroll}: no 16-byte vector load and store in the IR")

        # The epilogue's vector form: a float16 residual (vector loads), a per-channel
        # bias (strided), a scalar; stored by store8 into float16 and float32 outputs.
        from plugrt.kernels import vector8
        store8 = vector8()[1]
        leaves = (TensorInfo(f16, (2, 3, 16)), TensorInfo(f32, (16,)), TensorInfo(f32, (1,)))
        steps = (codegen.Step(fma, (("value",), ("leaf", 2), ("leaf", 0))), codegen.Step(fma, (("step", 0), ("leaf", 2), ("leaf", 1))))
        made = codegen.epilogue(codegen.Program(leaves, steps, (1,)), (2, 3, 16), 2)
        if made.vector is None or made.vector_operands != (0,):
            RESULTS.append(f"vector epilogue not offered: {made.vector_operands}")
        vfn = made.vector
        for out in (f16, f32):
            @cuda.jit
            def vanchor(out, ops):
                v = float32(1)
                store8(out, np.int64(8), vfn((v, v, v, v, v, v, v, v), np.int64(8), ops))

            args = [arr(out), types.Tuple((arr(np.int64), arr(f16), arr(f32), arr(f32)))]
            check(f"vector epilogue out={out}", vanchor, args, True)
            ir = compile_cuda(vanchor.py_func, types.void, tuple(args), cc=(9, 0)).library.get_llvm_str()
            if "load <8 x half>" not in ir:
                RESULTS.append(f"vector epilogue out={out}: the float16 residual is not read by a 16-byte vector")
        leaves = (TensorInfo(f16, (2, 3, 12)), TensorInfo(f32, (12,)), TensorInfo(f32, (1,)))
        chain = (codegen.Step(fma, (("leaf", 0), ("leaf", 2), ("leaf", 1))),)
        program = codegen.Program((TensorInfo(f16, (4, 16)), TensorInfo(f32, (16,)), TensorInfo(f32, (1,))), chain, (0,))
        for unroll in codegen.VECTOR_UNROLLS:
            kernel, _ = codegen.vector8_kernel(program, (4, 16), unroll)
            vargs = (I64, arr(np.int64), arr(f16), arr(f16), arr(f32), arr(f32))  # n, table, out, leaves
            check(f"vector8 chain unroll={unroll}", kernel, list(vargs), True)
            ir = compile_cuda(kernel.py_func, types.void, vargs, cc=(9, 0)).library.get_llvm_str()
            if "load <8 x half>" not in ir or "store <8 x half>" not in ir:
                RESULTS.append(f"vector8 chain unroll={unroll}: no 16-byte float16 vectors in the IR")
        if codegen.epilogue(codegen.Program(leaves, steps, (1,)), (2, 3, 12), 2).vector is not None:
            RESULTS.append("vector epilogue offered on a last axis that is not a multiple of 8")
    """)
    assert not failures, failures
