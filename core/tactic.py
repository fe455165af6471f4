"""Tactics: an op plugin's CUDA implementations, as data the engine chooses, records and launches.

An op plugin's ``tactics(node, inputs, outputs)`` returns :class:`Tactic` objects, best
first, for one node at **concrete** shapes (every dim an int; inputs whose values are known
at build time, such as weights and shape tensors, carry them in ``TensorInfo.value``).
``inputs`` keeps every input's position (``None`` for an omitted optional one); ``outputs``
lists the present outputs only, in order (an omitted optional output, named ``""`` in the
node, is left out: map positions through ``node.outputs``).

A tactic is a name, JSON-safe parameters, a workspace size and a ``launches`` function.
The engine calls ``launches(inputs, outputs, workspace)`` once per input-shape
specialization, with device arrays (C-contiguous, of the concrete shapes; ``None`` for an
omitted optional input or output, each in its position; ``workspace`` a uint8 device array
of ``workspace_bytes`` or ``None``) and keeps the returned :class:`Launch` list, which it replays on every
``execute``. So a launch list must depend on shapes and known values only, never on the
contents of the input tensors; any auxiliary device arrays it needs (index tables, packed
shapes) are made in ``launches`` and stay alive as arguments of the launches.

The plan file records ``name`` and ``params``; loading asks the plugin for its tactics
again and takes the one with the same name and parameters. A tactic that another plugin
contributed (a :class:`~plugrt.plugin.TacticProvider`) carries its ``source``, stamped by
the core, and its identity names that plugin too.

Whether TF32 tactics may run is decided here, once (:func:`allowed`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class Launch:
    """One kernel launch: a ``@cuda.jit`` kernel, its grid and block, and its arguments.

    ``args`` holds device arrays and NumPy scalars (``np.int64(n)``, ``np.float32(a)``:
    the scalar's type is the kernel parameter's type; plain Python ints become int64 and
    floats float64).
    """

    kernel: Any
    grid: int | tuple
    block: int | tuple
    args: tuple
    shared_bytes: int = 0


LaunchFn = Callable[[Sequence[Any], Sequence[Any], Any], Sequence[Launch]]


@dataclass
class Tactic:
    """One way to run a node on the GPU.

    :param name: unique among the tactics of one op plugin (``"direct"``, ``"tiled64x64"``).
    :param launches: ``(inputs, outputs, workspace) -> [Launch, ...]`` (see module doc).
    :param params: JSON-safe parameters (tile sizes, algorithm), recorded in plan files.
    :param workspace_bytes: scratch device memory the launches need.
    :param math: the arithmetic it uses beyond the dtype's own: ``"tf32"`` for float32
        tactics on TF32 tensor cores (allowed by ``BuilderConfig.tf32``, on by default as
        in TensorRT); ``""`` for plain arithmetic.
    """

    name: str
    launches: LaunchFn
    params: Mapping[str, Any] = field(default_factory=dict)
    workspace_bytes: int = 0
    math: str = ""
    #: Set by the core on a tactic a plugin contributed to another plugin's op:
    #: ``{"plugin", "distribution", "version", "provider_version"}``; ``None`` for the owner's.
    source: Mapping[str, Any] | None = None

    @property
    def provider(self) -> str | None:
        """The plugin that contributed this tactic, or ``None`` for the op owner's own."""
        return self.source["plugin"] if self.source else None

    def identity(self) -> dict:
        """What a plan records to find this tactic again (and who supplied it, if not the owner)."""
        found = {"name": self.name, "params": dict(self.params)}
        if self.source:
            found["provider"] = self.source["plugin"]
        return found

    def from_source(self, source: Mapping[str, Any]) -> "Tactic":
        """This tactic, stamped as contributed by ``source``."""
        return dataclasses.replace(self, source=dict(source))


#: ``Tactic.math`` of float32 tactics on TF32 tensor cores.
TF32 = "tf32"
#: Every ``Tactic.math`` value the core knows.
MATH_KINDS = ("", TF32)


def uses_tf32(tactic) -> bool:
    return getattr(tactic, "math", "") == TF32


def allowed(tactics, tf32: bool) -> list:
    """``tactics`` in order, less those on TF32 tensor cores when ``tf32`` is off
    (``BuilderConfig.tf32``, ``--no-tf32``): the one place that decides it."""
    return [t for t in tactics if tf32 or not uses_tf32(t)]
