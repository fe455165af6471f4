"""How every matrix product is described on the host, for all of the family's kernels.

A product (MatMul, Gemm, MatMulInteger) is ``nb`` batch items of an ``M x K`` by ``K x N``
product, each operand read through element strides (``A[m, k]`` at
``a[aoff[b] + m*sam + k*sak]``), so 1-D operands, broadcast batch dims, Gemm's transposes
and zero-point tensors are all strides and per-batch offsets. The shape description travels
as one small int64 ``meta`` array (its slots: :data:`NB` ...) and one ``offs`` table
(:data:`OFFS_W` offsets per batch item), made by :func:`product_plan` and :func:`gemm_plan`.

Element types: float16 is loaded as float32 and accumulated in float32, float64 in float64,
integers in their own width (wrapping as the reference's fixed-width matmul does);
MatMulInteger subtracts zero points at load time and accumulates in int32
(:func:`load_type`). Every kernel's store computes its value with :func:`store_value_fn`:
the float result in the compute type for float outputs and the integer result (after
Gemm's float scaling is truncated, as the store would) for integer ones; the fused
epilogue gets that value.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import broadcast_strides, jit

# Slots of the ``meta`` array.
NB, M_, N_, K_, SAM, SAK, SBK, SBN, SCM, SCN, USE_C, FLOAT_EP, A_KC, B_NC, SZAM, SZAK, SZBK, SZBN = range(18)
META_LEN = 18
#: Offsets per batch item in ``offs``: A, B, A's zero point, B's zero point.
OFFS_W = 4


# --------------------------------------------------------------------------- element types


def load_type(dtype):
    """The type operands are widened to and accumulated in."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return np.float32
    if dtype.kind in "iu" and dtype.itemsize < 4:
        return np.int32  # MatMulInteger's int8/uint8
    return dtype.type


def scaling_type(out_dtype):
    """Type of alpha/beta and of the math that applies them (float64 for integer outputs)."""
    return load_type(out_dtype) if np.dtype(out_dtype).kind == "f" else np.float64


@functools.lru_cache(maxsize=None)
def store_value_fn(out_dtype):
    """``value(total, c, ci, use_c, float_ep, alpha, beta)``: one output element as the
    store writes it, before the fused epilogue: ``alpha * total + beta * C`` in the compute
    type (float outputs); for integers the accumulator, plus C, or the float scaling
    truncated back to the accumulator's type (``float_ep``), as the reference's cast does."""
    ACC = load_type(out_dtype)
    SCALE = scaling_type(out_dtype)

    if np.dtype(out_dtype).kind == "f":
        @jit(device=True)
        def value(total, c, ci, use_c, float_ep, alpha, beta):
            v = total * alpha
            if use_c:
                v += beta * SCALE(c[ci])
            return v
    else:
        @jit(device=True)
        def value(total, c, ci, use_c, float_ep, alpha, beta):
            if float_ep:
                scaled = SCALE(total) * alpha
                if use_c:
                    scaled += beta * SCALE(c[ci])
                return ACC(scaled)
            if use_c:
                return ACC(total + c[ci])
            return total

    return value


# --------------------------------------------------------------------------- host plans


def _batch_offsets(batch: tuple, strides: np.ndarray) -> np.ndarray:
    """Element offset of each batch item (C order over ``batch``) for per-dim ``strides``."""
    if not batch:
        return np.zeros(1, np.int64)
    index = np.indices(batch, dtype=np.int64).reshape(len(batch), -1)
    return (index * np.asarray(strides, np.int64)[:, None]).sum(axis=0)


def _own_strides(shape: tuple) -> np.ndarray:
    """C strides of ``shape``, 0 along size-1 dims (those broadcast in the batch)."""
    return broadcast_strides(shape, shape)


def product_plan(a_shape: tuple, b_shape: tuple, za=None, zb=None) -> tuple[np.ndarray, np.ndarray]:
    """``meta`` and ``offs`` of ``numpy.matmul(a, b)`` on C-contiguous operands.

    ``za``/``zb``: element strides of zero-point tensors broadcast over A's/B's own dims
    (``None``: no zero point, read as 0 through zero strides).
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    a2 = a_shape if len(a_shape) > 1 else (1,) + a_shape
    b2 = b_shape if len(b_shape) > 1 else b_shape + (1,)
    m, k, n = a2[-2], a2[-1], b2[-1]
    za = np.zeros(len(a_shape), np.int64) if za is None else np.asarray(za, np.int64)
    zb = np.zeros(len(b_shape), np.int64) if zb is None else np.asarray(zb, np.int64)
    # B without batch dims: fold A's batch into M (one wide product; A is contiguous).
    fold = len(a_shape) > 2 and len(b_shape) <= 2 and not za.any()
    batch = () if fold else tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    if fold:
        m = int(np.prod(a_shape[:-1]))

    def view(strides, own_rank, front):
        """(batch strides right-aligned to ``batch``, row stride, column stride)."""
        st = np.asarray(strides, np.int64)
        if own_rank == 1:
            st = np.array([0, st[0]] if front else [st[0], 0], np.int64)
        lead = np.zeros(len(batch), np.int64)
        extra = len(st) - 2
        if extra and batch:
            lead[len(batch) - extra:] = st[:-2]
        return lead, int(st[-2]), int(st[-1])

    a_lead, sam, sak = view(_own_strides(a_shape), len(a_shape), True)
    b_lead, sbk, sbn = view(_own_strides(b_shape), len(b_shape), False)
    za_lead, szam, szak = view(za, len(a_shape), True)
    zb_lead, szbk, szbn = view(zb, len(b_shape), False)
    if fold:
        sam, szam = k, 0
    nb = int(np.prod(batch, dtype=np.int64))
    offs = np.stack([_batch_offsets(batch, s) for s in (a_lead, b_lead, za_lead, zb_lead)], axis=1)
    meta = np.zeros(META_LEN, np.int64)
    meta[[NB, M_, N_, K_]] = nb, m, n, k
    meta[[SAM, SAK, SBK, SBN]] = sam, sak, sbk, sbn
    meta[[SZAM, SZAK, SZBK, SZBN]] = szam, szak, szbk, szbn
    meta[A_KC], meta[B_NC] = int(sak == 1), int(sbn == 1)
    return meta, np.ascontiguousarray(offs.reshape(-1))


def permuted_plan(a_shape: tuple, b_shape: tuple, perm_a, perm_b) -> tuple[np.ndarray, np.ndarray]:
    """``meta`` and ``offs`` of ``matmul(transpose(a, perm_a), transpose(b, perm_b))`` on
    C-contiguous operands of rank >= 2 (``None``: no transpose): the product reads each
    operand through its permuted strides, batch dims broadcast."""
    def logical(shape, perm):
        shape, strides = tuple(shape), _own_strides(tuple(shape))
        if perm is None:
            return shape, strides
        perm = [int(p) for p in perm]
        return tuple(shape[p] for p in perm), np.asarray([strides[p] for p in perm], np.int64)

    (a_log, a_st), (b_log, b_st) = logical(a_shape, perm_a), logical(b_shape, perm_b)
    batch = tuple(np.broadcast_shapes(a_log[:-2], b_log[:-2]))
    m, k, n = a_log[-2], a_log[-1], b_log[-1]

    def lead(strides, shape):
        out = np.zeros(len(batch), np.int64)
        extra = len(shape) - 2
        if extra and batch:
            own = np.where(np.asarray(shape[:-2]) == 1, 0, strides[:-2])  # broadcast dims read at 0
            out[len(batch) - extra:] = own
        return out

    offs = np.stack([_batch_offsets(batch, lead(a_st, a_log)), _batch_offsets(batch, lead(b_st, b_log)),
                     _batch_offsets(batch, np.zeros(len(batch), np.int64)),
                     _batch_offsets(batch, np.zeros(len(batch), np.int64))], axis=1)
    meta = np.zeros(META_LEN, np.int64)
    meta[[NB, M_, N_, K_]] = int(np.prod(batch, dtype=np.int64)), m, n, k
    meta[[SAM, SAK, SBK, SBN]] = a_st[-2], a_st[-1], b_st[-2], b_st[-1]
    meta[A_KC], meta[B_NC] = int(meta[SAK] == 1), int(meta[SBN] == 1)
    return meta, np.ascontiguousarray(offs.reshape(-1))


def gemm_plan(a_shape, b_shape, c_shape, trans_a: bool, trans_b: bool, alpha: float, beta: float, integer: bool):
    """``meta`` and ``offs`` of Gemm (``c_shape`` None when C is omitted)."""
    m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    n = b_shape[0] if trans_b else b_shape[1]
    meta = np.zeros(META_LEN, np.int64)
    meta[[NB, M_, N_, K_]] = 1, m, n, k
    meta[SAM], meta[SAK] = (1, m) if trans_a else (k, 1)
    meta[SBK], meta[SBN] = (1, k) if trans_b else (n, 1)
    use_c = c_shape is not None and beta != 0.0
    if use_c:
        meta[SCM], meta[SCN] = broadcast_strides(tuple(c_shape), (m, n))
    meta[USE_C] = int(use_c)
    # The reference leaves integers only when both scalings are identities.
    meta[FLOAT_EP] = int(integer and (alpha != 1.0 or (use_c and beta != 1.0)))
    meta[A_KC], meta[B_NC] = int(meta[SAK] == 1), int(meta[SBN] == 1)
    return meta, np.zeros(OFFS_W, np.int64)
