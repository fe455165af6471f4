"""Einsum: the equation parsed into labelled axes, and the generic kernel that computes any of them.

:func:`parse_equation` turns an ONNX/NumPy equation into one label per operand axis (a
letter, or ``".k"`` for the k-th of the broadcast ellipsis dims, right-aligned) and the
output's labels. :func:`einsum_plan` gives the kernel its int64 tables: the size of every
label (output labels first, then the contracted ones) and each operand's element stride
per label (a letter repeated in one operand, a diagonal, gets the sum of its strides; a
broadcast dim of 1 gets 0). :func:`einsum_kernel` runs one thread per output element
and loops over every combination of the contracted labels; one compiled kernel per
(operand count, dtype) serves every equation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from plugrt.kernels import c_strides, cuda, jit
from plugrt.plugin import dims

#: The most operands the kernel takes.
MAX_OPERANDS = 4
#: ``meta`` slots: output labels, all labels, output elements, contracted combinations.
N_OUT, N_LABELS, OUT_TOTAL, CON_TOTAL = range(4)

_ELLIPSIS = "..."


@dataclass(frozen=True)
class Equation:
    """A parsed equation: each operand's label per axis, and the output's labels."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]

    def contracted(self) -> tuple[str, ...]:
        """The labels summed over, in order of first appearance."""
        seen = []
        for labels in self.inputs:
            for label in labels:
                if label not in self.output and label not in seen:
                    seen.append(label)
        return tuple(seen)


def _split_term(term: str, what: str) -> tuple[bool, str]:
    """``(has ellipsis, letters)`` of one term; raises ValueError on a malformed one."""
    if term.count(_ELLIPSIS) > 1:
        raise ValueError(f"{what} {term!r} has more than one ellipsis")
    letters = term.replace(_ELLIPSIS, "")
    bad = sorted({c for c in letters if not ("a" <= c <= "z" or "A" <= c <= "Z")})
    if bad:
        raise ValueError(f"{what} {term!r} has characters {bad} (only letters and one '...' are allowed)")
    return _ELLIPSIS in term, letters


def parse_equation(equation: str, ranks) -> Equation:
    """Parse ``equation`` for operands of ``ranks``; raises ValueError saying what is wrong."""
    if not isinstance(equation, str):
        raise ValueError(f"equation must be a string, got {type(equation).__name__}")
    text = equation.replace(" ", "")
    if not text:
        raise ValueError("the equation is empty")
    if text.count("->") > 1:
        raise ValueError(f"equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = text.partition("->")
    if "-" in lhs or ">" in lhs or "," in rhs:
        raise ValueError(f"equation {equation!r} is malformed")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} has {len(terms)} operand terms for {len(ranks)} inputs")
    parsed = [_split_term(term, f"operand {i} term") for i, term in enumerate(terms)]
    ellipsis_ranks = []
    for i, ((has_ellipsis, letters), rank) in enumerate(zip(parsed, ranks)):
        extra = rank - len(letters)
        if extra < 0 or (extra and not has_ellipsis):
            raise ValueError(f"operand {i} term {terms[i]!r} has {len(letters)} letters for an input of rank {rank}")
        ellipsis_ranks.append(extra)
    n_ellipsis = max(ellipsis_ranks, default=0)
    ellipsis_labels = tuple(f".{k}" for k in range(n_ellipsis))
    inputs = []
    for (has_ellipsis, _), term, extra in zip(parsed, terms, ellipsis_ranks):
        head, _, tail = term.partition(_ELLIPSIS) if has_ellipsis else (term, "", "")
        inputs.append(tuple(head) + ellipsis_labels[n_ellipsis - extra:] + tuple(tail))
    letters = [c for _, term_letters in parsed for c in term_letters]
    if arrow:
        has_ellipsis, out_letters = _split_term(rhs, "output term")
        repeated = sorted({c for c in out_letters if out_letters.count(c) > 1})
        missing = sorted(set(out_letters) - set(letters))
        if repeated or missing:
            raise ValueError(f"output term {rhs!r}: " + (f"letters {repeated} repeated" if repeated
                                                         else f"letters {missing} appear in no operand"))
        if n_ellipsis and not has_ellipsis:
            raise ValueError(f"output term {rhs!r} needs '...' for the operands' ellipsis dims")
        head, _, tail = rhs.partition(_ELLIPSIS) if has_ellipsis else (rhs, "", "")
        output = tuple(head) + ellipsis_labels + tuple(tail)
    else:
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        output = ellipsis_labels + tuple(once)
    return Equation(tuple(inputs), output)


def label_sizes(equation: Equation, shapes) -> dict:
    """Each label's size (symbolic dims allowed; dims of 1 broadcast, as NumPy's einsum does).

    :raises ValueError: naming the label whose dims differ.
    """
    found: dict[str, list] = {}
    for labels, shape in zip(equation.inputs, shapes):
        for label, dim in zip(labels, shape):
            found.setdefault(label, []).append(dim)
    sizes = {}
    for label, seen in found.items():
        try:
            (sizes[label],) = dims.broadcast([(d,) for d in seen])
        except ValueError:
            name = f"ellipsis dim {label[1:]}" if label.startswith(".") else f"letter {label!r}"
            raise ValueError(f"{name} has mismatched dims {seen}") from None
    return sizes


def einsum_plan(equation: Equation, shapes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(meta, sizes, strides)``: the kernel's int64 tables for concrete ``shapes``."""
    size_of = label_sizes(equation, shapes)
    order = equation.output + equation.contracted()
    sizes = np.array([int(size_of[label]) for label in order] or [1], dtype=np.int64)
    strides = np.zeros((MAX_OPERANDS, max(len(order), 1)), dtype=np.int64)
    for op, (labels, shape) in enumerate(zip(equation.inputs, shapes)):
        for label, dim, stride in zip(labels, shape, c_strides(shape)):
            if dim != 1 or size_of[label] == 1:
                strides[op, order.index(label)] += stride
    out_total = int(np.prod([size_of[label] for label in equation.output], dtype=np.int64))
    con_total = int(np.prod([size_of[label] for label in equation.contracted()], dtype=np.int64))
    meta = np.array([len(equation.output), len(order), out_total, con_total], dtype=np.int64)
    return meta, sizes, strides.reshape(-1)


def matmul_form(equation: Equation, shapes) -> tuple[list | None, list | None] | None:
    """``(perm_a, perm_b)`` when the equation is ``matmul(transpose(A, perm_a),
    transpose(B, perm_b))`` (``None``: as stored), batch dims broadcast as numpy.matmul's,
    else ``None``: two operands without diagonals, one contracted letter shared by both,
    the output ``batch + (m, n)`` with each operand's batch letters a suffix of it."""
    if len(equation.inputs) != 2 or len(equation.output) < 2:
        return None
    a, b = equation.inputs
    (*batch, m, n), contracted = equation.output, equation.contracted()
    if len(set(a)) != len(a) or len(set(b)) != len(b) or len(contracted) != 1:
        return None
    k = contracted[0]
    if not ({m, k} <= set(a) and {k, n} <= set(b)) or n in a or m in b:
        return None
    perms = []
    for labels, shape, pair in ((a, shapes[0], (m, k)), (b, shapes[1], (k, n))):
        own = [label for label in batch if label in labels]
        if len(own) + 2 != len(labels) or (own and own != batch[len(batch) - len(own):]):
            return None
        perm = [labels.index(label) for label in own + list(pair)]
        perms.append(None if perm == sorted(perm) else perm)
    if shapes[0][a.index(k)] != shapes[1][b.index(k)]:  # einsum broadcasts a 1 there, matmul does not
        return None
    return perms[0], perms[1]


def accumulator_type(dtype) -> type:
    """What the kernel sums ``dtype`` in: float32 for float16 and float32, else the dtype."""
    dtype = np.dtype(dtype)
    return np.float32 if dtype == np.float16 else dtype.type


@functools.lru_cache(maxsize=None)
def einsum_kernel(n_operands: int, dtype):
    """The kernel for ``n_operands`` (1 to 4) of ``dtype``.

    Arguments: ``(out, x0, x1, x2, x3, meta, sizes, strides)``, every array flat; operands
    past ``n_operands`` are never read (pass any array of the dtype).
    """
    if not 1 <= n_operands <= MAX_OPERANDS:
        raise ValueError(f"the einsum kernel takes 1 to {MAX_OPERANDS} operands, not {n_operands}")
    ACC = accumulator_type(dtype)
    ZERO = ACC(0)
    NOPS = n_operands

    def kernel(out, x0, x1, x2, x3, meta, sizes, strides):
        n_out, n_lab = meta[N_OUT], meta[N_LABELS]
        out_total, con_total = meta[OUT_TOTAL], meta[CON_TOTAL]
        for o in range(cuda.grid(1), out_total, cuda.gridsize(1)):
            b0 = b1 = b2 = b3 = np.int64(0)
            rest = o
            for k in range(n_out):
                label = n_out - 1 - k
                size = sizes[label]
                v = rest % size
                rest = rest // size
                b0 += v * strides[label]
                if NOPS > 1:
                    b1 += v * strides[n_lab + label]
                if NOPS > 2:
                    b2 += v * strides[2 * n_lab + label]
                if NOPS > 3:
                    b3 += v * strides[3 * n_lab + label]
            total = ZERO
            for c in range(con_total):
                p0, p1, p2, p3 = b0, b1, b2, b3
                rest = c
                for k in range(n_lab - n_out):
                    label = n_lab - 1 - k
                    size = sizes[label]
                    v = rest % size
                    rest = rest // size
                    p0 += v * strides[label]
                    if NOPS > 1:
                        p1 += v * strides[n_lab + label]
                    if NOPS > 2:
                        p2 += v * strides[2 * n_lab + label]
                    if NOPS > 3:
                        p3 += v * strides[3 * n_lab + label]
                term = ACC(x0[p0])
                if NOPS > 1:
                    term = ACC(term * ACC(x1[p1]))
                if NOPS > 2:
                    term = ACC(term * ACC(x2[p2]))
                if NOPS > 3:
                    term = ACC(term * ACC(x3[p3]))
                total = ACC(total + term)
            out[o] = total

    kernel.__name__ = f"einsum_{NOPS}_{np.dtype(dtype).name}"
    return jit(kernel)
