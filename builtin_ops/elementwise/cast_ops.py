"""Cast and CastLike between the dtypes NumPy handles natively (bool, integers, float16/32/64).

Their CUDA tactic is the toolkit's pointwise kernel with Cast's device function
(:func:`.device_functions.cast`), which converts explicitly, so the value stays exact
inside a fused chain too.
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import CONVERT, POINTWISE, REQUIRED, Attr, OpPlugin, TensorInfo, pointwise_tactics

from plugrt_builtin_ops.common.dtypes import ONNX_DTYPES, dtype_name

from . import device_functions
from .ops import require_inputs


def cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """ONNX Cast between NumPy dtypes: float to int truncates toward zero, int to int
    wraps (two's complement), to bool maps nonzero (NaN included) to True. Out-of-range
    float to int is undefined by the spec; NumPy's result is returned."""
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dtype)


class CastBase(OpPlugin):
    """Cast and CastLike: ``saturate`` and ``round_mode`` only change float8 targets,
    which (like string, bfloat16, int4/int2 and float4/6) are declared unsupported."""

    groups = frozenset({POINTWISE})
    attributes = (Attr("saturate", "int", 1), Attr("round_mode", "string", "up"))

    def check(self, node, inputs):
        require_inputs(self, node, inputs)
        mode = node.attrs["round_mode"]
        if mode not in ("up", "down", "nearest"):
            raise self.unsupported(node, f"round_mode={mode!r}", "use 'up', 'down' or 'nearest'")


class Cast(CastBase):
    """Cast to the dtype ``to`` (a TensorProto.DataType value)."""

    op_type = "Cast"
    since_opset = 6
    attributes = (Attr("to", "int", REQUIRED),) + CastBase.attributes
    groups = frozenset({POINTWISE, CONVERT})

    def conversion(self, dtype):
        codes = [code for code, known in ONNX_DTYPES.items() if known == np.dtype(dtype)]
        return {"to": codes[0]} if codes else None

    def check(self, node, inputs):
        super().check(node, inputs)
        to = node.attrs["to"]
        if to not in ONNX_DTYPES:
            names = ", ".join(dtype_name(t) for t in sorted(ONNX_DTYPES))
            raise self.unsupported(node, f"casting to {dtype_name(to)}", f"supported targets: {names}")

    def infer(self, node, inputs):
        return [TensorInfo(ONNX_DTYPES[node.attrs["to"]], inputs[0].shape)]

    def reference(self, node, inputs):
        return [cast(inputs[0], ONNX_DTYPES[node.attrs["to"]])]

    def forwards(self, node, inputs):
        return 0 if ONNX_DTYPES[node.attrs["to"]] == inputs[0].dtype else None

    def pointwise(self, node, inputs):
        return device_functions.cast(inputs[0].dtype, ONNX_DTYPES[node.attrs["to"]])


class CastLike(CastBase):
    """CastLike(input, target_type): Cast to target_type's dtype."""

    op_type = "CastLike"
    since_opset = 15
    inputs = (2, 2)

    def infer(self, node, inputs):
        return [TensorInfo(inputs[1].dtype, inputs[0].shape)]

    def reference(self, node, inputs):
        return [cast(inputs[0], inputs[1].dtype)]

    def forwards(self, node, inputs):
        return 0 if inputs[1].dtype == inputs[0].dtype else None

    def tactics(self, node, inputs, outputs):
        # target_type only lends its dtype: the kernel must not read (or broadcast) it.
        fn = device_functions.cast(inputs[0].dtype, inputs[1].dtype)
        return pointwise_tactics(fn, [inputs[0], None], outputs[0])


OPS = (Cast, CastLike)
