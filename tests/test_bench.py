"""``plugrt bench`` and :func:`plugrt.bench.run_benchmark` in the simulator: the measurement
machinery runs and reports (the numbers themselves mean nothing without a GPU)."""

from __future__ import annotations

import io
import json
import sys
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.device import simulated

from plugrt.bench import STATISTICS, BenchResult, random_feeds, run_benchmark
from plugrt.cli import main
from plugrt.engine import Engine
from plugrt.errors import PlugrtError
from plugrt.testing import single_node_model

FAST = ["--warmup", "0", "--iterations", "2", "--duration", "0", "--no-progress"]


def dynamic_model():
    """Sigmoid(x + x) with a dynamic batch dim."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Sigmoid", ["s"], ["y"])],
                              "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A static one-Relu model, a dynamic model, and the dynamic one's plan (profile n in 1..4, opt 2)."""
    folder = tmp_path_factory.mktemp("bench")
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    (folder / "relu.onnx").write_bytes(single_node_model("Relu", {"x": x}).SerializeToString())
    (folder / "dyn.onnx").write_bytes(dynamic_model().SerializeToString())
    assert main(["build", str(folder / "dyn.onnx"), "-o", str(folder / "dyn.plan"), "--no-progress",
                 "--min-shapes", "x:1x3", "--opt-shapes", "x:2x3", "--max-shapes", "x:4x3"]) == 0
    return folder


def bench_json(argv, tmp_path, capsys) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    assert main(["bench", *argv, "--json", str(out)]) == 0, capsys.readouterr().err
    return json.loads(out.read_text()), capsys.readouterr().out


def check_report(report: dict, queries_per_stream: list[int]) -> None:
    assert report["queries_per_stream"] == queries_per_stream
    assert report["queries"] == sum(queries_per_stream)
    assert report["walltime_s"] > 0
    assert report["throughput"]["queries_per_s"] > 0
    assert report["throughput"]["inferences_per_s"] == pytest.approx(
        report["throughput"]["batch"] * report["throughput"]["queries_per_s"])
    for key in ("latency_ms", "gpu_compute_ms", "host_enqueue_ms", "host_walltime_ms"):
        stats = report[key]
        assert set(stats) == set(STATISTICS), key
        assert all(value > 0 for value in stats.values()), (key, stats)
        assert stats["min"] <= stats["median"] <= stats["p90"] <= stats["p99"] <= stats["max"], (key, stats)
    assert report["simulator"] is simulated()
    assert ("simulator" in report["timing"]) is simulated()


def test_bench_a_plan_writes_its_json(files, tmp_path, capsys):
    report, out = bench_json([str(files / "dyn.plan"), "--shapes", "x:3x3", "--iterations", "4", "--warmup", "1",
                              "--duration", "0", "--no-progress"], tmp_path, capsys)
    check_report(report, [4])
    assert report["built"] is False
    assert report["settings"]["shapes"] == {"x": [3, 3]}
    assert report["settings"]["warmup"] == 1 and report["settings"]["iterations"] == 4
    assert report["throughput"]["batch"] == 3
    assert report["settings"]["data_transfers"] and report["settings"]["use_cuda_graph"]
    assert report["h2d_ms"]["min"] > 0 and report["d2h_ms"]["min"] > 0
    for word in ("latency", "throughput", "GPU compute", "host enqueue", "H2D", "D2H", "walltime", "p99"):
        assert word in out


def test_bench_a_model_builds_it_with_the_shapes(files, tmp_path, capsys):
    report, out = bench_json([str(files / "dyn.onnx"), "--shapes", "x:3x3", *FAST], tmp_path, capsys)
    check_report(report, [2])
    assert report["built"] is True and "(built)" in out
    assert report["settings"]["shapes"] == {"x": [3, 3]}


def test_bench_a_model_with_a_profile_runs_at_the_shapes_inside_it(files, tmp_path, capsys):
    report, _ = bench_json([str(files / "dyn.onnx"), "--shapes", "x:1x3", "--max-shapes", "x:4x3",
                            "--min-shapes", "x:1x3", "--opt-shapes", "x:4x3", "--optimization-level", "0", *FAST],
                           tmp_path, capsys)
    assert report["settings"]["shapes"] == {"x": [1, 3]}


def test_bench_a_static_model_without_shapes(files, tmp_path, capsys):
    report, _ = bench_json([str(files / "relu.onnx"), *FAST], tmp_path, capsys)
    check_report(report, [2])
    assert report["settings"]["shapes"] == {"x": [2, 3]}


def test_two_streams_run_on_two_threads(files, tmp_path, capsys):
    report, _ = bench_json([str(files / "dyn.plan"), "--streams", "2", *FAST], tmp_path, capsys)
    check_report(report, [2, 2])
    assert report["threads"] == 2 and report["settings"]["streams"] == 2


def test_no_data_transfers_times_the_compute_alone(files, tmp_path, capsys):
    report, out = bench_json([str(files / "dyn.plan"), "--no-data-transfers", *FAST], tmp_path, capsys)
    check_report(report, [2])
    assert report["settings"]["data_transfers"] is False
    assert report["h2d_ms"] is None and report["d2h_ms"] is None
    assert "no data transfers" in out


def test_no_cuda_graph_is_accepted(files, tmp_path, capsys):
    report, _ = bench_json([str(files / "dyn.plan"), "--no-cuda-graph", *FAST], tmp_path, capsys)
    check_report(report, [2])
    assert report["settings"]["use_cuda_graph"] is False


def test_the_python_api(files):
    engine = Engine.load(str(files / "dyn.plan"))
    seen = []
    result = run_benchmark(engine, {"x": (4, 3)}, warmup=0, iterations=3, duration=0, streams=2,
                           progress=seen.append)
    assert isinstance(result, BenchResult)
    assert result.queries == 6 and len(result.latency_ms) == 6 and len(result.h2d_ms) == 6
    assert result.batch == 4 and result.threads == 2
    assert seen and all(text.startswith("bench:") for text in seen)
    assert result.as_json()["queries"] == 6
    assert not [t for t in threading.enumerate() if t.name.startswith("plugrt-bench")]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("flag, shown", [([], True), (["--no-progress"], False)])
def test_the_progress_line_goes_to_a_terminal(files, monkeypatch, capsys, flag, shown):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["bench", str(files / "dyn.plan"), "--warmup", "0", "--iterations", "2", "--duration", "0", *flag]
    assert main(argv) == 0
    assert ("\rbench:" in terminal.getvalue()) == shown, terminal.getvalue()


def test_a_duration_runs_past_the_iterations(files):
    engine = Engine.load(str(files / "dyn.plan"))
    result = run_benchmark(engine, warmup=0, iterations=1, duration=0.05)
    assert result.walltime_s >= 0.05 and result.queries >= 1


def test_random_feeds_are_never_zero(files):
    engine = Engine.load(str(files / "dyn.plan"))
    feeds = random_feeds(engine, {"x": (3, 3)})
    assert feeds["x"].shape == (3, 3) and feeds["x"].dtype == np.float32 and np.all(feeds["x"] != 0)


def test_run_benchmark_checks_its_settings(files):
    engine = Engine.load(str(files / "dyn.plan"))
    for kwargs in ({"iterations": 0}, {"streams": 0}, {"warmup": -1}, {"duration": float("nan")}, {"streams": 1000}):
        with pytest.raises(PlugrtError):
            run_benchmark(engine, **kwargs)
    with pytest.raises(PlugrtError, match="outside the engine's profile"):
        run_benchmark(engine, {"x": (9, 3)})


@pytest.mark.parametrize("argv, names", [
    (["--shapes", "x3x3"], ["--shapes", "NAME:DxDx"]),
    (["--shapes", "x:3xa"], ["--shapes"]),
    (["--shapes", "y:3x3"], ["--shapes", "'y'", "the inputs are 'x'"]),
    (["--shapes", "x:9x3"], ["--shapes x:9x3", "profile", "--max-shapes"]),
    (["--shapes", "x:3"], ["--shapes x:3", "profile"]),
    (["--iterations", "ten"], ["--iterations", "whole number"]),
    (["--iterations", "0"], ["--iterations", ">= 1"]),
    (["--warmup", "-1"], ["--warmup", ">= 0"]),
    (["--streams", "0"], ["--streams", ">= 1"]),
    (["--duration", "nan"], ["--duration", "finite"]),
    (["--duration", "soon"], ["--duration", "seconds"]),
    (["--no-fusion", "--opt-shapes", "x:2x3"], ["--opt-shapes", "--no-fusion", "plan"]),
])
def test_bench_errors_on_a_plan(files, capsys, argv, names):
    code = main(["bench", str(files / "dyn.plan"), *argv, "--no-progress"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("plugrt: error:")]
    assert code == 2 and len(errors) == 1, err
    assert all(name in errors[0] for name in names), err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, names", [
    (["--shapes", "y:3x3"], ["--shapes", "'y'", "the inputs are 'x'"]),
    (["--shapes", "x:3x4"], ["--shapes x:3x4", "'x'"]),
])
def test_bench_errors_on_a_model(files, capsys, argv, names):
    code = main(["bench", str(files / "dyn.onnx"), *argv, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and all(name in err for name in names) and "Traceback" not in err, err


def test_bench_json_never_writes_over_an_input(files, tmp_path, capsys):
    plan = tmp_path / "dyn.plan"
    plan.write_bytes((files / "dyn.plan").read_bytes())
    before = plan.read_bytes()
    assert main(["bench", str(plan), "--json", str(plan), "--force", *FAST]) == 2
    assert "destroy that input" in capsys.readouterr().err
    other = tmp_path / "model.onnx"
    other.write_bytes((files / "relu.onnx").read_bytes())
    assert main(["bench", str(plan), "--json", str(other), *FAST]) == 2
    assert "--force" in capsys.readouterr().err
    assert plan.read_bytes() == before and other.read_bytes() == (files / "relu.onnx").read_bytes()


def test_bench_refuses_what_is_neither_plan_nor_model(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", x=np.ones(3))
    assert main(["bench", str(tmp_path / "in.npz"), *FAST]) == 2
    assert "name a plan file or an .onnx model" in capsys.readouterr().err


# ---------------------------------------------------------------------- --dump-profile


def two_layer_model():
    """Softmax(x @ w): two layers fusion leaves apart."""
    w = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
                              "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dump_profile_times_every_layer(tmp_path, capsys):
    model = tmp_path / "two.onnx"
    model.write_bytes(two_layer_model().SerializeToString())
    report, out = bench_json([str(model), "--dump-profile", "--optimization-level", "0", *FAST], tmp_path, capsys)
    profile = report["profile"]
    engine_layers = [layer["name"] for layer in profile["layers"]]
    assert len(engine_layers) == 2 and len(set(engine_layers)) == 2
    assert [layer["op"] for layer in profile["layers"]] == ["MatMul", "Softmax"]
    for layer in profile["layers"]:
        assert layer["kernels"] >= 1 and layer["blocks"] >= layer["kernels"] and layer["threads"] >= layer["blocks"]
        assert layer["median_ms"] > 0 and layer["tactic"] and layer["plugin"]
    assert sum(layer["percent"] for layer in profile["layers"]) == pytest.approx(100.0)
    assert profile["total_median_ms"] == pytest.approx(sum(layer["median_ms"] for layer in profile["layers"]))
    assert profile["runs"] == 20
    assert "per-layer profile" in out and engine_layers[0] in out


def test_profile_layers_from_python(files):
    from plugrt.layer_profile import profile_layers

    engine = Engine.load(str(files / "dyn.plan"))
    rows = profile_layers(engine, random_feeds(engine, {"x": (3, 3)}), runs=2)
    assert [row.name for row in rows] == [engine.graph.nodes[layer.node_index].name for layer in engine.layers]
    assert all(len(row.times_ms) == 2 and row.median_ms > 0 for row in rows)
    with pytest.raises(PlugrtError, match="profile runs"):
        profile_layers(engine, random_feeds(engine), runs=0)


# --------------------------------------------------------------------------- several GPUs (issue 21)


def test_run_benchmark_on_listed_devices_reports_each(files):
    """``devices``: streams contexts on each listed device; each device's identity and share
    of the queries is reported (the simulator has one device, 0)."""
    engine = Engine.load(str(files / "dyn.plan"))
    result = run_benchmark(engine, {"x": (3, 3)}, warmup=0, iterations=2, duration=0, streams=2, devices=[0])
    assert len(result.devices) == 1 and result.devices[0]["id"] == 0 and result.devices[0]["contexts"] == 2
    assert result.devices[0]["queries"] == result.queries == 4
    assert result.devices[0]["inferences_per_s"] == pytest.approx(result.inferences_per_s)
    report = result.as_json()
    assert report["devices"] == result.devices and isinstance(report["kernels_compiled"], int)


@pytest.mark.parametrize("devices, words", [
    ([0, 1], ["device 1", "sees"]), ([0, 0], ["device 0 is listed twice"]), ([], ["no device"]),
    ([-1], ["device -1", ">= 0"]), ([True], ["device True"]),
])
def test_run_benchmark_refuses_devices_it_cannot_use(files, devices, words):
    engine = Engine.load(str(files / "dyn.plan"))
    with pytest.raises(PlugrtError) as error:
        run_benchmark(engine, warmup=0, iterations=1, duration=0, devices=devices)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_bench_devices_on_the_command_line(files, tmp_path, capsys):
    report, out = bench_json([str(files / "dyn.plan"), "--devices", "0", "--streams", "2", *FAST], tmp_path, capsys)
    assert [d["id"] for d in report["devices"]] == [0] and report["devices"][0]["queries"] == report["queries"]
    assert "device 0 (" in out and "2 context(s)" in out
    for argv, words in ((["--devices", "0,x"], ["--devices '0,x'", "'x'", "not a device id"]),
                        (["--devices", "0,1"], ["--devices 0,1", "device 1", "CUDA_VISIBLE_DEVICES"]),
                        (["--devices", "0", "--server", "http://127.0.0.1:1"], ["--devices and --server"])):
        code = main(["bench", str(files / "dyn.plan"), *argv, "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and all(word in err for word in words) and "Traceback" not in err, (argv, err)


def test_an_engine_uploads_its_weights_once_per_device(monkeypatch, rng):
    """A context belongs to the device current where it is made: another device gets its
    own copy of the weights, the same device shares one."""
    import plugrt.device

    w = rng.standard_normal((3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(w, "w")])
    from plugrt.engine import Builder, BuilderConfig

    engine = Builder().build_engine(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                    BuilderConfig(progress=False))
    first = engine.device_weights()
    monkeypatch.setattr(plugrt.device, "current_device_id", lambda: 1)
    other = engine.device_weights()
    assert other is not first and other is engine.device_weights()
    np.testing.assert_array_equal(other["w"].copy_to_host(), first["w"].copy_to_host())
    monkeypatch.setattr(plugrt.device, "current_device_id", lambda: 0)
    assert engine.device_weights() is first


def test_a_context_makes_its_device_current_in_every_calling_thread(monkeypatch):
    """Where the process sees several GPUs, every call makes the context's device current
    in the calling thread (the thread may have moved to another device in between); with
    one GPU only the first call of a thread does."""
    import plugrt.device

    calls = []
    monkeypatch.setattr(plugrt.device, "simulated", lambda: False)
    monkeypatch.setattr(plugrt.device, "make_current", calls.append)
    for count, device, expected in ((2, 1, [1, 1]), (2, 0, [0, 0]), (1, 0, [0])):
        monkeypatch.setattr(plugrt.device, "device_count", lambda count=count: count)
        calls.clear()

        def twice():
            plugrt.device.ensure_current(device)
            plugrt.device.ensure_current(device)

        thread = threading.Thread(target=twice)
        thread.start()
        thread.join()
        assert calls == expected, (count, device, calls)
