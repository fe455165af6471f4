"""The KServe v2 codec (JSON and Triton's binary tensors) and the request batcher, without a
server: round trips, every refusal naming what to fix, and batches split back exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plugrt.serving import kserve
from plugrt.serving.batching import Batcher, batch_symbol, max_batch
from serving_helpers import tiny_plan

INPUTS = {"x": (np.dtype(np.float32), 2), "ids": (np.dtype(np.int64), 1)}


@pytest.mark.parametrize("binary", [False, True])
def test_requests_and_responses_round_trip(rng, binary):
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32), "ids": np.array([5, -2, 7], np.int64)}
    payload, length = kserve.encode_request(feeds, binary)
    assert (length is not None) == binary
    body, blob = kserve.parse(payload, None if length is None else str(length))
    decoded, wanted = kserve.decode_request(body, INPUTS, blob)
    assert wanted is None and all(np.array_equal(decoded[n], feeds[n]) and decoded[n].dtype == feeds[n].dtype
                                  for n in feeds)
    outputs = {"y": rng.standard_normal((3, 2)).astype(np.float16), "mask": np.array([True, False])}
    payload, length = kserve.encode_response("m", outputs, None, "r1", kserve.binary_outputs(body))
    got = kserve.decode_response(payload, None if length is None else str(length))
    assert all(np.array_equal(got[n], outputs[n]) and got[n].dtype == outputs[n].dtype for n in outputs)
    assert json.loads(payload[:length] if length else payload)["id"] == "r1"


@pytest.mark.parametrize("body, binary, message", [
    ({"inputs": "x"}, b"", '"inputs": a list'),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}, b"", "input 'ids' is missing"),
    ({"inputs": [{"name": "z", "shape": [1], "datatype": "FP32", "data": [1]}]}, b"", "no such input; its inputs"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]}, b"",
     "datatype 'FP64', the model takes 'FP32'"),
    ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}, b"", "must be 2 non-negative ints"),
    ({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2]}]}, b"", "2 values for shape"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": ["a", "b"]}]}, b"", "not FP32 numbers"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]},
     b"\0" * 8, "runs past the body's binary part"),
    ({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 6}}]},
     b"\0" * 8, "no whole number of FP32 values"),
])
def test_bad_requests_say_what_is_wrong(body, binary, message):
    with pytest.raises(kserve.RequestError, match=message):
        kserve.decode_request(body, INPUTS, binary)


def test_bad_framing_is_refused():
    with pytest.raises(kserve.RequestError, match="not JSON"):
        kserve.parse(b"{nope")
    with pytest.raises(kserve.RequestError, match="outside the body's 2 bytes"):
        kserve.parse(b"{}", "9")
    with pytest.raises(kserve.RequestError, match="output 'q': the model has no such output"):
        kserve.encode_response("m", {"y": np.zeros(1, np.float32)}, ["q"])


def test_the_batcher_splits_batches_back_and_isolates_a_bad_request(tmp_path, rng):
    from plugrt.engine import Engine

    plan, model = tiny_plan(tmp_path)
    engine = Engine.load(plan)
    assert batch_symbol(engine) == "batch" and max_batch(engine) == 8
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with engine.create_execution_context() as context:
        batcher = Batcher(context)
        requests = [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (1, 3, 2, 4, 1)]
        requests.insert(2, {"x": rng.standard_normal((1, 5)).astype(np.float32)})  # the wrong width
        results = batcher.run(requests)
        assert "dim 1 must be 4, got 5" in str(results[2])
        for request, result in zip(requests, results):
            if request["x"].shape[1] == 4:
                np.testing.assert_allclose(result["y"], session.run(None, request)[0], rtol=1e-5, atol=1e-6)
        # 11 rows of width 4 in chunks of at most 8 (two runs), the odd one alone
        assert batcher.stats.inference_count == 6 and batcher.stats.execution_count == 3, batcher.stats
