"""TensorInfo: what the IR knows of a tensor before running (dtype, shape, constant value)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from plugrt.ir.dims import format_shape, is_static


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """What is known about a tensor before running: dtype, shape and, if constant, value.

    ``shape`` holds ints and symbol names (see :mod:`plugrt.ir.dims`). ``value`` is set
    when the tensor is a known constant (an initializer, or computed from constants, as
    shape computations are); shape-computing ops read it, e.g. Reshape's target shape.
    """

    dtype: np.dtype
    shape: tuple
    value: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return is_static(self.shape)

    def with_value(self, value: np.ndarray | None) -> "TensorInfo":
        return dataclasses.replace(self, value=value)

    def same_type(self, other: "TensorInfo") -> bool:
        return self.dtype == other.dtype and self.shape == other.shape

    def __repr__(self) -> str:
        known = ", const" if self.value is not None else ""
        return f"TensorInfo({self.dtype}, {format_shape(self.shape)}{known})"

    @classmethod
    def of(cls, array: np.ndarray) -> "TensorInfo":
        """The info of a concrete array, value included."""
        array = np.asarray(array)
        return cls(array.dtype, array.shape, array)
