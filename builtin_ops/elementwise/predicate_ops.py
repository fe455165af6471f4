"""The elementwise ops whose output is bool: comparisons (Equal, Less, Greater,
LessOrEqual, GreaterOrEqual), logic (And, Or, Xor, Not), IsNaN and IsInf.
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import ALL_DTYPES, FLOAT_DTYPES, NUMERIC_DTYPES, Attr

from .ops import BOOL, BOOL_DTYPES, ElementwiseOp


class PredicateOp(ElementwiseOp):
    """Ops whose output is bool (comparisons, logic, IsNaN, IsInf)."""

    since_opset = 7
    dtypes = NUMERIC_DTYPES

    def out_dtype(self, node, dtypes):
        return BOOL


class Equal(PredicateOp):
    op_type = "Equal"
    commutative = True
    dtypes = ALL_DTYPES

    def compute(self, node, a, b):
        return np.equal(a, b)


class Less(PredicateOp):
    op_type = "Less"

    def compute(self, node, a, b):
        return np.less(a, b)


class Greater(PredicateOp):
    op_type = "Greater"

    def compute(self, node, a, b):
        return np.greater(a, b)


class LessOrEqual(PredicateOp):
    op_type = "LessOrEqual"
    since_opset = 12

    def compute(self, node, a, b):
        return np.less_equal(a, b)


class GreaterOrEqual(PredicateOp):
    op_type = "GreaterOrEqual"
    since_opset = 12

    def compute(self, node, a, b):
        return np.greater_equal(a, b)


class And(PredicateOp):
    op_type = "And"
    commutative = True
    dtypes = BOOL_DTYPES

    def compute(self, node, a, b):
        return np.logical_and(a, b)


class Or(PredicateOp):
    op_type = "Or"
    commutative = True
    dtypes = BOOL_DTYPES

    def compute(self, node, a, b):
        return np.logical_or(a, b)


class Xor(PredicateOp):
    op_type = "Xor"
    commutative = True
    dtypes = BOOL_DTYPES

    def compute(self, node, a, b):
        return np.logical_xor(a, b)


class Not(PredicateOp):
    op_type = "Not"
    since_opset = 1
    inputs = (1, 1)
    dtypes = BOOL_DTYPES

    def compute(self, node, x):
        return np.logical_not(x)


class IsNaN(PredicateOp):
    op_type = "IsNaN"
    since_opset = 9
    inputs = (1, 1)
    dtypes = FLOAT_DTYPES

    def compute(self, node, x):
        return np.isnan(x)


class IsInf(PredicateOp):
    op_type = "IsInf"
    since_opset = 10
    inputs = (1, 1)
    dtypes = FLOAT_DTYPES
    attributes = (Attr("detect_negative", "int", 1), Attr("detect_positive", "int", 1))

    def compute(self, node, x):
        negative = np.isneginf(x) if node.attrs["detect_negative"] else np.zeros(x.shape, bool)
        positive = np.isposinf(x) if node.attrs["detect_positive"] else np.zeros(x.shape, bool)
        return negative | positive

    def kernel_params(self, node):
        return (node.attrs["detect_negative"], node.attrs["detect_positive"])


OPS = (Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor, Not, IsNaN, IsInf)
