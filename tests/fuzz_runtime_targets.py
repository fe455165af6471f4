"""Runtime feeds of every wrong kind, for tests/test_runtime_feeds.py (run in the fuzz worker).

One engine per worker: ``y = Relu(x) + c`` with ``x`` float32 ``[N, 3]`` (N from 1 to 4,
opt 2). Each case names a feed; the target runs it through ``execute`` (and the async and
device-output paths), which must return the right answer or raise a PlugrtError; then the
same context must still give the right answer for a good feed.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

C = np.array([0.5, -1.0, 2.0], np.float32)


@functools.lru_cache(maxsize=None)
def context():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "c"], ["y"])]
    graph = helper.make_graph(nodes, "feeds", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(C, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", min=(1, 3), opt=(2, 3), max=(4, 3)))
    return Builder().build_engine(model, config).create_execution_context()


def want(x):
    return np.maximum(x, 0) + C


def good(n=2):
    return np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)


#: name -> (feeds, whether plugrt must accept them). Accepted feeds must give the right answer.
def cases():
    x = good()
    strided = np.random.default_rng(9).standard_normal((4, 6)).astype(np.float32)[::2, ::2]
    device_strided = cuda.to_device(np.random.default_rng(8).standard_normal((3, 6)).astype(np.float32))[:, ::2]
    return {
        "good": ({"x": x}, True),
        "list of rows": ({"x": x.tolist()}, False),  # a list is float64: refused by dtype
        "float32 list": ({"x": np.asarray(x.tolist(), np.float32)}, True),
        "feeds as a list": ([x], False),
        "feeds as None": (None, False),
        "feeds as a tuple": ((("x", x),), False),
        "feeds as a string": ("x", False),
        "value None": ({"x": None}, False),
        "ragged list": ({"x": [[1.0, 2.0, 3.0], [1.0]]}, False),
        "object array": ({"x": np.array([object()] * 3).reshape(1, 3)}, False),
        "string array": ({"x": np.array([["a", "b", "c"]])}, False),
        "float64": ({"x": x.astype(np.float64)}, False),
        "int32": ({"x": x.astype(np.int32)}, False),
        "complex": ({"x": x.astype(np.complex64)}, False),
        "rank 1": ({"x": x.ravel()}, False),
        "rank 3": ({"x": x[None]}, False),
        "wrong fixed dim": ({"x": np.zeros((2, 4), np.float32)}, False),
        "batch over max": ({"x": np.zeros((5, 3), np.float32)}, False),
        "batch zero": ({"x": np.zeros((0, 3), np.float32)}, False),
        "scalar": ({"x": np.float32(1.0)}, False),
        "unknown name": ({"x": x, "z": x}, False),
        "missing name": ({}, False),
        "int key": ({0: x}, False),
        "bytes": ({"x": b"\x00" * 24}, False),
        "a generator": ({"x": (v for v in range(3))}, False),
        "a dict value": ({"x": {"a": 1}}, False),
        "strided host array": ({"x": strided}, True),
        "fortran order": ({"x": np.asfortranarray(good(3))}, True),
        "batch 4": ({"x": good(4)}, True),
        "device array": ({"x": cuda.to_device(good(3))}, True),
        "strided device array": ({"x": device_strided}, True),
        "device array of the wrong dtype": ({"x": cuda.to_device(x.astype(np.float64))}, False),
    }


def _host_feed(feeds):
    value = feeds["x"]
    return value.copy_to_host() if hasattr(value, "copy_to_host") else np.asarray(value, np.float32)


def run_case(payload: bytes):
    name = payload.decode()
    feeds, accepted = cases()[name]
    ctx = context()
    from plugrt import PlugrtError

    for path in ("execute", "execute_async", "device_outputs"):
        try:
            if path == "execute":
                got = ctx.execute(feeds)["y"]
            elif path == "execute_async":
                out = ctx.execute_async(feeds)
                ctx.stream.synchronize()
                got = out["y"].copy_to_host()
            else:
                got = ctx.execute(feeds, device_outputs=True)["y"].copy_to_host()
        except PlugrtError:
            if accepted:
                return f"{name!r} ({path}) was refused but is a valid feed"
        else:
            if not accepted:
                return f"{name!r} ({path}) was accepted"
            expected = want(_host_feed(feeds))
            if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-6, atol=1e-6):
                return f"{name!r} ({path}) gave a wrong answer"
        x = good(3)
        if not np.allclose(ctx.execute({"x": x})["y"], want(x), rtol=1e-6, atol=1e-6):
            return f"after {name!r} ({path}) the context gives a wrong answer for a good feed"
    return None


def bad_stream(payload: bytes):
    """A stream that is none: a clean error, and the context still works."""
    ctx = context()
    from plugrt import PlugrtError

    try:
        ctx.execute_async({"x": good()}, stream=payload.decode())
        return "a string was taken as a stream"
    except PlugrtError:
        pass
    x = good(3)
    return None if np.allclose(ctx.execute({"x": x})["y"], want(x), rtol=1e-6) else "wrong answer after a bad stream"
