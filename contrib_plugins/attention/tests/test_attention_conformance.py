"""The plugin against plugrt's conformance kit, its registration, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt import ShapeError, UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.device import describe
from plugrt.testing import ConformanceError, ConformanceReport, conformance_cases, single_node_model
from plugrt_contrib_attention.op import MultiHeadAttention
from plugrt_contrib_attention.standard import StandardAttention


#: The plugin's examples (both ops'), each its own test (the kit's cases of one example share
#: its runs; one test of them all would be the suite's longest, on one core).
EXAMPLES = len(MultiHeadAttention().examples()) + len(StandardAttention().examples())


@pytest.mark.parametrize("index", range(EXAMPLES))
def test_conformance(index):
    cases = conformance_cases("contrib-attention")
    labels = list(dict.fromkeys(case.example for case in cases if case.example))
    assert len(labels) == EXAMPLES
    chosen = [case for case in cases if case.example == labels[index] or (not case.example and index == 0)]
    report = ConformanceReport(["contrib-attention"], 0, describe())
    report.results = [case.run() for case in chosen]
    if not report.ok:
        raise ConformanceError(report.failures, report)
    assert {r.check for r in report.results} >= {"infer", "tactics", "guards", "plan"}


def load(attrs=None, **feeds):
    model = single_node_model("MultiHeadAttention", feeds, attrs, domain="plugrt.contrib", opset=1)
    return import_model(model, registry=default_registry())


def test_bad_inputs_are_refused_naming_the_node():
    f32 = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="test_multiheadattention.*head size 4 differs from K's 5"):
        load(q=f32, k=np.zeros((1, 2, 3, 5), np.float32), v=f32)
    with pytest.raises(ShapeError, match="does not broadcast to"):
        load(q=f32, k=f32, v=f32, mask=np.zeros((2, 3), np.float32))
    with pytest.raises(UnsupportedError, match=r"test_multiheadattention.*rank 3.*\[batch, heads, sequence"):
        load(q=f32[0], k=f32[0], v=f32[0])
    with pytest.raises(UnsupportedError, match="K of dtype float16.*cast"):
        load(q=f32, k=f32.astype(np.float16), v=f32)


def test_bad_packing_is_refused():
    packed = np.zeros((1, 3, 24), np.float32)
    heads = {"num_heads": 2, "kv_num_heads": 2}
    with pytest.raises(UnsupportedError, match=r"packed Q, K and V in layout bhsd.*\(bsh\)"):
        load({"packed": [8, 8, 8]}, q=np.zeros((1, 2, 3, 4), np.float32), k=np.zeros((1, 2, 3, 4), np.float32),
             v=np.zeros((1, 2, 3, 4), np.float32))
    with pytest.raises(UnsupportedError, match="packed K of width 16, not nq \\+ nk \\+ nv = 24"):
        load({"layout": "bsh,bsh,bsh,bsh", "packed": [8, 8, 8], **heads}, q=packed, k=packed[..., :16], v=packed)
    with pytest.raises(UnsupportedError, match=r"packed=\[8, 0, 16\]"):
        load({"layout": "bsh,bsh,bsh,bsh", "packed": [8, 0, 16], **heads}, q=packed, k=packed, v=packed)
    with pytest.raises(ShapeError, match="head size 4 differs from K's 2"):
        load({"layout": "bsh,bsh,bsh,bsh", "packed": [8, 4, 12], **heads}, q=packed, k=packed, v=packed)
