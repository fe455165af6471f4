"""What every attention kernel shares: the concrete problem, its layouts and launch arguments.

Each of Q, K, V and the output is in one of three layouts (the op's ``layout``):
``bhsd`` ``[B, H, S, D]``; ``bshd`` ``[B, S, H, D]`` (the head split of a projection,
not transposed); ``bsh`` ``[B, S, H * D]`` (the projection itself, heads split by the
kernel). A kernel sees each as element strides of its batch, head and sequence axes
(the head dim is contiguous). K and V may have fewer heads than Q: query head ``h`` reads
K/V head ``h // group`` (grouped-query attention; one head shared by all: ``group = H``).
Packed ``bsh`` inputs (the op's ``packed``: one projection's ``[B, S, Nq + Nk + Nv]``
holding Q, K and V side by side) are the same strides over the packed row, each starting
at its columns' offset: the launch passes the kernels views that start there (no copy),
so every kernel reads the slices as it reads any ``bsh`` tensor.

All kernels of this package take the same arguments, ``(out, q, k, v, mask, sq, sk, heads,
q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, k_group, v_sb, v_sh, v_ss, v_group, o_sb, o_sh, o_ss,
m_sb, m_sh, m_sq, m_sk, m_period, qscale)``: flat arrays, the sequence lengths and Q's head
count, the strides (0 for a broadcast batch) and head groups of Q, K, V and the output,
the mask's four strides (0 where broadcast) and the period of its batch (batch ``b`` reads
the mask's ``b % m_period``), and ``scale``; and run one block per (query
tile, batch x head), the query tile fastest (blocks of one head share its K and V in L2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import float32

from plugrt.kernels import flat, jit, simulated, to_device
from plugrt.plugin import Launch

#: Largest dynamic shared memory a block may ask for on sm_90 (227 KiB); the engine's
#: launcher opts kernels above 48 KiB in.
MAX_SHARED_BYTES = 227 * 1024
#: Largest grid (blocks along x).
MAX_BLOCKS = 2**31 - 1

#: A causal fill at or below this gives keys weights that underflow to zero in float32 as
#: ``-inf``'s do (``exp(-1e4)`` is 0) wherever a row keeps a key with a score above it.
MASKED_FILL = -1e4

#: The tensor layouts, and the one every tensor has when the op's ``layout`` is absent.
LAYOUTS = ("bhsd", "bshd", "bsh")
DEFAULT_LAYOUT = "bhsd,bhsd,bhsd,bhsd"


def parse_layout(text) -> tuple[str, str, str, str] | None:
    """``(q, k, v, out)`` from the op's ``layout`` (absent: all ``bhsd``); ``None`` when malformed."""
    parts = tuple((text or DEFAULT_LAYOUT).split(","))
    if len(parts) != 4 or any(part not in LAYOUTS for part in parts):
        return None
    return parts


def split_heads(shape, layout: str, heads=None):
    """``(batch, heads, seq, head size)`` of a tensor of ``shape`` in ``layout``; a ``bsh``
    tensor has ``heads`` heads (its last dim divided by them; ``None``: not divisible)."""
    if layout == "bhsd":
        return tuple(shape)
    if layout == "bshd":
        return shape[0], shape[2], shape[1], shape[3]
    hidden = shape[2]
    if not isinstance(heads, int) or heads < 1:
        return None
    if isinstance(hidden, int):
        return None if hidden % heads else (shape[0], heads, shape[1], hidden // heads)
    return shape[0], heads, shape[1], f"{hidden}/{heads}"  # a symbol (an informative name)


def merged_shape(b, h, s, d, layout: str) -> tuple:
    """The shape of a ``[b, h, s, d]`` tensor in ``layout``."""
    if layout == "bhsd":
        return (b, h, s, d)
    if layout == "bshd":
        return (b, s, h, d)
    return (b, s, h * d if isinstance(h, int) and isinstance(d, int) else f"{h}*{d}")


def packed_widths(packed) -> tuple[int, int, int] | None:
    """``(nq, nk, nv)`` from the op's ``packed`` (absent or empty: ``None``)."""
    if not packed:
        return None
    return tuple(int(w) for w in packed)


def _strides(b: int, h: int, s: int, d: int, layout: str, row: int = 0) -> tuple[int, int, int]:
    """Element strides of the batch, head and sequence axes; a batch of 1 strides 0. A
    ``bsh`` tensor's rows are ``row`` elements apart (0: ``h * d``, its own width)."""
    if layout == "bhsd":
        return (0 if b == 1 else h * s * d), s * d, d
    row = row if layout == "bsh" and row else h * d
    return (0 if b == 1 else s * row), d, row


@dataclass(frozen=True)
class AttentionShapes:
    """The concrete problem: Q ``[b, h, sq, d]``, K/V ``[.., sk, d / dv]`` and their layouts
    as strides (batch, head, sequence) and head groups, the mask's strides, ``causal``."""

    b: int
    h: int
    sq: int
    sk: int
    d: int
    dv: int
    q_strides: tuple[int, int, int]
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    o_strides: tuple[int, int, int]
    mask_strides: tuple[int, int, int, int] | None
    k_group: int = 1
    v_group: int = 1
    causal: int = 0
    causal_fill: float = float("-inf")
    mask_period: int = 0
    #: Where Q, K and V start in their inputs (elements): their columns in a packed row.
    offsets: tuple[int, int, int] = (0, 0, 0)

    @classmethod
    def of(cls, q_shape, k_shape, v_shape, mask_shape=None, layout=None, num_heads: int = 0,
           kv_num_heads: int = 0, causal: int = 0, causal_fill=None, mask_period: int = 0,
           packed=None) -> "AttentionShapes":
        """The problem of concrete shapes in ``layout`` (the op's attribute; ``None``: all
        ``bhsd``); ``num_heads`` and ``kv_num_heads`` split ``bsh`` tensors; ``packed``
        ``(nq, nk, nv)``: Q, K and V are those columns of their (``bsh``) inputs' rows, side
        by side; the other arguments are the op's attributes."""
        q_l, k_l, v_l, o_l = parse_layout(layout)
        shapes = [tuple(int(x) for x in shape) for shape in (q_shape, k_shape, v_shape)]
        widths = packed_widths(packed)
        rows, offsets = (0, 0, 0), (0, 0, 0)
        if widths is not None:
            rows = tuple(shape[2] for shape in shapes)
            offsets = (0, widths[0], widths[0] + widths[1])
            shapes = [shape[:2] + (width,) for shape, width in zip(shapes, widths)]
        heads = int(num_heads) or None
        b, h, sq, d = (int(x) for x in split_heads(shapes[0], q_l, heads))
        kv_heads = int(kv_num_heads) or h
        kb, kh, sk, _ = split_heads(shapes[1], k_l, kv_heads)
        vb, vh, _, dv = split_heads(shapes[2], v_l, kv_heads)

        mask = None
        if mask_shape is not None:
            full = (1,) * (4 - len(mask_shape)) + tuple(int(x) for x in mask_shape)
            strides, step = [0, 0, 0, 0], 1
            for axis in range(3, -1, -1):
                strides[axis] = step if full[axis] != 1 else 0
                step *= full[axis]
            mask = tuple(strides)
        return cls(b, h, sq, sk, d, dv, _strides(b, h, sq, d, q_l, rows[0]), _strides(kb, kh, sk, d, k_l, rows[1]),
                   _strides(vb, vh, sk, dv, v_l, rows[2]), _strides(b, h, sq, dv, o_l), mask,
                   max(h // max(kh, 1), 1), max(h // max(vh, 1), 1), int(causal),
                   float("-inf") if causal_fill is None else float(causal_fill), int(mask_period or 0), offsets)

    @classmethod
    def plain(cls, b, h, sq, sk, d, dv, mask_strides=None, causal: int = 0) -> "AttentionShapes":
        """Contiguous ``bhsd`` tensors of these sizes, K and V with Q's heads."""
        return cls(b, h, sq, sk, d, dv, _strides(b, h, sq, d, "bhsd"), _strides(b, h, sk, d, "bhsd"),
                   _strides(b, h, sk, dv, "bhsd"), _strides(b, h, sq, dv, "bhsd"), mask_strides, causal=causal)

    @property
    def has_mask(self) -> bool:
        return self.mask_strides is not None

    def aligned(self, elements: int) -> bool:
        """Whether every row of Q, K, V and the output starts a multiple of ``elements``
        into its buffer (offsets and strides; the head dims too): what a kernel reading rows
        in vectors of ``elements`` needs (8 for 16-byte float16 loads). Packed slices keep it
        where their column offsets do (``nq`` and ``nq + nk``, multiples of 8 in practice)."""
        steps = (*self.offsets, *self.q_strides, *self.k_strides, *self.v_strides, *self.o_strides, self.d, self.dv)
        return all(step % elements == 0 for step in steps)

    @property
    def skips_keys(self) -> bool:
        """Whether a causal kernel may leave the keys past the diagonal out: their fill is
        ``-inf``, or, with no mask to add to it, low enough to weigh nothing (see
        :data:`MASKED_FILL`)."""
        fill = self.causal_fill
        return bool(self.causal) and (fill == float("-inf") or (not self.has_mask and fill <= MASKED_FILL))

    def blocks(self, bq: int) -> int:
        """The grid for query tiles of ``bq`` rows."""
        return self.b * self.h * -(-self.sq // bq)

    def launch_list(self, kernel, bq: int, threads: int, shared_bytes: int, dtype, scale: float):
        """The tactic's ``launches(ins, outs, workspace)`` running ``kernel`` once."""
        blocks = self.blocks(bq)
        mask_strides = self.mask_strides or (0, 0, 0, 0)
        dtype_name = np.dtype(dtype).name
        ints = (self.sq, self.sk, self.h, *self.q_strides, *self.k_strides, self.k_group,
                *self.v_strides, self.v_group, *self.o_strides, *mask_strides, self.mask_period or max(self.b, 1))

        def launches(ins, outs, workspace):
            if blocks == 0 or self.dv == 0:
                return []
            q, k, v = (flat(x)[at:] if at else flat(x) for x, at in zip(ins[:3], self.offsets))  # views, no copy
            mask = flat(ins[3]) if self.has_mask else to_device(np.zeros(1, dtype_name))
            args = (flat(outs[0]), q, k, v, mask, *(np.int64(x) for x in ints), np.float32(scale))
            return [Launch(kernel, blocks, threads, args, shared_bytes)]

        return launches


@jit(device=True)
def as_is(x):
    """The identity, for :func:`tile_stager` (float32 kernels stage values unchanged)."""
    return x


@functools.lru_cache(maxsize=None)
def tile_stager(rows: int, cols: int, width: int, at: int, pitch: int, threads: int, convert):
    """``stage(smem, src, base, stride, count, scale, tid)``: copy ``rows x cols`` of ``src``
    (rows of ``cols`` elements, ``stride`` apart from ``base``; those past ``count`` read as 0) into
    ``smem[at + r * pitch + c]`` for ``c < width`` (columns past ``cols`` zero), scaled and
    passed through ``convert`` (a device function: TF32 rounding, or :func:`as_is`).
    Consecutive threads take consecutive columns (coalesced reads); when ``width`` divides
    the block each thread keeps its column (no index division)."""
    zero = float32(0.0)
    if threads % width == 0:
        step = threads // width

        @jit(device=True)
        def stage(smem, src, base, stride, count, scale, tid):
            col = tid % width
            inside = col < cols
            for r in range(tid // width, rows, step):
                value = zero
                if inside and r < count:
                    value = convert(float32(src[base + r * stride + col]) * scale)
                smem[at + r * pitch + col] = value

        return stage

    @jit(device=True)
    def stage(smem, src, base, stride, count, scale, tid):
        for e in range(tid, rows * width, threads):
            r = e // width
            col = e - r * width
            value = zero
            if col < cols and r < count:
                value = convert(float32(src[base + r * stride + col]) * scale)
            smem[at + r * pitch + col] = value

    return stage


@functools.lru_cache(maxsize=None)
def shared_vector_load(width: int, vector: bool = True):
    """``load(smem, i)``: ``smem[i : i + width]`` of a 1-D float32 array (``width`` 2 or 4)
    as a tuple; with ``vector`` one ``4 * width``-byte load (``i`` a multiple of ``width``,
    the data aligned to it), else scalar loads (always in the simulator, which runs no
    LLVM intrinsics). Indices are uint64."""
    if not vector or simulated():
        one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
        if width == 2:
            @jit(device=True)
            def load(smem, i):
                return smem[i], smem[i + one]
        else:
            @jit(device=True)
            def load(smem, i):
                return smem[i], smem[i + one], smem[i + two], smem[i + three]
        return load

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    vec = ir.VectorType(ir.FloatType(), width)

    @intrinsic
    def load(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1
                and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            offset = context.cast(builder, args[1], sig.args[1], types.uint64)
            address = builder.bitcast(builder.gep(data, [offset]), ir.PointerType(vec))
            value = builder.load(address, align=4 * width)
            items = [builder.extract_element(value, ir.Constant(ir.IntType(32), k)) for k in range(width)]
            return context.make_tuple(builder, sig.return_type, items)

        return types.UniTuple(types.float32, width)(array, index), codegen

    return load


@dataclass(frozen=True)
class WarpTiles:
    """A tensor-core kernel's tiles: ``warps`` warps of ``16 * mi`` query rows each, key
    tiles of ``bk`` (a multiple of :attr:`K_STEP`). Subclasses name the kernel
    (:attr:`PREFIX`) and its MMA's k step."""

    warps: int
    mi: int
    bk: int
    #: Ask ptxas for registers enough for this many resident blocks per SM (0: no bound).
    min_blocks: int = 0

    PREFIX: ClassVar[str] = ""
    K_STEP: ClassVar[int] = 8

    @property
    def bq(self) -> int:
        return 16 * self.mi * self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def name(self) -> str:
        return f"{self.PREFIX}_{self.bq}x{self.bk}_w{self.warps}" + (f"_b{self.min_blocks}" if self.min_blocks else "")

    def params(self) -> dict:
        return {"bq": self.bq, "bk": self.bk, "warps": self.warps, "mi": self.mi, "min_blocks": self.min_blocks}

    def check(self) -> None:
        if self.bk % self.K_STEP or self.bk < self.K_STEP or self.warps < 1 or self.mi < 1 or self.threads > 1024:
            raise ValueError(f"{self.PREFIX} attention tile {self}: bk must be a multiple of {self.K_STEP}, "
                             f"at most 32 warps")


@jit(device=True)
def block_origin(block, sq, bq, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_group, v_sb, v_sh, v_group, m_sb, m_sh,
                 m_period):
    """Where block ``block`` works (one block per ``bq`` query rows of one batch entry and
    head, heads fastest): its first row ``q0``, batch ``b``, head ``h``, and the offsets of
    its Q rows, its K and V heads (grouped heads: ``h // group``) and its mask (a window
    mask repeats over the batch every ``m_period``)."""
    qtiles = (sq + bq - 1) // bq
    bh = block // qtiles
    q0 = (block - bh * qtiles) * bq
    b = bh // heads
    h = bh - b * heads
    return (q0, b, h, b * q_sb + h * q_sh + q0 * q_ss, b * k_sb + (h // k_group) * k_sh,
            b * v_sb + (h // v_group) * v_sh, (b % m_period) * m_sb + h * m_sh)
