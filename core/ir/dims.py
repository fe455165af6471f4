"""Dimensions: an int, or a named symbol (a ``str``) for a size known only at run time.

Symbols derived from other symbols are written as small expressions (``"N*3"``); they are
informative names, never parsed. Concrete shapes always come from re-running inference
with concrete input shapes.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

Dim = Union[int, str]
Shape = tuple  # tuple[Dim, ...]


def is_static(shape: Sequence[Dim] | None) -> bool:
    """True when every dimension of ``shape`` is a concrete int."""
    return shape is not None and all(isinstance(d, int) for d in shape)


def derive(fn: Callable[..., int], *dims: Dim, label: str) -> Dim:
    """Apply ``fn`` to ``dims`` when they are all ints, else name the result symbolically."""
    if all(isinstance(d, int) for d in dims):
        return int(fn(*dims))
    return f"{label}({','.join(str(d) for d in dims)})"


def add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0:
        return b
    if b == 0:
        return a
    return f"({a}+{b})"


def mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    return f"{a}*{b}"


def prod(dims: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = mul(out, d)
    return out


def broadcast(shapes: Sequence[Sequence[Dim]]) -> tuple:
    """Numpy-style (multidirectional) broadcast of several shapes.

    :raises ValueError: when two concrete dims differ and neither is 1.
    """
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = []
        for s in shapes:
            k = axis - (rank - len(s))
            if k >= 0:
                dims.append(s[k])
        out.append(_broadcast_dims(dims, axis))
    return tuple(out)


def _broadcast_dims(dims: list, axis: int) -> Dim:
    concrete = {d for d in dims if isinstance(d, int) and d != 1}
    symbols = [d for d in dims if isinstance(d, str)]
    if len(concrete) > 1:
        raise ValueError(f"cannot broadcast dims {dims} at axis {axis}")
    if concrete:
        return concrete.pop()
    if not symbols:
        return 1
    if len(set(symbols)) == 1:
        return symbols[0]
    return f"broadcast({','.join(sorted(set(symbols)))})"


def format_shape(shape: Sequence[Dim] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join(str(d) for d in shape) + "]"


#: The largest dimension plugrt accepts (in a model, a profile or a binding): 2^31 - 1,
#: TensorRT's bound too. Kernels index with 64-bit ints, but a larger dim is a bad model.
MAX_DIM = (1 << 31) - 1
#: The largest number of elements one tensor may hold: 2^40 (4 TiB of float32).
MAX_ELEMENTS = 1 << 40


def shape_problem(shape: Sequence[Dim]) -> str | None:
    """Why a shape's concrete dims are out of bounds (negative, over :data:`MAX_DIM`, more
    than :data:`MAX_ELEMENTS` elements), or ``None`` when they are within them."""
    elements = 1
    for axis, dim in enumerate(shape):
        if isinstance(dim, str):
            continue
        dim = int(dim)
        if dim < 0:
            return f"dim {axis} is {dim}, negative"
        if dim > MAX_DIM:
            return f"dim {axis} is {dim}, over plugrt's limit of 2^31-1 = {MAX_DIM}"
        elements *= dim
    if elements > MAX_ELEMENTS:
        return f"it holds {elements} elements, over plugrt's limit of 2^40 = {MAX_ELEMENTS} per tensor"
    return None
