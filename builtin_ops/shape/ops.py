"""Data movement that keeps the elements' order: Reshape, Flatten, Squeeze/Unsqueeze,
Identity, Dropout; and what every op module of the shape family shares (reading
shape-like inputs and axes, the :class:`MoveOp` and :class:`CopyOp` bases).

The other op modules: :mod:`.movement_ops` (Transpose, Concat, Split, Slice, Gather,
GatherElements, Expand, Tile), :mod:`.indexed_ops` (GatherND, ReverseSequence),
:mod:`.generator_ops` (Shape, Size, Constant, ConstantOfShape, Range, OneHot, Trilu,
EyeLike, NonZero) and :mod:`.scatter_ops` (ScatterElements, Scatter, ScatterND). Their
CUDA kernels: :mod:`.copies`, :mod:`.transpose`, :mod:`.generators` and :mod:`.scatter`.

Shape-like inputs (Reshape's shape, Slice's starts, Unsqueeze's axes, ...) are read from
``TensorInfo.value`` when known, giving exact output shapes; when unknown the output keeps
the right rank with fresh symbolic dims named ``{node}_d{axis}``.

Attribute-to-input moves: Reshape's shape (input from 5), Slice's starts/ends/axes (10),
Split's split and Squeeze/Unsqueeze's axes (13). The older forms are implemented too.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import FLOAT_DTYPES, SHAPE, Attr, OpPlugin, TensorInfo, dims, optional

from . import copies

INT64 = np.dtype("int64")
BOOL = np.dtype(bool)
_MOVES = frozenset({SHAPE})


def fresh_dim(node, axis: int, tag: str = "") -> str:
    return f"{node.name}{tag}_d{axis}"


def as_ints(array) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def known_ints(info):
    """The known value of an optional shape-like input as a list of ints (None if unknown)."""
    return None if info is None or info.value is None else as_ints(info.value)


def normalize_axis(node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{node.describe()}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(node, axes, rank: int) -> list[int]:
    out = [normalize_axis(node, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{node.describe()}: axes {list(axes)} repeat an axis")
    return out


def static_length(op, node, info, what: str) -> int:
    """The static element count of a 1-D shape-like input (its value may be unknown)."""
    if info.rank > 1 or not info.is_static:
        raise op.unsupported(node, f"a {what} input of shape {dims.format_shape(info.shape)}",
                             "its length must be known to infer the output's rank")
    return int(np.prod(info.shape, dtype=np.int64))


def require_int(op, node, inputs, which, allowed=frozenset({INT64})):
    op.require_dtypes(node, inputs, allowed, which)


def concrete_shapes(tactics):
    """Wrap an op's ``tactics`` to refuse shapes still symbolic at build time, which is
    how an output shape that depends on a runtime input's values (a Squeeze's axes, a
    Tile's repeats fed as graph inputs) reaches it."""

    @functools.wraps(tactics)
    def checked(self, node, inputs, outputs):
        for info in [*inputs, *outputs]:
            if info is not None and not info.is_static:
                raise self.unsupported(node, f"a tensor of shape {dims.format_shape(info.shape)} not known at build time",
                                       "make the shape operands constants or shape-tensor inputs")
        return tactics(self, node, inputs, outputs)

    return checked


class MoveOp(OpPlugin):
    groups = _MOVES


def same_shape(op, node, inputs) -> int | None:
    """``forwards`` of an op that only reshapes: input 0 when the output's inferred shape is
    the input's (a symbolic dim matches only the same symbol), else ``None``."""
    return 0 if tuple(op.infer(node, list(inputs))[0].shape) == tuple(inputs[0].shape) else None


class CopyOp(MoveOp):
    """An op whose output holds the input's elements in the same order (a new shape): an
    alias of the input in the engine; the copy kernel runs where the engine cannot alias."""

    def forwards(self, node, inputs):
        return same_shape(self, node, inputs)

    def aliases(self, node, inputs):
        return 0

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        return [copies.copy_tactic()]


# ---------------------------------------------------------------------------------- reshaping


class Flatten(CopyOp):
    op_type = "Flatten"
    attributes = (Attr("axis", "int", 1),)

    def infer(self, node, inputs):
        x = inputs[0]
        axis = node.attrs["axis"]
        if not -x.rank <= axis <= x.rank:
            raise ShapeError(f"{node.describe()}: axis {axis} is out of range for rank {x.rank}")
        axis = axis + x.rank if axis < 0 else axis
        return [TensorInfo(x.dtype, (dims.prod(x.shape[:axis]), dims.prod(x.shape[axis:])))]

    def reference(self, node, inputs):
        x = inputs[0]
        axis = node.attrs["axis"]
        axis = axis + x.ndim if axis < 0 else axis
        return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


def _quotient(node, numer, denom, index):
    """prod(numer) / prod(denom) over possibly symbolic dims, cancelling common factors."""
    numer = list(numer)
    rest = []
    for d in denom:
        if d in numer and not (isinstance(d, int) and d == 0):
            numer.remove(d)
        else:
            rest.append(d)
    num_int = math.prod(d for d in numer if isinstance(d, int))
    den_int = math.prod(d for d in rest if isinstance(d, int))
    symbols = [d for d in numer if isinstance(d, str)]
    if any(isinstance(d, str) for d in rest):
        return fresh_dim(node, index)
    if den_int == 0:
        raise ShapeError(f"{node.describe()}: cannot infer the -1 dim next to a 0 dim")
    if num_int % den_int:
        if symbols:
            return fresh_dim(node, index)
        raise ShapeError(f"{node.describe()}: {num_int} elements do not divide into blocks of {den_int}")
    return dims.mul(dims.prod(symbols), num_int // den_int)


def reshape_dims(node, in_shape, target) -> tuple:
    """Reshape's output dims for ``target`` (with 0 and -1 entries) of an input shape."""
    allowzero = node.attrs["allowzero"]
    out, infer_at = [], None
    for i, t in enumerate(target):
        if t == -1:
            if infer_at is not None:
                raise ShapeError(f"{node.describe()}: shape {target} has more than one -1")
            infer_at = i
            out.append(None)
        elif t == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeError(f"{node.describe()}: shape {target} copies dim {i} of a rank-{len(in_shape)} input")
            out.append(in_shape[i])
        elif t < 0:
            raise ShapeError(f"{node.describe()}: invalid shape entry {t} in {target}")
        else:
            out.append(t)
    if infer_at is not None:
        if allowzero and 0 in target:
            raise ShapeError(f"{node.describe()}: allowzero=1 shape {target} has both 0 and -1")
        out[infer_at] = _quotient(node, in_shape, [d for d in out if d is not None], infer_at)
    elif dims.is_static(in_shape) and dims.is_static(out) and math.prod(in_shape) != math.prod(out):
        raise ShapeError(f"{node.describe()}: cannot reshape {dims.format_shape(in_shape)} to {target}")
    return tuple(out)


class Reshape(CopyOp):
    op_type = "Reshape"
    attributes = (Attr("shape", "ints", None), Attr("consumed_inputs", "ints", None), Attr("allowzero", "int", 0))
    inputs = (1, 2)

    def check(self, node, inputs):
        if node.opset >= 5:
            if optional(inputs, 1) is None:
                raise ModelError(f"{node.describe()}: the shape input is required from opset 5")
            require_int(self, node, inputs, [1])
        elif node.attrs["shape"] is None:
            raise ModelError(f"{node.describe()}: the shape attribute is required before opset 5")

    def infer(self, node, inputs):
        x = inputs[0]
        target = node.attrs["shape"] if node.opset < 5 else known_ints(inputs[1])
        if target is None:
            rank = static_length(self, node, inputs[1], "Reshape shape")
            return [TensorInfo(x.dtype, tuple(fresh_dim(node, i) for i in range(rank)))]
        return [TensorInfo(x.dtype, reshape_dims(node, x.shape, target))]

    def reference(self, node, inputs):
        x = inputs[0]
        target = node.attrs["shape"] if node.opset < 5 else as_ints(inputs[1])
        return [x.reshape(reshape_dims(node, x.shape, target))]


class Squeeze(CopyOp):
    op_type = "Squeeze"
    attributes = (Attr("axes", "ints", None),)
    inputs = (1, 2)

    def check(self, node, inputs):
        require_int(self, node, inputs, [1])

    def _kept(self, node, shape, axes):
        """Indices of the dims kept; without axes, symbolic dims are assumed not to be 1."""
        if axes is None:
            return [i for i, d in enumerate(shape) if d != 1]
        axes = normalize_axes(node, axes, len(shape))
        for a in axes:
            if isinstance(shape[a], int) and shape[a] != 1:
                raise ShapeError(f"{node.describe()}: cannot squeeze axis {a} of size {shape[a]}")
        return [i for i in range(len(shape)) if i not in axes]

    def infer(self, node, inputs):
        x = inputs[0]
        if node.opset < 13:
            axes = node.attrs["axes"] or None
        else:
            second = optional(inputs, 1)
            axes = known_ints(second) if second is not None else None
            if second is not None and axes is None:
                rank = x.rank - static_length(self, node, second, "Squeeze axes")
                return [TensorInfo(x.dtype, tuple(fresh_dim(node, i) for i in range(rank)))]
        return [TensorInfo(x.dtype, tuple(x.shape[i] for i in self._kept(node, x.shape, axes)))]

    def forwards(self, node, inputs):
        given = node.attrs["axes"] if node.opset < 13 else optional(inputs, 1)
        if not given and not inputs[0].is_static:
            return None  # without axes, a symbolic dim of 1 at run time would be squeezed
        return same_shape(self, node, inputs)

    def reference(self, node, inputs):
        x = inputs[0]
        if node.opset < 13:
            axes = node.attrs["axes"] or None
        else:
            axes = None if optional(inputs, 1) is None else as_ints(inputs[1])
        return [x.reshape(tuple(x.shape[i] for i in self._kept(node, x.shape, axes)))]


class Unsqueeze(CopyOp):
    op_type = "Unsqueeze"
    attributes = (Attr("axes", "ints", None),)
    inputs = (1, 2)

    def check(self, node, inputs):
        if node.opset >= 13:
            if optional(inputs, 1) is None:
                raise ModelError(f"{node.describe()}: the axes input is required from opset 13")
            require_int(self, node, inputs, [1])
        elif node.attrs["axes"] is None:
            raise ModelError(f"{node.describe()}: the axes attribute is required before opset 13")

    @staticmethod
    def shape(node, shape, axes):
        rank = len(shape) + len(axes)
        axes = set(normalize_axes(node, axes, rank))
        rest = iter(shape)
        return tuple(1 if i in axes else next(rest) for i in range(rank))

    def infer(self, node, inputs):
        x = inputs[0]
        axes = node.attrs["axes"] if node.opset < 13 else known_ints(inputs[1])
        if axes is None:
            rank = x.rank + static_length(self, node, inputs[1], "Unsqueeze axes")
            return [TensorInfo(x.dtype, tuple(fresh_dim(node, i) for i in range(rank)))]
        return [TensorInfo(x.dtype, self.shape(node, x.shape, axes))]

    def reference(self, node, inputs):
        x = inputs[0]
        axes = node.attrs["axes"] if node.opset < 13 else as_ints(inputs[1])
        return [x.reshape(self.shape(node, x.shape, axes))]


class Identity(CopyOp):
    op_type = "Identity"

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape, x.value)]

    def reference(self, node, inputs):
        return [inputs[0].copy()]

    def forwards(self, node, inputs):
        return 0


class Dropout(OpPlugin):
    """Inference-mode Dropout: the output is the input, the optional mask all True (ones of
    the input dtype before opset 10). Training mode with a nonzero ratio is refused."""

    op_type = "Dropout"
    attributes = (
        Attr("is_test", "int", 0), Attr("consumed_inputs", "ints", None),
        Attr("ratio", "float", 0.5), Attr("seed", "int", None),
    )
    inputs = (1, 3)
    outputs = (1, 2)
    dtypes = FLOAT_DTYPES | {BOOL}

    def _training(self, node, ratio, training) -> bool:
        """Whether this run drops anything; ratio/training are arrays, or None when absent."""
        if node.opset < 7:
            return not node.attrs["is_test"] and node.attrs["ratio"] != 0
        if node.opset < 12:
            return False
        ratio = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        return training is not None and bool(np.asarray(training).reshape(-1)[0]) and ratio != 0

    def _refuse(self, node):
        return self.unsupported(node, "training mode (random dropping)",
                                "export the model for inference (training_mode=False / is_test=1)")

    def check(self, node, inputs):
        self.require_dtypes(node, inputs, FLOAT_DTYPES, [0, 1])
        self.require_dtypes(node, inputs, {BOOL}, [2])
        ratio, training = optional(inputs, 1), optional(inputs, 2)
        if ratio is not None and ratio.value is None:
            return
        if training is not None and training.value is None:
            return
        if self._training(node, None if ratio is None else ratio.value,
                          None if training is None else training.value):
            raise self._refuse(node)

    def forwards(self, node, inputs):
        """Input 0 when this run drops nothing: inference mode (no training_mode input, or a
        constant false one) or a constant ratio of 0. The core checks the mask is unused."""
        ratio, training = optional(inputs, 1), optional(inputs, 2)
        if node.opset < 12:
            ratio = training = None  # ignored before opset 12
        if training is not None and training.value is None:
            return None
        if training is not None and ratio is not None and ratio.value is None and bool(np.any(training.value)):
            return None
        dropping = self._training(node, None if ratio is None else ratio.value,
                                  None if training is None else training.value)
        return None if dropping else 0

    def infer(self, node, inputs):
        x = inputs[0]
        mask = BOOL if node.opset >= 10 else x.dtype
        return [TensorInfo(x.dtype, x.shape), TensorInfo(mask, x.shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        if self._training(node, optional(inputs, 1), optional(inputs, 2)):
            raise self._refuse(node)
        mask = np.ones(x.shape, dtype=BOOL if node.opset >= 10 else x.dtype)
        return [x.copy(), mask]

    @concrete_shapes
    def tactics(self, node, inputs, outputs):
        training = optional(inputs, 2) if node.opset >= 12 else None
        ratio = optional(inputs, 1) if node.opset >= 12 else None
        return [copies.dropout_tactic(inputs[0].dtype, training, ratio)]


OPS = (Flatten, Reshape, Squeeze, Unsqueeze, Identity, Dropout)
