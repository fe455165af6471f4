"""LSTM, GRU and RNN: the references and the stepwise CUDA tactic against onnxruntime on fresh
random inputs (tiny shapes: the tactic runs in the simulator), a two-layer LSTM model
through the engine, and the errors a bad node gets.

onnxruntime's CPU kernels take float32 only; float16 is checked tactic against reference.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.errors import ShapeError, UnsupportedError
from plugrt.ir.specialize import concretize
from plugrt.onnx import backend
from plugrt.onnx.importer import import_model
from plugrt.testing import check_plugin, node_tactics, run_tactic

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
SEQ, BATCH, SIZE, HIDDEN = 4, 3, 2, 3


def _feeds(rng, op, *, direction="forward", layout=0, bias=True, lens=None, states=True, peepholes=False,
           scale=0.6, dtype=np.float32):
    """Random inputs of one node: ``None`` for those it omits."""
    dirs = 2 if direction == "bidirectional" else 1
    gh = GATES[op] * HIDDEN

    def normal(*shape, s=scale):
        return (rng.standard_normal(shape) * s + 0.05).astype(dtype)

    x = normal(BATCH, SEQ, SIZE, s=1.0) if layout else normal(SEQ, BATCH, SIZE, s=1.0)
    state = (BATCH, dirs, HIDDEN) if layout else (dirs, BATCH, HIDDEN)
    feeds = {"X": x, "W": normal(dirs, gh, SIZE), "R": normal(dirs, gh, HIDDEN),
             "B": normal(dirs, 2 * gh) if bias else None,
             "sequence_lens": None if lens is None else np.array(lens, np.int32),
             "initial_h": normal(*state) if states else None}
    if op == "LSTM":
        feeds["initial_c"] = normal(*state) if states else None
        feeds["P"] = normal(dirs, 3 * HIDDEN) if peepholes else None
    while feeds and feeds[list(feeds)[-1]] is None:  # trailing omitted inputs are left out
        feeds.pop(list(feeds)[-1])
    return feeds


def _model(op, feeds, attrs, opset=14, outputs=None):
    outputs = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in feeds.items() if a is not None]
    node = helper.make_node(op, [n if a is not None else "" for n, a in feeds.items()], outputs, name=f"{op.lower()}0",
                            hidden_size=HIDDEN, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs if o])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {n: a for n, a in feeds.items() if a is not None})


def _tactic_outputs(model, feeds):
    """The stepwise tactic's outputs (the simulator without a GPU)."""
    runtime = {n: a for n, a in feeds.items() if a is not None}
    graph = import_model(model)
    graph = concretize(graph, {n: graph.info(n).shape for n in graph.inputs}, _registry())
    tactics = node_tactics(graph, _registry())
    assert [t.name for t in tactics] == ["stepwise"]
    assert tactics[0].workspace_bytes > 0
    return run_tactic(graph, tactics[0], runtime)


def _registry():
    from plugrt.registry import default_registry

    return default_registry()


def _batch_first(op, feeds, attrs):
    """onnxruntime's outputs for layout 1, which it refuses: the layout-0 node on
    transposed inputs, its outputs transposed back."""
    seq_first = {n: None if a is None else a.swapaxes(0, 1) if n in ("X", "initial_h", "initial_c") else a
                 for n, a in feeds.items()}
    outputs = _onnxruntime(_model(op, seq_first, {**attrs, "layout": 0}), seq_first)
    return [outputs[0].transpose(2, 0, 1, 3)] + [o.swapaxes(0, 1) for o in outputs[1:]]


def _check(op, feeds, attrs, opset=14, rtol=1e-4, atol=2e-5):
    """Reference and tactic against onnxruntime, every output."""
    model = _model(op, feeds, attrs, opset)
    expected = _batch_first(op, feeds, attrs) if attrs.get("layout") else _onnxruntime(model, feeds)
    reference = backend.prepare(model, "CPU").run({n: a for n, a in feeds.items() if a is not None})
    tactic = _tactic_outputs(model, feeds)
    for k, want in enumerate(expected):
        for label, got in (("reference", reference[k]), ("tactic", tactic[k])):
            assert got.dtype == want.dtype and got.shape == want.shape, (label, k, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{op} {label} output {k}")
    assert np.abs(expected[0]).max() > 1e-2  # (the case computes something)
    return expected


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_every_input_ragged_sequences(rng, op, direction):
    feeds = _feeds(rng, op, direction=direction, lens=[4, 2, 3])
    expected = _check(op, feeds, {"direction": direction})
    assert np.all(expected[0][2:, :, 1] == 0)  # Y past batch entry 1's length is zero


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_defaults_without_optional_inputs(rng, op):
    _check(op, _feeds(rng, op, bias=False, states=False), {}, opset=7)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout_1_bidirectional(rng, op):
    feeds = _feeds(rng, op, direction="bidirectional", layout=1, lens=[3, 4, 1])
    _check(op, feeds, {"direction": "bidirectional", "layout": 1})


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_clip(rng, op):
    feeds = _feeds(rng, op, direction="bidirectional", scale=2.0)
    clipped = _check(op, feeds, {"direction": "bidirectional", "clip": 0.7})
    free = _onnxruntime(_model(op, feeds, {"direction": "bidirectional"}), feeds)
    assert not np.allclose(clipped[0], free[0], atol=1e-3)  # the clip bites


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_linear_before_reset(rng, direction):
    feeds = _feeds(rng, "GRU", direction=direction, lens=[1, 4, 3])
    _check("GRU", feeds, {"direction": direction, "linear_before_reset": 1})


def test_lstm_peepholes_and_input_forget(rng):
    feeds = _feeds(rng, "LSTM", direction="bidirectional", peepholes=True, lens=[2, 4, 3])
    _check("LSTM", feeds, {"direction": "bidirectional"})
    _check("LSTM", feeds, {"direction": "bidirectional", "input_forget": 1})


@pytest.mark.parametrize("op, activations, alpha, beta", [
    ("RNN", ["Relu"], None, None),
    ("GRU", ["HardSigmoid", "LeakyRelu"], [0.3, 0.2], None),
    ("LSTM", ["Sigmoid", "Softsign", "Softplus", "Relu", "Tanh", "Elu"], None, None),
])
def test_other_activations(rng, op, activations, alpha, beta):
    direction = "bidirectional" if len(activations) == 2 * {"RNN": 1, "GRU": 2, "LSTM": 3}[op] else "forward"
    attrs = {"direction": direction, "activations": activations}
    if alpha:
        attrs["activation_alpha"] = alpha
    _check(op, _feeds(rng, op, direction=direction), attrs)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_float16_tactic_matches_reference(rng, op):
    feeds = _feeds(rng, op, direction="bidirectional", lens=[4, 1, 3], dtype=np.float16)
    model = _model(op, feeds, {"direction": "bidirectional"})
    reference = backend.prepare(model, "CPU").run({n: a for n, a in feeds.items() if a is not None})
    for want, got in zip(reference, _tactic_outputs(model, feeds)):
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=5e-3)
    wide = {n: None if a is None or a.dtype != np.float16 else a.astype(np.float32) for n, a in feeds.items()}
    wide["sequence_lens"] = feeds["sequence_lens"]
    expected = _onnxruntime(_model(op, wide, {"direction": "bidirectional"}), wide)
    np.testing.assert_allclose(reference[0].astype(np.float32), expected[0], rtol=1e-2, atol=5e-3)


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
def test_float64_tactic_matches_reference(rng, op):
    """float64 inputs: the kernels compute in float64, as the reference does."""
    feeds = _feeds(rng, op, direction="reverse", lens=[3, 4, 2], peepholes=True, dtype=np.float64)
    model = _model(op, feeds, {"direction": "reverse", "clip": 1.0})
    reference = backend.prepare(model, "CPU").run({n: a for n, a in feeds.items() if a is not None})
    for want, got in zip(reference, _tactic_outputs(model, feeds)):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("op, outputs", [("LSTM", ["", "", "Y_c"]), ("GRU", ["Y"]), ("RNN", ["", "Y_h"])])
def test_omitted_outputs_through_the_engine(rng, op, outputs):
    feeds = _feeds(rng, op, direction="bidirectional", lens=[2, 4, 1])
    model = _model(op, feeds, {"direction": "bidirectional"}, outputs=outputs)
    runtime = {n: a for n, a in feeds.items() if a is not None}
    got = backend.prepare(model, "CUDA", tf32=False).run(runtime)
    expected = _onnxruntime(model, feeds)
    assert len(got) == len(expected) == 1
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=2e-5)


def test_two_layer_lstm_engine(rng):
    """X -> LSTM (bidirectional) -> Transpose/Reshape to [seq, batch, 2H] -> LSTM, as a
    two-layer ``nn.LSTM`` exports, weights as initializers, Y_h of both layers out."""
    dirs, gh = 2, 4 * HIDDEN
    weights = {"W0": (dirs, gh, SIZE), "R0": (dirs, gh, HIDDEN), "B0": (dirs, 2 * gh),
               "W1": (1, gh, 2 * HIDDEN), "R1": (1, gh, HIDDEN), "B1": (1, 2 * gh)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n) for n, s in weights.items()]
    inits.append(numpy_helper.from_array(np.array([SEQ, BATCH, 2 * HIDDEN], np.int64), "shape"))
    nodes = [helper.make_node("LSTM", ["x", "W0", "R0", "B0"], ["y0", "h0"], hidden_size=HIDDEN,
                              direction="bidirectional", name="layer0"),
             helper.make_node("Transpose", ["y0"], ["y0t"], perm=[0, 2, 1, 3], name="t0"),
             helper.make_node("Reshape", ["y0t", "shape"], ["x1"], name="r0"),
             helper.make_node("LSTM", ["x1", "W1", "R1", "B1"], ["y", "h1", "c1"], hidden_size=HIDDEN, name="layer1")]
    graph = helper.make_graph(nodes, "lstm2", [helper.make_tensor_value_info("x", 1, [SEQ, BATCH, SIZE])],
                              [helper.make_empty_tensor_value_info(n) for n in ("y", "h0", "h1", "c1")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    x = rng.standard_normal((SEQ, BATCH, SIZE)).astype(np.float32)
    expected = _onnxruntime(model, {"x": x})
    engine = Builder(_registry()).build_engine(model, BuilderConfig())
    got = engine.create_execution_context().execute({"x": x})
    for name, want in zip(("y", "h0", "h1", "c1"), expected):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=2e-5, err_msg=name)


def _symbolic_gru(layout: int):
    """A bidirectional GRU over X of symbolic sequence and batch dims, weights as initializers."""
    rng = np.random.default_rng(7)
    gh = 3 * HIDDEN
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
             for n, s in (("W", (2, gh, SIZE)), ("R", (2, gh, HIDDEN)), ("B", (2, 2 * gh)))]
    x_dims = ["batch", "seq", SIZE] if layout else ["seq", "batch", SIZE]
    node = helper.make_node("GRU", ["x", "W", "R", "B"], ["y", "h"], hidden_size=HIDDEN, direction="bidirectional",
                            linear_before_reset=1, layout=layout, name="gru")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x_dims)],
                              [helper.make_empty_tensor_value_info(n) for n in ("y", "h")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def test_shapes_are_inferred_with_symbolic_dims():
    graph = import_model(_symbolic_gru(0))
    assert graph.info("y").shape == ("seq", 2, "batch", HIDDEN) and graph.info("h").shape == (2, "batch", HIDDEN)
    graph = import_model(_symbolic_gru(1))
    assert graph.info("y").shape == ("batch", "seq", 2, HIDDEN) and graph.info("h").shape == ("batch", 2, HIDDEN)


def test_dynamic_sequence_length_and_batch_in_one_engine(rng, caplog):
    """One engine over a profile of lengths and batches: each shape gets its own launch list,
    of the same kernels (one launch a time step, however many steps: the stepwise tactic
    is the layer's generic one, no kernel compiled for a new length)."""
    model = _symbolic_gru(0)
    config = BuilderConfig()
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 1, SIZE), (2, 2, SIZE),
                                                                   (SEQ, BATCH, SIZE)))
    with caplog.at_level("WARNING", logger="plugrt.builder"):
        engine = Builder(_registry()).build_engine(model, config)
    assert not [r for r in caplog.records if "same kernels at every shape" in r.getMessage()], caplog.text
    layer = next(layer for layer in engine.layers if layer.tactic_for(0)["name"] == "stepwise")
    assert layer.generic_for(0)["name"] == "stepwise"
    context = engine.create_execution_context()
    for shape in ((SEQ, BATCH, SIZE), (1, 2, SIZE), (3, 1, SIZE)):
        x = rng.standard_normal(shape).astype(np.float32)
        got = context.execute({"x": x})
        for name, want in zip(("y", "h"), _onnxruntime(model, {"x": x})):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=2e-5, err_msg=f"{name} at {shape}")


def test_conformance_kit_passes_every_claimed_example(registry):
    report = check_plugin("builtin-recurrent", registry=registry)
    assert report.ops() == ["GRU", "LSTM", "RNN"]


# ------------------------------------------------------------------------------ errors


def test_wrong_weight_shape_is_a_shape_error_naming_the_node(rng):
    feeds = _feeds(rng, "LSTM")
    feeds["W"] = feeds["W"][:, :-1]  # 11 rows where 4 gates x 3 hidden take 12
    with pytest.raises(ShapeError, match=r"node 'lstm0' \(LSTM.*W has shape \[1, 11, 2\], expected \[1, 12, 2\]"):
        import_model(_model("LSTM", feeds, {}))


def test_unsupported_activation_names_the_node(rng):
    feeds = _feeds(rng, "RNN")
    with pytest.raises(UnsupportedError, match=r"node 'rnn0' \(RNN.*activation 'ScaledTanh'.*supported: Sigmoid"):
        import_model(_model("RNN", feeds, {"activations": ["ScaledTanh"]}))


def test_ambiguous_activation_alpha_is_refused(rng):
    """Tanh takes no alpha: onnxruntime would give 0.3 to LeakyRelu, ONNX's reference to Tanh."""
    feeds = _feeds(rng, "GRU")
    with pytest.raises(UnsupportedError, match=r"node 'gru0'.*activation_alpha=\[0.3\]"):
        import_model(_model("GRU", feeds, {"activations": ["LeakyRelu", "Tanh"], "activation_alpha": [0.3]}))


def test_layout_before_opset_14_is_refused(rng):
    feeds = _feeds(rng, "GRU", layout=1)
    with pytest.raises(UnsupportedError, match=r"node 'gru0'.*layout=1 at opset 7.*opset 14"):
        import_model(_model("GRU", feeds, {"layout": 1}, opset=7))


def test_recurrent_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every recurrent kernel for sm_90, in
    float32 and float16 data (float32 arithmetic), with and without every optional input
    and Y, each cell and both directions' orders; float32 data leaves no float64 in them."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.recurrent import cell_steps as C, projection as P
        from plugrt_builtin_ops.recurrent.recurrence import describe
        attrs = {"activations": None, "activation_alpha": None, "activation_beta": None, "clip": None, "layout": 0}
        cases = [("RNN", {}), ("LSTM", {}), ("LSTM", {"input_forget": 1, "clip": 2.0}), ("GRU", {}),
                 ("GRU", {"linear_before_reset": 1})]
        for dt in (np.float32, np.float16):
            A, S = arr(np.float32), arr(dt)
            lens = arr(np.int32)
            check(f"copy_state {dt}", P.copy_state, [S, I64, I64, I64, A, I64, I64, I64, I64, I64, I64])
            check(f"copy_state back {dt}", P.copy_state, [A, I64, I64, I64, S, I64, I64, I64, I64, I64, I64])
            for bias in (False, True):
                check(f"projection {dt} {bias}", P.projection_kernel("float32", bias),
                      [S, S, S, A, I64, I64, I64, I64, I64, I64, I64], dt == np.float32)
            for cell, extra in cases:
                for direction in ("reverse", "bidirectional"):
                    rec = describe(cell, {**attrs, "direction": direction, **extra}, 4)
                    for bias, has_lens, has_y in ((False, False, False), (True, True, True)):
                        y_tail = [S, I64, I64, I64, I64, I64, I64, I64]
                        label = f"{cell} {extra} {direction} {dt} {bias} {has_lens} {has_y}"
                        if cell == "RNN":
                            check(label, C.rnn_step_kernel(rec, "float32", bias, has_lens, has_y),
                                  [A, S, S, lens, A, I64, I64] + y_tail, dt == np.float32)
                        elif cell == "LSTM":
                            for peep in (False, True):
                                check(label + f" {peep}", C.lstm_step_kernel(rec, "float32", bias, has_lens, peep, has_y),
                                      [A, S, S, S, lens, A, A, I64, I64] + y_tail, dt == np.float32)
                        elif rec.linear_before_reset:
                            check(label, C.gru_linear_before_reset_kernel(rec, "float32", bias, has_lens, has_y),
                                  [A, S, S, lens, A, I64, I64] + y_tail, dt == np.float32)
                        else:
                            check(label + " gates", C.gru_gates_kernel(rec, "float32", bias, has_lens),
                                  [A, S, S, lens, A, I64, A, I64, I64, I64, I64], dt == np.float32)
                            check(label + " candidate", C.gru_candidate_kernel(rec, "float32", bias, has_lens, has_y),
                                  [A, S, S, lens, A, I64, I64, A] + y_tail, dt == np.float32)
        check("zero_state", P.zero_state, [arr(np.float32), I64])
    """)
    assert not failures, "\\n".join(failures)
