"""Execution contexts as a server uses them: CUDA graphs (on a GPU), bindings moved to the
caller's memory, the caller's streams, output buffers, threads (a context pool, and a
context used from two threads at once), closing, and runs that do not grow memory.

In the simulator graphs are skipped and the same code runs otherwise; the tests marked
``gpu`` check what only a GPU has (graph replay, in-place rebinding, capture fallback).
"""

from __future__ import annotations

import logging
import threading
import tracemalloc

import numpy as np
import pytest
from numba import cuda
from onnx import TensorProto, helper, numpy_helper

from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig, ContextPool, OptimizationProfile
from plugrt.errors import BindingError, PlugrtError

gpu = pytest.mark.skipif(simulated(), reason="CUDA graphs and raw launches need a GPU")

W = np.array([0.5, -1.0, 2.0], np.float32)
B = np.array([0.1, -0.2, 0.3], np.float32)


def _model():
    """``y = Relu(x * W + b) * 2``, ``z = x - 1``: two outputs, x float32 [N, 3]."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"]),
             helper.make_node("Sub", ["x", "one"], ["z"])]
    inits = [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    graph = helper.make_graph(nodes, "ctx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _want(x):
    x64 = x.astype(np.float64)
    return {"y": np.maximum(x64 * W + B, 0) * 2, "z": x64 - 1}


@pytest.fixture(scope="module")
def engine():
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", min=(1, 3), opt=(2, 3), max=(4, 3)))
    return Builder().build_engine(_model(), config)


def _x(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 3)).astype(np.float32)


def _check(got, x):
    for name, want in _want(x).items():
        value = got[name]
        value = value.copy_to_host() if hasattr(value, "copy_to_host") else value
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_repeated_runs_across_shapes_host_and_device_feeds(engine):
    """Runs 2.. of a shape replay a graph on a GPU; every run is right, whichever feeds."""
    with engine.create_execution_context() as ctx:
        for step in range(6):
            n = (2, 3, 2, 1, 2, 3)[step]
            x = _x(n, step)
            _check(ctx.execute({"x": x}), x)
            feed = cuda.to_device(x)  # a new device buffer each time: bound in place on a GPU
            out = ctx.execute_async({"x": feed})
            ctx.stream.synchronize()
            _check(out, x)


def test_outputs_written_into_callers_buffers(engine):
    with engine.create_execution_context() as ctx:
        for seed in range(4):  # new output buffers every run: rebound each time on a GPU
            x = _x(3, seed)
            outs = {"y": cuda.device_array((3, 3), np.float32), "z": cuda.device_array((3, 3), np.float32)}
            got = ctx.execute_async({"x": cuda.to_device(x)}, outputs=outs)
            ctx.stream.synchronize()
            assert got["y"] is outs["y"] and got["z"] is outs["z"]
            _check(got, x)
        x = _x(2, 9)  # back to the context's own buffers: the last run's buffers stay untouched
        kept = outs["y"].copy_to_host()
        _check(ctx.execute({"x": x}), x)
        np.testing.assert_array_equal(outs["y"].copy_to_host(), kept)


@pytest.mark.parametrize("outputs, message", [
    ({"nope": None}, "no such output"),
    ({"y": np.zeros((2, 2), np.float32)}, "expected a device array"),
    ({"y": "buffer"}, "expected a device array"),
])
def test_bad_output_buffers_are_binding_errors(engine, outputs, message):
    with engine.create_execution_context() as ctx:
        with pytest.raises(BindingError, match=message):
            ctx.execute_async({"x": _x(2, 0)}, outputs=outputs)
        x = _x(2, 1)
        _check(ctx.execute({"x": x}), x)


def test_wrong_shape_output_buffer_names_the_binding(engine):
    with engine.create_execution_context() as ctx:
        with pytest.raises(BindingError, match=r"output binding 'y'.*float32\[2, 3\]"):
            ctx.execute_async({"x": _x(2, 0)}, outputs={"y": cuda.device_array((3, 3), np.float32)})


def test_caller_streams(engine):
    """A Numba stream, the default stream (0), a raw handle; runs on alternating streams
    stay ordered (each waits for the last on the device)."""
    with engine.create_execution_context() as ctx:
        streams = [cuda.stream(), cuda.stream(), 0]
        outs = []
        for i in range(6):
            x = _x(2, 20 + i)
            outs.append((x, ctx.execute_async({"x": x}, stream=streams[i % 3])))
        cuda.synchronize()
        for x, out in outs:
            _check(out, x)
        if not simulated():
            handle = int(cuda.stream().handle)
            x = _x(2, 30)
            out = ctx.execute_async({"x": x}, stream=handle)
            cuda.synchronize()
            _check(out, x)


@pytest.mark.parametrize("stream", ["s", 1.5, object()])
def test_a_stream_of_the_wrong_kind_is_a_binding_error(engine, stream):
    with engine.create_execution_context() as ctx:
        with pytest.raises(BindingError, match="stream"):
            ctx.execute_async({"x": _x(2, 0)}, stream=stream)


def test_a_context_busy_on_another_thread_refuses_instead_of_corrupting(engine):
    ctx = engine.create_execution_context()
    entered, release = threading.Event(), threading.Event()

    class SlowFeeds(dict):
        """Feeds whose reading blocks: the first thread is inside execute()."""

        def items(self):
            entered.set()
            release.wait(10)
            return super().items()

    first = threading.Thread(target=lambda: ctx.execute(SlowFeeds(x=_x(2, 0))))
    first.start()
    assert entered.wait(10)
    try:
        with pytest.raises(PlugrtError, match="another thread"):
            ctx.execute({"x": _x(2, 1)})
    finally:
        release.set()
        first.join(30)
    x = _x(2, 2)
    _check(ctx.execute({"x": x}), x)
    ctx.close()


def test_pool_threads_give_the_serial_results_bit_for_bit(engine):
    threads, requests = 8, 3 if simulated() else 200
    feeds = [_x(1 + (i % 4), 100 + i) for i in range(threads * requests)]
    with engine.create_execution_context() as ctx:
        serial = [ctx.execute({"x": x}) for x in feeds]
    results: list = [None] * len(feeds)
    errors: list = []
    with ContextPool(engine, size=3) as pool:
        def worker(first):
            try:
                for i in range(first, len(feeds), threads):
                    results[i] = pool.execute({"x": feeds[i]})
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(600)
    assert not errors, errors
    for got, want in zip(results, serial):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_pool_argument_and_closed_errors(engine):
    with pytest.raises(PlugrtError, match="at least one"):
        ContextPool(engine, size=0)
    pool = ContextPool(engine, size=1)
    with pool.context() as ctx:
        with pytest.raises(PlugrtError, match="no execution context came free"):
            with pool.context(timeout=0.01):
                pass
        x = _x(2, 3)
        _check(ctx.execute({"x": x}), x)
    pool.close()
    with pytest.raises(PlugrtError, match="closed"):
        pool.execute({"x": _x(2, 0)})


def test_closed_context_refuses_and_releases(engine):
    ctx = engine.create_execution_context()
    ctx.execute({"x": _x(2, 0)})
    ctx.close()
    ctx.close()  # twice is fine
    assert ctx.arena is None and not ctx._specs
    with pytest.raises(PlugrtError, match="closed"):
        ctx.execute({"x": _x(2, 0)})
    with engine:
        with engine.create_execution_context() as fresh:
            x = _x(4, 1)
            _check(fresh.execute({"x": x}), x)
    with engine.create_execution_context() as again:  # weights uploaded again after the engine closed
        x = _x(1, 2)
        _check(again.execute({"x": x}), x)


def test_many_runs_do_not_grow_host_memory(engine):
    runs = 200 if simulated() else 3000
    with engine.create_execution_context() as ctx:
        x = _x(2, 5)
        feed = cuda.to_device(x)
        out = {"y": cuda.device_array((2, 3), np.float32), "z": cuda.device_array((2, 3), np.float32)}
        for _ in range(20):
            ctx.execute_async({"x": feed}, outputs=out)
        ctx.stream.synchronize()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(runs):
            ctx.execute_async({"x": feed}, outputs=out)
            ctx.execute({"x": x})
        ctx.stream.synchronize()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert grown < 256 * 1024, f"{runs} runs grew host memory by {grown} bytes"
        _check(out, x)


def test_contexts_keep_a_bounded_number_of_shapes(engine, caplog):
    with engine.create_execution_context(max_graphs=2, max_specializations=2) as ctx:
        for n in (1, 2, 3, 4, 1, 2):
            x = _x(n, n)
            _check(ctx.execute({"x": x}), x)
            _check(ctx.execute({"x": x}), x)
        assert len(ctx._specs) == 2
    warned = [r.getMessage() for r in caplog.records if "input shapes seen" in r.getMessage()]
    assert len(warned) == 1 and "max_specializations" in warned[0], warned


# ---------------------------------------------------------------------- GPU only


@gpu
def test_graphs_replay_and_are_bounded_with_a_warning(engine, caplog):
    with engine.create_execution_context(max_graphs=2) as ctx:
        with caplog.at_level(logging.WARNING, logger="plugrt.engine"):
            for n in (1, 2, 3, 1, 2, 3):
                x = _x(n, n)
                for _ in range(3):
                    _check(ctx.execute({"x": x}), x)
                assert ctx.current.cuda_graph is not None
        graphs = [s for s in ctx._specs.values() if s.cuda_graph is not None]
        assert len(graphs) <= 2
        assert "CUDA graphs" in caplog.text


@gpu
def test_rebinding_patches_the_graph_instead_of_capturing_again(engine):
    with engine.create_execution_context() as ctx:
        x = _x(2, 0)
        ctx.execute({"x": x})
        ctx.execute({"x": x})
        graph = ctx.current.cuda_graph
        assert graph is not None and graph.patchable
        for seed in range(5):
            x = _x(2, seed)
            outs = {"y": cuda.device_array((2, 3), np.float32), "z": cuda.device_array((2, 3), np.float32)}
            feed = cuda.to_device(x)
            got = ctx.execute_async({"x": feed}, outputs=outs)
            ctx.stream.synchronize()
            _check(got, x)
            assert ctx.current.cuda_graph is graph  # patched, not captured again
            assert ctx.current.bound["x"] == feed.__cuda_array_interface__["data"][0]
            assert ctx.current.bound["y"] == outs["y"].__cuda_array_interface__["data"][0]


@gpu
def test_capture_failure_falls_back_to_direct_launches(engine, monkeypatch, caplog):
    from plugrt.engine import graphs

    def broken(*args, **kwargs):
        raise PlugrtError("cuStreamBeginCapture failed: simulated")

    monkeypatch.setattr(graphs.LaunchGraph, "__init__", broken)
    with engine.create_execution_context() as ctx, caplog.at_level(logging.WARNING, logger="plugrt.engine"):
        for seed in range(3):
            x = _x(2, seed)
            _check(ctx.execute({"x": x}), x)
        assert ctx.current.cuda_graph is None
        assert "capture failed" in caplog.text


@gpu
def test_no_cuda_graph_means_direct_launches(engine):
    with engine.create_execution_context(use_cuda_graph=False) as ctx:
        for seed in range(3):
            x = _x(2, seed)
            _check(ctx.execute({"x": x}), x)
        assert ctx.current.cuda_graph is None


@gpu
def test_torch_and_cupy_streams_and_tensors(engine):
    torch = pytest.importorskip("torch")
    with engine.create_execution_context() as ctx:
        stream = torch.cuda.Stream()
        x = _x(3, 7)
        feed = torch.from_numpy(x).cuda()
        for _ in range(3):
            out = ctx.execute_async({"x": feed}, stream=stream)
        stream.synchronize()
        _check(out, x)
    cupy = pytest.importorskip("cupy")
    with engine.create_execution_context() as ctx:
        stream = cupy.cuda.Stream(non_blocking=True)
        x = _x(2, 8)
        feed = cupy.asarray(x)
        outs = {"y": cupy.empty((2, 3), np.float32), "z": cupy.empty((2, 3), np.float32)}
        for _ in range(3):
            ctx.execute_async({"x": feed}, stream=stream, outputs=outs)
        stream.synchronize()
        _check({name: cupy.asnumpy(value) for name, value in outs.items()}, x)


def test_launch_argument_types_are_remembered_only_where_class_and_dtype_decide_them():
    """``plugrt.launcher.arg_type`` (a new shape's raw launches type every argument): NumPy
    scalars, 1-D contiguous device arrays and tuples of them are typed once per class and
    dtype; anything else (another rank, a stride, a Python int) asks Numba every time."""
    from numba import typeof, types

    from plugrt import launcher

    class Kernel:
        def __init__(self):
            self.asked = []

        def typeof_pyval(self, value):
            self.asked.append(value)
            return self.type(value)

        def type(self, value):
            if isinstance(value, tuple):
                return types.BaseTuple.from_types([self.type(item) for item in value])
            return typeof(np.asarray(value) if hasattr(value, "__cuda_array_interface__") else value)

    class DeviceArray:  # a stand-in: shape, strides, dtype and the CUDA array interface
        __cuda_array_interface__ = {}

        def __init__(self, n, dtype, stride=None):
            self.dtype = np.dtype(dtype)
            self.shape, self.strides = (n,), (stride or self.dtype.itemsize,)

        def __array__(self, dtype=None, copy=None):
            return np.zeros(self.shape, self.dtype)

    launcher._ARG_TYPES.clear()
    kernel = Kernel()
    first = [launcher.arg_type(kernel, a) for a in (np.int64(3), DeviceArray(10, np.float16),
                                                      (DeviceArray(4, np.float32), np.float32(1)))]
    again = [launcher.arg_type(kernel, a) for a in (np.int64(-7), DeviceArray(99, np.float16),
                                                      (DeviceArray(1, np.float32), np.float32(2)))]
    assert first == again and len(kernel.asked) == 3
    assert str(first[0]) == "int64" and str(first[1]) == "array(float16, 1d, C)"
    for uncached in (DeviceArray(8, np.float32, stride=8), 5, [1, 2]):
        before = len(kernel.asked)
        launcher.arg_type(kernel, uncached)
        launcher.arg_type(kernel, uncached)
        assert len(kernel.asked) == before + 2
    assert launcher.arg_type(kernel, DeviceArray(3, np.int8)) != launcher.arg_type(kernel, DeviceArray(3, np.uint8))
