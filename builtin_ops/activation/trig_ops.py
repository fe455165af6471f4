"""The trigonometric and hyperbolic ops beyond Sin and Cos: Tan, Asin, Acos, Atan (opset
7), Sinh, Cosh, Asinh, Acosh, Atanh (opset 9); float16, float32 and float64."""

from __future__ import annotations

import numpy as np

from plugrt.plugin import Example, TensorInfo

from .ops import UnaryOp


class TrigOp(UnaryOp):
    """A unary float op computing ``function`` in float64; values outside the op's domain
    give NaN (or ±inf at a pole), as NumPy's. ``x_range`` is where :meth:`examples` draws x."""

    since_opset = 9
    function = None
    x_range = (-3.0, 3.0)

    def compute(self, node, x):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self.function(x.astype(np.float64))

    def examples(self):
        ranges = {0: self.x_range}
        return [Example((TensorInfo(np.float32, (2, 5)),), ranges=ranges),
                Example((TensorInfo(np.float16, (3, 4)),), ranges=ranges, rtol=2e-3, atol=2e-3),
                Example((TensorInfo(np.float64, (7,)),), ranges=ranges)]


class Tan(TrigOp):
    op_type = "Tan"
    since_opset = 7
    function = np.tan
    x_range = (-1.2, 1.2)  # clear of the poles at ±pi/2


class Asin(TrigOp):
    op_type = "Asin"
    since_opset = 7
    function = np.arcsin
    x_range = (-1.0, 1.0)


class Acos(TrigOp):
    op_type = "Acos"
    since_opset = 7
    function = np.arccos
    x_range = (-1.0, 1.0)


class Atan(TrigOp):
    op_type = "Atan"
    since_opset = 7
    function = np.arctan


class Sinh(TrigOp):
    op_type = "Sinh"
    function = np.sinh


class Cosh(TrigOp):
    op_type = "Cosh"
    function = np.cosh


class Asinh(TrigOp):
    op_type = "Asinh"
    function = np.arcsinh


class Acosh(TrigOp):
    op_type = "Acosh"
    function = np.arccosh
    x_range = (1.0, 4.0)


class Atanh(TrigOp):
    op_type = "Atanh"
    function = np.arctanh
    x_range = (-0.95, 0.95)


OPS = (Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh)
