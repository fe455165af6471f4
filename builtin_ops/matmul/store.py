"""The store side of every GEMM kernel of the family (SIMT, TF32 ``mma.sync``, ``wgmma``
TF32/FP16, the implicit-GEMM convolutions built on them): the output tile staged in shared
memory, the fused epilogue, the split-K reduction and the launches.

A kernel stages its ``bm x bn`` tile row-major in shared memory (row stride ``ld``, at
least ``bn``) and calls :func:`tile_store`. Where the epilogue offers a vector form
(:attr:`plugrt.kernels.Epilogue.vector`), N is a multiple of :data:`VECTOR` and the
launch's arrays are 16-byte aligned, the launches pick the kernel compiled with it: each
thread then moves eight consecutive columns at a time, reading the staged tile, the
epilogue's operands and writing the output in 16-byte vectors. The scalar store, one
element per thread and step, serves every other case. The store is the bound of a
memory-heavy layer (a 1x1 convolution with a residual add writes and reads far more
bytes than it multiplies): its bytes in flight decide the layer's time.
"""

from __future__ import annotations

import functools
import threading
import weakref

import numpy as np
from numba import float32, int64

from plugrt.kernels import VECTOR, Epilogue, aligned, cuda, flat, grid_1d, jit, simulated, to_device, vector8
from plugrt.plugin import Launch

from .plan import K_, M_, N_, NB, SCM, SCN, USE_C, store_value_fn


def staging_bytes(bm: int, bn: int, mainloop_floats: int, ld: int | None = None) -> int:
    """Dynamic shared memory of a GEMM kernel: its main-loop buffers, reused for the
    ``bm x bn`` output tile (rows ``ld`` floats apart) at the store."""
    return 4 * max(mainloop_floats, bm * (bn if ld is None else ld))


#: Output elements a thread computes (epilogue loads included) before storing any: loads
#: after a store that may alias them wait for it; batched, their latencies overlap.
STORE_BATCH = 8
#: Vectors of :data:`VECTOR` elements the vector store batches the same way.
VECTOR_BATCH = 4


@functools.lru_cache(maxsize=None)
def tile_store(bm: int, bn: int, threads: int, even: bool, split: bool, epilogue_fn, vector_fn=None,
               ld: int | None = None):
    """``store(smem, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid)``:
    the block stores its ``bm x bn`` output tile, staged row-major in ``smem`` (row ``r``
    at ``r * ld``) by every thread beforehand (between barriers).

    Without ``split``: ``out[o] = epilogue(alpha * acc + beta * C)`` once per element; with
    it the raw sum goes to ``partial[(z * nb + bi) * M * N + o']`` for
    :func:`split_reduce_kernel`. Staging keeps the accumulators' indices constant in the
    kernels (so they stay in registers) however large the epilogue is. With ``vector_fn``
    (the epilogue's vector form; N a multiple of :data:`VECTOR`, arrays aligned, ``ld`` a
    multiple of 4) consecutive threads take consecutive 8-column vectors.
    """
    ld = bn if ld is None else ld
    if vector_fn is not None:
        return _vector_tile_store(bm, bn, threads, even, split, vector_fn, ld)
    store = store_value_fn(np.dtype(np.float32))
    per_thread = -(-bm * bn // threads)
    U = max(1, min(STORE_BATCH, per_thread))
    STEP = threads * U

    @jit(device=True)
    def store_tile(smem, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid):
        nb, m, n = meta[NB], meta[M_], meta[N_]
        scm, scn, use_c = meta[SCM], meta[SCN], meta[USE_C]
        mn = m * n
        where = cuda.local.array(U, int64)
        values = cuda.local.array(U, float32)
        for e0 in range(tid, bm * bn, STEP):
            for u in range(U):
                e = e0 + u * threads
                r = e // bn
                col = e - r * bn
                gm = m0 + r
                gn = n0 + col
                where[u] = -1
                if e < bm * bn and (even or (gm < m and gn < n)):
                    if split:
                        where[u] = (z * nb + bi) * mn + gm * n + gn
                        values[u] = smem[r * ld + col]
                    else:
                        o = int64(bi * mn + gm * n + gn)
                        where[u] = o
                        values[u] = epilogue_fn(store(smem[r * ld + col], c, gm * scm + gn * scn, use_c, 0, alpha,
                                                      beta), o, operands)
            for u in range(U):
                if where[u] >= 0:
                    if split:
                        partial[where[u]] = values[u]
                    else:
                        out[where[u]] = values[u]

    return store_tile


def _vector_tile_store(bm: int, bn: int, threads: int, even: bool, split: bool, vector_fn, ld: int):
    """:func:`tile_store`'s vector form (see there)."""
    store = store_value_fn(np.dtype(np.float32))
    load8, store8 = vector8()
    vectors = bm * bn // VECTOR
    U = max(1, min(VECTOR_BATCH, -(-vectors // threads)))
    STEP, VALUES = threads * U, U * VECTOR

    @jit(device=True)
    def scaled(x, c, ci, scn, use_c, alpha, beta):
        return (store(x[0], c, ci, use_c, 0, alpha, beta), store(x[1], c, ci + scn, use_c, 0, alpha, beta),
                store(x[2], c, ci + 2 * scn, use_c, 0, alpha, beta), store(x[3], c, ci + 3 * scn, use_c, 0, alpha, beta),
                store(x[4], c, ci + 4 * scn, use_c, 0, alpha, beta), store(x[5], c, ci + 5 * scn, use_c, 0, alpha, beta),
                store(x[6], c, ci + 6 * scn, use_c, 0, alpha, beta), store(x[7], c, ci + 7 * scn, use_c, 0, alpha, beta))

    @jit(device=True)
    def store_tile(smem, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid):
        nb, m, n = meta[NB], meta[M_], meta[N_]
        scm, scn, use_c = meta[SCM], meta[SCN], meta[USE_C]
        mn = m * n
        where = cuda.local.array(U, int64)
        values = cuda.local.array(VALUES, float32)
        for v0 in range(tid, vectors, STEP):
            for u in range(U):
                v = v0 + u * threads
                where[u] = -1
                if v < vectors:
                    e = v * VECTOR
                    r = e // bn
                    col = e - r * bn
                    gm = m0 + r
                    gn = n0 + col
                    if even or (gm < m and gn < n):  # N % 8 == 0: the whole vector is inside
                        x = load8(smem, r * ld + col)
                        if split:
                            where[u] = (z * nb + bi) * mn + gm * n + gn
                            y = x
                        else:
                            o = int64(bi * mn + gm * n + gn)
                            where[u] = o
                            y = vector_fn(scaled(x, c, gm * scm + gn * scn, scn, use_c, alpha, beta), o, operands)
                        for k in range(VECTOR):
                            values[u * VECTOR + k] = y[k]
            for u in range(U):
                if where[u] >= 0:
                    b = u * VECTOR
                    y = (values[b], values[b + 1], values[b + 2], values[b + 3],
                         values[b + 4], values[b + 5], values[b + 6], values[b + 7])
                    if split:
                        store8(partial, where[u], y)
                    else:
                        store8(out, where[u], y)

    return store_tile


@functools.lru_cache(maxsize=None)
def split_reduce_kernel(epilogue_fn, vector: bool = False):
    """``out[o] = epilogue(alpha * sum_z partial[z * total + o] + beta * C)``: the split-K
    final reduction, the one store of a split product (float32). With ``vector``,
    ``epilogue_fn`` is the epilogue's vector form and each thread step takes eight
    consecutive elements (N a multiple of :data:`VECTOR`, arrays aligned).

    Arguments: ``(out, c, partial, meta, alpha, beta, splits, operands)``.
    """
    store = store_value_fn(np.dtype(np.float32))
    if vector:
        return _vector_split_reduce(epilogue_fn)

    @jit
    def split_reduce(out, c, partial, meta, alpha, beta, splits, operands):
        m, n = meta[M_], meta[N_]
        mn = m * n
        total_size = meta[NB] * mn
        for o in range(cuda.grid(1), total_size, cuda.gridsize(1)):
            total = float32(0)
            for z in range(splits):
                total += partial[z * total_size + o]
            rest = o % mn
            gm = rest // n
            gn = rest - gm * n
            value = store(total, c, gm * meta[SCM] + gn * meta[SCN], meta[USE_C], 0, alpha, beta)
            out[o] = epilogue_fn(value, int64(o), operands)

    return split_reduce


def _vector_split_reduce(vector_fn):
    store = store_value_fn(np.dtype(np.float32))
    load8, store8 = vector8()

    @jit
    def split_reduce(out, c, partial, meta, alpha, beta, splits, operands):
        m, n = meta[M_], meta[N_]
        mn = m * n
        total_size = meta[NB] * mn
        scn, use_c = meta[SCN], meta[USE_C]
        for v in range(cuda.grid(1), total_size // VECTOR, cuda.gridsize(1)):
            o = int64(v * VECTOR)
            s0, s1, s2, s3, s4, s5, s6, s7 = load8(partial, o)
            for z in range(1, splits):
                t0, t1, t2, t3, t4, t5, t6, t7 = load8(partial, z * total_size + o)
                s0, s1, s2, s3, s4, s5, s6, s7 = s0 + t0, s1 + t1, s2 + t2, s3 + t3, s4 + t4, s5 + t5, s6 + t6, s7 + t7
            rest = o % mn
            gm = rest // n
            ci = gm * meta[SCM] + (rest - gm * n) * scn
            x = (store(s0, c, ci, use_c, 0, alpha, beta), store(s1, c, ci + scn, use_c, 0, alpha, beta),
                 store(s2, c, ci + 2 * scn, use_c, 0, alpha, beta), store(s3, c, ci + 3 * scn, use_c, 0, alpha, beta),
                 store(s4, c, ci + 4 * scn, use_c, 0, alpha, beta), store(s5, c, ci + 5 * scn, use_c, 0, alpha, beta),
                 store(s6, c, ci + 6 * scn, use_c, 0, alpha, beta), store(s7, c, ci + 7 * scn, use_c, 0, alpha, beta))
            store8(out, o, vector_fn(x, o, operands))

    return split_reduce


def split_chunk(k: int, bk: int, splits: int) -> tuple[int, int]:
    """``(splits, kchunk)``: K per split rounded up to whole tiles, no empty split."""
    ktiles = max(1, -(-k // bk))
    splits = max(1, min(splits, ktiles))
    kchunk = -(-ktiles // splits) * bk
    return max(1, -(-k // kchunk)), kchunk


def gemm_launches(kernel_for, meta: np.ndarray, offs: np.ndarray, bm: int, bn: int, bk: int, threads: int,
                  shared_bytes: int, splits: int, epilogue: Epilogue, alpha: float, beta: float,
                  c_index: int | None, views=None, always_split: bool = False):
    """``(launches, workspace_bytes, splits)`` of a K-split-capable GEMM kernel taking the
    SIMT kernel's arguments; ``kernel_for(split: bool, vector: bool)`` gives the kernel
    (``vector``: compiled with the epilogue's vector form, asked only where it applies);
    ``views(a, b)`` (given) turns the flat operand arrays into those the kernel reads.
    ``always_split``: the split kernel and its reduction even for one split, so that every
    size runs the same two kernels (a ragged twin's, with the split count of its size)."""
    nb, m, n, k = (int(meta[s]) for s in (NB, M_, N_, K_))
    splits, kchunk = split_chunk(k, bk, splits)
    total = nb * m * n
    split = always_split or splits > 1
    workspace_bytes = 4 * splits * total if split else 0
    grid = (-(-n // bn), -(-m // bm), nb * splits)
    vector_shape = epilogue.vector is not None and n % VECTOR == 0 and bn % VECTOR == 0

    def launches(ins, outs, workspace):
        if total == 0:
            return []
        own = ins[:epilogue.first]
        out, a, b = flat(outs[0]), flat(own[0]), flat(own[1])
        c = flat(own[c_index]) if c_index is not None and meta[USE_C] else out
        if views is not None:
            a, b = views(a, b)
        partial = workspace[:workspace_bytes].view(np.float32) if split else to_device(np.zeros(1, np.float32))
        vector = vector_shape and epilogue.vector_ready(ins, out) and (not split or aligned(partial))
        meta_d, operands = to_device(meta), epilogue.arguments(ins)
        run = [Launch(kernel_for(split, vector), grid, threads,
                      (out, a, b, c, partial, meta_d, to_device(offs), np.float32(alpha), np.float32(beta),
                       np.int64(splits), np.int64(kchunk), operands), shared_bytes)]
        if split:
            blocks, block = grid_1d(total // VECTOR if vector else total)
            reduce = split_reduce_kernel(epilogue.vector, True) if vector else split_reduce_kernel(epilogue.fn)
            run.append(Launch(reduce, blocks, block,
                              (out, c, partial, meta_d, np.float32(alpha), np.float32(beta), np.int64(splits),
                               operands)))
        return run

    return launches, workspace_bytes, splits


class HeldOperand:
    """A constant ``[K, N]`` B a tactic holds transposed, ``[N, K]`` (the FP16 and INT8
    tensor-core GEMMs read B K-major): made once per constant and dtype and uploaded once
    per device, shared by every tactic, specialization and context that holds it
    (read-only). A new shape's specialization enumerates the tactics again; without this
    it would transpose and upload every weight again, and keep each copy."""

    def __init__(self, value: np.ndarray, dtype, k: int, n: int):
        self.host = np.ascontiguousarray(np.asarray(value, dtype).reshape(k, n).T)
        self.size = self.host.size
        self._device: dict = {}
        self._derived: dict = {}

    def derived(self, name: str, make):
        """A host array derived from the held operand (``make(host)``), made once."""
        with _HELD_LOCK:
            if name not in self._derived:
                self._derived[name] = make(self.host)
            return self._derived[name]

    def device(self):
        """The ``[N * K]`` device copy on the current device."""
        key = _device_id()
        found = self._device.get(key)
        if found is None:
            with _HELD_LOCK:
                found = self._device.get(key)
                if found is None:
                    found = self._device[key] = cuda.to_device(self.host).reshape(self.size)
        return found


def held_operand(value: np.ndarray, dtype, k: int, n: int) -> HeldOperand:
    """The :class:`HeldOperand` of this constant (kept while the constant lives)."""
    key = (id(value), np.dtype(dtype).str, k, n)
    with _HELD_LOCK:
        found = _HELD.get(key)
        if found is not None and found[0]() is value:
            return found[1]
    held = HeldOperand(value, dtype, k, n)
    try:
        ref = weakref.ref(value, lambda _, key=key: _HELD.pop(key, None))
    except TypeError:  # (not weak-referenceable: not shared)
        return held
    with _HELD_LOCK:
        _HELD[key] = (ref, held)
    return held


def _device_id() -> int:
    return 0 if simulated() else cuda.get_current_device().id


_HELD: dict = {}
_HELD_LOCK = threading.RLock()
