"""Einsum (opset 12 on): a sum of products over the letters of an equation.

The equation follows ONNX and NumPy: explicit (``"ij,jk->ik"``) or implicit output (the
letters appearing once, alphabetically, after any ellipsis dims), ``...`` for broadcast
dims, a letter repeated in one operand for a diagonal, spaces ignored. float16 is summed
in float32 and integers in their own type (wrapping on overflow, as the kernel does).

Tactics: ``direct``, the generic kernel of :mod:`.einsum` (1 to 4 operands); and, for an
equation that is a plain (batched, maybe transposed) matrix product, the matmul family's
product tactics ahead of it, named ``gemm_<tactic>``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from plugrt import ShapeError
from plugrt.kernels import flat, grid_1d, no_epilogue, to_device
from plugrt.plugin import REQUIRED, VARIADIC, Attr, Example, Launch, OpPlugin, Tactic, TensorInfo

from .einsum import (
    MAX_OPERANDS, OUT_TOTAL, accumulator_type, einsum_kernel, einsum_plan, label_sizes, matmul_form, parse_equation,
)
from .plan import permuted_plan
from .tactics import product_tactics

_EINSUM_DTYPES = frozenset(np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64"))


class Einsum(OpPlugin):
    """Einsum: ``numpy.einsum(equation, *inputs)``, every input of one dtype."""

    op_type = "Einsum"
    since_opset = 12
    inputs = (1, VARIADIC)
    dtypes = _EINSUM_DTYPES
    attributes = (Attr("equation", "string", REQUIRED),)

    def _equation(self, node, inputs):
        try:
            return parse_equation(node.attrs["equation"], [i.rank for i in inputs])
        except ValueError as exc:
            raise ShapeError(f"{node.describe()}: malformed Einsum equation: {exc}") from None

    def check(self, node, inputs):
        dtypes = {i.dtype for i in inputs}
        if len(dtypes) > 1:
            raise self.unsupported(node, f"mixed input dtypes {sorted(map(str, dtypes))}", "cast to one dtype")
        self._equation(node, inputs)

    def infer(self, node, inputs):
        equation = self._equation(node, inputs)
        try:
            sizes = label_sizes(equation, [i.shape for i in inputs])
        except ValueError as exc:
            raise ShapeError(f"{node.describe()}: Einsum equation {node.attrs['equation']!r}: {exc} "
                             f"(input shapes {[list(i.shape) for i in inputs]})") from None
        return [TensorInfo(inputs[0].dtype, tuple(sizes[label] for label in equation.output))]

    def reference(self, node, inputs):
        dtype = inputs[0].dtype
        operands = [np.asarray(x, dtype=accumulator_type(dtype)) for x in inputs]
        out = np.einsum(node.attrs["equation"], *operands)
        return [np.asarray(out).astype(dtype, copy=False)]

    def tactics(self, node, inputs, outputs, epilogue=None):
        if len(inputs) > MAX_OPERANDS:
            raise self.unsupported(node, f"an Einsum of {len(inputs)} operands",
                                   f"the CUDA kernel takes 1 to {MAX_OPERANDS}: split it into several Einsums")
        equation = self._equation(node, inputs)
        meta, sizes, strides = einsum_plan(equation, [i.shape for i in inputs])
        kernel = einsum_kernel(len(inputs), inputs[0].dtype)
        total = int(meta[OUT_TOTAL])

        def launches(ins, outs, workspace):
            if total == 0:
                return []
            xs = [flat(x) for x in ins]
            xs += [xs[0]] * (MAX_OPERANDS - len(xs))
            grid, block = grid_1d(total)
            return [Launch(kernel, grid, block,
                           (flat(outs[0]), *xs, to_device(meta), to_device(sizes), to_device(strides)))]

        return self._product_tactics(node, equation, inputs, outputs) + [Tactic("direct", launches, {})]

    def _product_tactics(self, node, equation, inputs, outputs):
        """The matmul family's product tactics (named ``gemm_<name>``) when the equation is a
        plain (batched, maybe transposed) matrix product; none otherwise."""
        shapes = [i.shape for i in inputs]
        form = matmul_form(equation, shapes)
        if form is None:
            return []
        meta, offs = permuted_plan(shapes[0], shapes[1], *form)
        found = product_tactics(inputs[0].dtype, inputs[1].dtype, outputs[0].dtype, meta, offs,
                                epilogue=no_epilogue(len(node.inputs)))
        return [dataclasses.replace(t, name=f"gemm_{t.name}") for t in found]

    def examples(self):
        f16, f32, f64, i32, i64 = (np.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64"))

        def case(equation, *shapes, dtype=f32, **tolerance):
            return Example(tuple(TensorInfo(dtype, s) for s in shapes), {"equation": equation},
                           name=f"{equation} {dtype}", **tolerance)

        return [case("ij,jk->ik", (3, 5), (5, 4)),
                case("bij,bjk->bik", (2, 3, 5), (2, 5, 4)),
                case("ij->ji", (3, 5), dtype=f64),
                case("ii", (4, 4)),
                case("ii->i", (5, 5), dtype=i32),
                case("i,j->ij", (3,), (4,)),
                case("ij->", (3, 5), dtype=f64),
                case("...ij,...jk->...ik", (2, 1, 3, 4), (3, 4, 2)),
                case("ij,jk,kl->il", (2, 3), (3, 4), (4, 2)),
                case("bij,bkj->bik", (2, 3, 7), (2, 4, 7), dtype=f16, rtol=1e-2, atol=1e-2),
                case("ij,kj", (3, 4), (2, 4), dtype=i64)]


OPS = (Einsum,)
