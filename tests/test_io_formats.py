"""Binding formats (``--io-format NAME:channels_last``, TensorRT's HWC I/O formats): an
``[N, C, H, W]`` input or output bound as ``[N, H, W, C]``; the Transposes the engine keeps
inside cancel against the channels-last convolutions', so nothing converts at the edges."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from plugrt.cli import main
from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.errors import PlugrtError
from plugrt.onnx.importer import import_model
from plugrt.passes import bind_formats, optimize
from plugrt.registry import default_registry
from test_channels_last import FP32_TOL, small_resnet

TO_LAST, TO_FIRST = (0, 2, 3, 1), (0, 3, 1, 2)


def _reference(model, x):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))


def test_channels_last_bindings_leave_no_layout_op_at_either_end(rng):
    registry = default_registry()
    graph = import_model(small_resnet(rng, batch="N"), registry=registry)
    bind_formats(graph, registry, {"x": "channels_last", "b1.out": "channels_last"})
    assert graph.info("x").shape == ("N", 6, 6, 3) and graph.io_formats == {}
    optimize(graph, registry, fusion=True, disabled=("fuse_epilogues", "fuse_pointwise"))
    transposes = [node for node in graph.nodes if node.op_type == "Transpose"]
    assert [graph.info(n.outputs[0]).shape for n in transposes] == [("N", 16, 1, 1)], transposes  # the head's only
    producer = graph.producers()["b1.out"]
    assert producer.op_type == "Relu" and graph.info("b1.out").shape == ("N", 6, 6, 8), producer
    first = next(node for node in graph.nodes if "x" in node.inputs)
    assert first.op_type == "Pad", first  # 3 channels padded to 8, straight from the binding


@pytest.mark.parametrize("fp16", [False, True])
def test_a_channels_last_engine_matches_onnxruntime_at_every_batch(rng, fp16):
    model = small_resnet(rng, batch="N")
    config = BuilderConfig(progress=False, fp16=fp16, fp16_io=fp16,
                           io_formats={"x": "channels_last", "b1.out": "channels_last"})
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 6, 6, 3), (2, 6, 6, 3), (3, 6, 6, 3)))
    engine = Builder().build_engine(model, config)
    assert engine.graph.info("x").shape[1:] == (6, 6, 3) and engine.graph.info("b1.out").shape[1:] == (6, 6, 8)
    dtype = np.float16 if fp16 else np.float32
    tol = 2e-2 if fp16 else FP32_TOL
    with engine.create_execution_context() as context:
        for n in (1, 3):
            x = rng.standard_normal((n, 3, 6, 6)).astype(np.float32)
            want = _reference(model, x)
            got = context.execute({"x": np.ascontiguousarray(x.transpose(TO_LAST)).astype(dtype)})
            assert got["b1.out"].shape == (n, 6, 6, 8) and got["b1.out"].dtype == dtype
            for name, expected in (("y", want["y"]), ("b1.out", want["b1.out"].transpose(TO_LAST))):
                np.testing.assert_allclose(got[name].astype(np.float32), expected, rtol=tol,
                                           atol=tol * np.abs(expected).max(), err_msg=f"{name}, batch {n}")


def test_linear_changes_nothing_and_a_layout_op_stays_without_channels_last_convs(rng):
    """``linear`` is the model's layout; with the channels_last pass off, the binding's
    Transpose stays a kernel and the engine is still right."""
    model = small_resnet(rng, batch=2)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    config = BuilderConfig(progress=False, io_formats={"x": "channels_last", "y": "linear"},
                           disabled_passes=("channels_last",))
    engine = Builder().build_engine(model, config)
    assert any(layer["op"] == "Transpose" for layer in engine.inspect()["layers"])
    got = engine.create_execution_context().execute({"x": np.ascontiguousarray(x.transpose(TO_LAST))})
    np.testing.assert_allclose(got["y"], _reference(model, x)["y"], rtol=FP32_TOL, atol=FP32_TOL)


@pytest.mark.parametrize("formats, words", [
    ({"z": "channels_last"}, ["--io-format z:channels_last", "no input or output 'z'", "'x'"]),
    ({"x": "hwc8"}, ["--io-format x:hwc8", "unknown format", "channels_last"]),
    ({"y": "channels_last"}, ["--io-format y:channels_last", "binding 'y'", "rank 3 or more"]),
])
def test_bad_formats_are_named(rng, formats, words):
    with pytest.raises(PlugrtError) as error:
        Builder().build_engine(small_resnet(rng, batch=2), BuilderConfig(progress=False, io_formats=formats))
    assert all(word in str(error.value) for word in words), str(error.value)


def test_the_command_line(rng, tmp_path, capsys):
    path = tmp_path / "net.onnx"
    path.write_bytes(small_resnet(rng, batch="N").SerializeToString())
    plan = tmp_path / "net.plan"
    shapes = ["--min-shapes", "x:1x6x6x3", "--opt-shapes", "x:2x6x6x3", "--max-shapes", "x:2x6x6x3"]
    assert main(["build", str(path), "-o", str(plan), "--no-progress", "--io-format", "x:channels_last",
                 *shapes]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["inspect", str(plan)]) == 0
    assert "input  x: float32[N,6,6,3]" in capsys.readouterr().out
    for argv, words in ((["--io-format", "x"], ["--io-format 'x'", "NAME:FORMAT"]),
                        (["--io-format", "x:channels_last", "--io-format", "x:linear"], ["'x'", "two formats"]),
                        (["--io-format", "q:channels_last"], ["no input or output 'q'"])):
        code = main(["build", str(path), "-o", str(tmp_path / "bad.plan"), "--no-progress", *argv, *shapes])
        err = capsys.readouterr().err
        assert code == 2 and all(word in err for word in words) and "Traceback" not in err, (argv, err)
    code = main(["build", str(path), "-o", str(tmp_path / "nchw.plan"), "--no-progress", "--io-format",
                 "x:channels_last", "--min-shapes", "x:1x3x6x6", "--opt-shapes", "x:2x3x6x6", "--max-shapes", "x:2x3x6x6"])
    err = capsys.readouterr().err
    assert code == 2 and "x" in err and "Traceback" not in err, err  # profile shapes in the binding's layout
