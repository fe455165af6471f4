"""ONNX's dtype codes (``TensorProto.DataType``) for the dtypes NumPy handles natively:
what an op's dtype attribute names (Cast's ``to``, EyeLike's ``dtype``).
"""

from __future__ import annotations

import numpy as np

#: TensorProto.DataType values of the dtypes NumPy handles natively.
ONNX_DTYPES = {
    1: np.dtype("float32"), 2: np.dtype("uint8"), 3: np.dtype("int8"), 4: np.dtype("uint16"),
    5: np.dtype("int16"), 6: np.dtype("int32"), 7: np.dtype("int64"), 9: np.dtype(bool),
    10: np.dtype("float16"), 11: np.dtype("float64"), 12: np.dtype("uint32"), 13: np.dtype("uint64"),
}


def dtype_name(code: int) -> str:
    """The ONNX name of a dtype code (``FLOAT``, ``BFLOAT16``), or the code when unknown."""
    try:
        from onnx import TensorProto

        return TensorProto.DataType.Name(code)
    except (ImportError, ValueError):
        return str(code)
