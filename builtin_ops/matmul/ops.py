"""Matrix products: Gemm, MatMul and MatMulInteger.

Float products are computed in float64 and cast back to the input dtype; integer
products run in the integer dtype (wrapping on overflow, as a fixed-width kernel does).
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import broadcast_strides, no_epilogue
from plugrt.plugin import ANCHOR, FLOAT_DTYPES, Attr, Example, OpPlugin, TensorInfo, dims, optional
from plugrt_builtin_ops.common.scale_folding import vector_along

from .plan import gemm_plan, permuted_plan, product_plan
from .tactics import product_tactics

#: MatMul/Gemm element types (ONNX T, bfloat16 aside).
_MATMUL_DTYPES = FLOAT_DTYPES | {np.dtype(t) for t in ("int32", "int64", "uint32", "uint64")}
_INT8_DTYPES = frozenset({np.dtype("int8"), np.dtype("uint8")})


def _same_dim(a, b) -> bool:
    """False only when both dims are concrete and differ."""
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


def _product(a: np.ndarray, b: np.ndarray, out_dtype) -> np.ndarray:
    """``a @ b`` in float64 for floats, in the integer dtype otherwise."""
    if np.dtype(out_dtype).kind == "f":
        return np.matmul(a.astype(np.float64), b.astype(np.float64))
    return np.matmul(a, b)


def matmul_shape(node, a: tuple, b: tuple) -> tuple:
    """numpy.matmul's output shape, symbolic dims allowed (1-D operands included)."""
    if not a or not b:
        raise ValueError("MatMul operands must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if not _same_dim(a2[-1], b2[-2]):
        raise ValueError(f"contraction dims differ: {a2[-1]} vs {b2[-2]}")
    batch = dims.broadcast([a2[:-2], b2[:-2]])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return tuple(out)


class MatMul(OpPlugin):
    """MatMul: numpy.matmul semantics (1-D operands promoted, batch dims broadcast)."""

    op_type = "MatMul"
    inputs = (2, 2)
    groups = frozenset({ANCHOR})
    dtypes = _MATMUL_DTYPES

    def check(self, node, inputs):
        a, b = inputs
        if a.dtype != b.dtype:
            raise self.unsupported(node, f"mixed input dtypes {a.dtype} and {b.dtype}", "cast to one dtype")

    def infer(self, node, inputs):
        a, b = inputs
        return [TensorInfo(a.dtype, matmul_shape(node, a.shape, b.shape))]

    def reference(self, node, inputs):
        a, b = inputs
        return [np.asarray(_product(a, b, a.dtype)).astype(a.dtype, copy=False)]

    def fold_scale(self, node, inputs, output, scale, shift):
        """Fold a per-column scale into a constant 2-D B; a nonzero shift cannot fold (no bias)."""
        b = inputs[1]
        if output.dtype not in FLOAT_DTYPES or b.value is None or b.rank != 2 or np.any(np.asarray(shift) != 0):
            return None
        s = vector_along(scale, output.shape, -1)
        if s is None:
            return None
        return {1: (b.value.astype(np.float64) * s).astype(b.dtype)}

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        a, b = inputs
        meta, offs = product_plan(a.shape, b.shape)
        return product_tactics(a.dtype, b.dtype, outputs[0].dtype, meta, offs,
                               epilogue=epilogue or no_epilogue(len(node.inputs)), b_value=b.value, wanted=wanted)


class Gemm(OpPlugin):
    """Gemm: Y = alpha * A' @ B' + beta * C, C broadcast unidirectionally to (M, N).

    Opset 7 on (opset 6's ``broadcast`` attribute is not claimed); C is optional from 11.
    """

    op_type = "Gemm"
    since_opset = 7
    inputs = (2, 3)
    groups = frozenset({ANCHOR})
    dtypes = _MATMUL_DTYPES
    attributes = (
        Attr("alpha", "float", 1.0),
        Attr("beta", "float", 1.0),
        Attr("transA", "int", 0),
        Attr("transB", "int", 0),
    )

    def check(self, node, inputs):
        dtypes = {i.dtype for i in inputs if i is not None}
        if len(dtypes) > 1:
            raise self.unsupported(node, f"mixed input dtypes {sorted(map(str, dtypes))}", "cast to one dtype")
        if node.opset < 9 and inputs[0].dtype not in FLOAT_DTYPES:
            raise self.unsupported(node, f"integer Gemm ({inputs[0].dtype}) at opset {node.opset}", "use opset >= 9")

    def infer(self, node, inputs):
        a, b = inputs[0], inputs[1]
        c = optional(inputs, 2)
        if a.rank != 2 or b.rank != 2:
            raise ValueError(f"A and B must be 2-D, got ranks {a.rank} and {b.rank}")
        m, k = (a.shape[1], a.shape[0]) if node.attrs["transA"] else a.shape
        k2, n = (b.shape[1], b.shape[0]) if node.attrs["transB"] else b.shape
        if not _same_dim(k, k2):
            raise ValueError(f"contraction dims differ: {k} vs {k2}")
        if c is None and node.opset < 11:
            raise ValueError(f"input C is required before opset 11 (opset {node.opset})")
        if c is not None:
            if c.rank > 2:
                raise ValueError(f"C must have rank <= 2, got {c.rank}")
            for dc, do in zip(reversed(c.shape), (n, m)):
                if not (dc == 1 or _same_dim(dc, do)):
                    raise ValueError(f"C of shape {list(c.shape)} does not broadcast to [{m},{n}]")
        return [TensorInfo(a.dtype, (m, n))]

    def reference(self, node, inputs):
        a, b = inputs[0], inputs[1]
        c = optional(inputs, 2)
        alpha, beta = node.attrs["alpha"], node.attrs["beta"]
        if node.attrs["transA"]:
            a = a.T
        if node.attrs["transB"]:
            b = b.T
        out = _product(a, b, a.dtype)
        if alpha != 1.0:
            out = out * alpha
        if c is not None and beta != 0.0:
            out = out + (c * beta if beta != 1.0 else c)
        return [np.asarray(out).astype(a.dtype, copy=False)]

    def fold_scale(self, node, inputs, output, scale, shift):
        """Fold a per-column scale into B and the shift into C, since
        (alpha A'B' + beta C) * s + t = alpha A'(B's) + beta (C s + t / beta).

        C is added (as t / beta) when absent and the shift is nonzero; with beta = 0 a
        nonzero shift cannot fold.
        """
        b, c = inputs[1], optional(inputs, 2)
        if output.dtype not in FLOAT_DTYPES or b.value is None or (c is not None and c.value is None):
            return None
        s, t = vector_along(scale, output.shape, 1), vector_along(shift, output.shape, 1)
        if s is None or t is None:
            return None
        beta, shifted = node.attrs["beta"], bool(np.any(t != 0))
        if beta == 0.0 and shifted:
            return None
        columns = s[:, None] if node.attrs["transB"] else s  # B' = B.T when transB
        folded = {1: (b.value.astype(np.float64) * columns).astype(b.dtype)}
        if c is not None and beta != 0.0:
            folded[2] = (c.value.astype(np.float64) * s + t / beta).astype(c.dtype)
        elif c is None and shifted:
            folded[2] = (t / beta).astype(b.dtype)
        return folded

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        a, b = inputs[0], inputs[1]
        c = optional(inputs, 2)
        alpha, beta = node.attrs["alpha"], node.attrs["beta"]
        meta, offs = gemm_plan(a.shape, b.shape, None if c is None else c.shape,
                               bool(node.attrs["transA"]), bool(node.attrs["transB"]),
                               alpha, beta, integer=a.dtype.kind != "f")
        return product_tactics(a.dtype, b.dtype, outputs[0].dtype, meta, offs,
                               epilogue=epilogue or no_epilogue(len(node.inputs)),
                               alpha=alpha, beta=beta, c_index=2, b_value=b.value, wanted=wanted)


class MatMulInteger(OpPlugin):
    """MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) in int32.

    Zero points are scalars or per-row (A: [M] or [..., M, 1]) / per-column (B: [N] or
    [..., 1, N]) tensors.
    """

    op_type = "MatMulInteger"
    since_opset = 10
    inputs = (2, 4)
    groups = frozenset({ANCHOR})
    dtypes = _INT8_DTYPES

    def infer(self, node, inputs):
        a, b = inputs[0], inputs[1]
        return [TensorInfo(np.int32, matmul_shape(node, a.shape, b.shape))]

    def reference(self, node, inputs):
        a, b = inputs[0].astype(np.int64), inputs[1].astype(np.int64)
        a_zp, b_zp = optional(inputs, 2), optional(inputs, 3)
        if a_zp is not None:
            a_zp = a_zp.astype(np.int64)
            if a_zp.ndim == 1 and a.ndim >= 2 and a_zp.size > 1:
                a_zp = a_zp.reshape(-1, 1)  # per row of A
            a = a - a_zp
        if b_zp is not None:
            b = b - b_zp.astype(np.int64)
        return [np.matmul(a, b).astype(np.int32)]

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        """The product tactics; the epilogue gets the int32 accumulator as ``value``. Zero
        points absent or known zeros make the product symmetric (Hopper's INT8 tensor-core
        tactic then needs no correction); a constant B may be held transposed."""
        a, b = inputs[0], inputs[1]
        a_zp, b_zp = optional(inputs, 2), optional(inputs, 3)
        za = self._zero_point_strides(node, a, a_zp, per_row=True)
        zb = self._zero_point_strides(node, b, b_zp, per_row=False)
        meta, offs = product_plan(a.shape, b.shape, za, zb)
        symmetric = all(z is None or (z.value is not None and not np.any(z.value)) for z in (a_zp, b_zp))
        return product_tactics(a.dtype, b.dtype, outputs[0].dtype, meta, offs,
                               epilogue=epilogue or no_epilogue(len(node.inputs)), zero_points=True,
                               symmetric=symmetric, b_value=b.value, wanted=wanted)

    def _zero_point_strides(self, node, operand, zero_point, per_row: bool):
        """Element strides reading a zero point broadcast over the operand, as the reference does."""
        if zero_point is None:
            return None
        shape = tuple(zero_point.shape)
        size = int(np.prod(shape, dtype=np.int64))
        if per_row and len(shape) == 1 and operand.rank >= 2 and size > 1:
            shape = (size, 1)
        try:
            fits = len(shape) <= operand.rank and np.broadcast_shapes(shape, operand.shape) == tuple(operand.shape)
        except ValueError:
            fits = False
        if not fits:
            raise self.unsupported(node, f"zero point of shape {list(zero_point.shape)} for an operand of shape "
                                   f"{list(operand.shape)}", "use a scalar, per-row or per-column zero point")
        return broadcast_strides(shape, operand.shape)


class _PermutedProduct(OpPlugin):
    """``Y = alpha * matmul(transpose(A, perm_a), transpose(B, perm_b))``, the permutations
    from the node's attributes (:meth:`perms`; ``None``: as stored). The product reads each
    operand through its permuted strides (:func:`.plan.permuted_plan`); a transposed B is no
    weight the FP16 tactic may hold transposed."""

    since_opset = 1
    inputs = (2, 2)
    groups = frozenset({ANCHOR})
    dtypes = FLOAT_DTYPES

    def perms(self, node, a_rank: int, b_rank: int) -> tuple[list | None, list | None]:
        raise NotImplementedError

    def check(self, node, inputs):
        a, b = inputs
        if a.dtype != b.dtype:
            raise self.unsupported(node, f"mixed input dtypes {a.dtype} and {b.dtype}", "cast to one dtype")

    def infer(self, node, inputs):
        a, b = inputs
        perm_a, perm_b = self.perms(node, a.rank, b.rank)
        shape = matmul_shape(node, _permuted(a.shape, perm_a), _permuted(b.shape, perm_b))
        return [TensorInfo(a.dtype, shape)]

    def reference(self, node, inputs):
        a, b = inputs
        perm_a, perm_b = self.perms(node, a.ndim, b.ndim)
        a = np.transpose(a, perm_a) if perm_a else a
        b = np.transpose(b, perm_b) if perm_b else b
        return [(float(node.attrs["alpha"]) * _product(a, b, a.dtype)).astype(a.dtype, copy=False)]

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        a, b = inputs
        perm_a, perm_b = self.perms(node, a.rank, b.rank)
        if perm_a or perm_b:
            meta, offs = permuted_plan(a.shape, b.shape, perm_a, perm_b)
        else:
            meta, offs = product_plan(a.shape, b.shape)
        return product_tactics(a.dtype, b.dtype, outputs[0].dtype, meta, offs,
                               epilogue=epilogue or no_epilogue(len(node.inputs)),
                               alpha=float(node.attrs["alpha"]), b_value=None if perm_b else b.value, wanted=wanted)


def _permuted(shape: tuple, perm) -> tuple:
    return tuple(shape[p] for p in perm) if perm else tuple(shape)


class FusedMatMul(_PermutedProduct):
    """ONNX Runtime's ``com.microsoft::FusedMatMul``: ``Y = alpha * A' @ B'``, A' and B' the
    operands with their last two dims swapped under ``transA`` / ``transB`` (numpy.matmul
    otherwise, batch dims broadcast). The family's ``fold_transposes`` pass makes one of
    ``MatMul(A, Transpose(B))``. ``transBatchA`` and ``transBatchB`` are claimed at 0 only."""

    domain = "com.microsoft"
    op_type = "FusedMatMul"
    attributes = (Attr("alpha", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0),
                  Attr("transBatchA", "int", 0), Attr("transBatchB", "int", 0))

    def perms(self, node, a_rank, b_rank):
        def swap(rank, flag):
            return list(range(rank - 2)) + [rank - 1, rank - 2] if node.attrs[flag] else None

        return swap(a_rank, "transA"), swap(b_rank, "transB")

    def check(self, node, inputs):
        super().check(node, inputs)
        for flag in ("transBatchA", "transBatchB"):
            if node.attrs[flag]:
                raise self.unsupported(node, f"{flag}={node.attrs[flag]}", "transpose the batch dims with a Transpose")
        for flag, operand in (("transA", inputs[0]), ("transB", inputs[1])):
            if node.attrs[flag] and operand.rank < 2:
                raise self.unsupported(node, f"{flag} on a {operand.rank}-D operand", "give operands of rank >= 2")

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        return [Example((TensorInfo(f32, (2, 3, 5, 8)), TensorInfo(f32, (2, 3, 6, 8))), {"transB": 1}),
                Example((TensorInfo(f32, (8, 5)), TensorInfo(f32, (3, 8, 6))), {"transA": 1, "alpha": 0.5}),
                Example((TensorInfo(f16, (4, 16)), TensorInfo(f16, (7, 16))), {"transB": 1}, rtol=1e-2, atol=1e-2),
                Example((TensorInfo(f32, (1, 4, 8)), TensorInfo(f32, (8, 3))), {"alpha": 2.0})]


class PermutedMatMul(_PermutedProduct):
    """``plugrt.matmul::PermutedMatMul``: ``Y = alpha * matmul(transpose(A, perm_a),
    transpose(B, perm_b))`` (an empty perm: no transpose), what ``fold_transposes`` makes of
    a MatMul whose operands are Transposes that swap more than the last two dims (the head
    split of attention exports: ``[B, S, H, D] -> [B, H, S, D]``, and K's ``[0, 2, 3, 1]``)."""

    domain = "plugrt.matmul"
    op_type = "PermutedMatMul"
    attributes = (Attr("alpha", "float", 1.0), Attr("perm_a", "ints", ()), Attr("perm_b", "ints", ()))

    def perms(self, node, a_rank, b_rank):
        return list(node.attrs["perm_a"] or ()) or None, list(node.attrs["perm_b"] or ()) or None

    def check(self, node, inputs):
        super().check(node, inputs)
        for name, operand in (("perm_a", inputs[0]), ("perm_b", inputs[1])):
            perm = list(node.attrs[name] or ())
            if perm and (operand.rank < 2 or sorted(perm) != list(range(operand.rank))):
                raise self.unsupported(node, f"{name}={perm} for a {operand.rank}-D operand",
                                       "give a permutation of the operand's dims (rank >= 2)")

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        return [Example((TensorInfo(f32, (2, 5, 3, 8)), TensorInfo(f32, (2, 6, 3, 8))),
                        {"perm_a": [0, 2, 1, 3], "perm_b": [0, 2, 3, 1], "alpha": 0.5}),
                Example((TensorInfo(f16, (2, 5, 3, 8)), TensorInfo(f16, (2, 5, 3, 8))),
                        {"perm_a": [0, 2, 1, 3], "perm_b": [0, 2, 3, 1]}, rtol=1e-2, atol=1e-2)]


OPS = (MatMul, Gemm, MatMulInteger, FusedMatMul, PermutedMatMul)
