"""The op plugin interface: what a plugin implements so the core can use its op.

A plugin package returns instances of :class:`OpPlugin` subclasses from its
``plugrt_ops`` hook. The core never knows any op's math; it reads the class attributes
below, validates nodes against them, and calls the methods.

Lifecycle of a node, and the plugin methods the core calls on the way:

1. import: :meth:`OpPlugin.declines` (leave a function op's node to its ONNX body), then
   :attr:`OpPlugin.attributes` validate and default the node's attributes;
2. inference: :meth:`OpPlugin.check` (refuse what the plugin declares unsupported), then
   :meth:`OpPlugin.infer` (output dtypes and shapes, symbolic dims allowed);
3. constant folding, reference execution, calibration: :meth:`OpPlugin.reference`;
4. graph passes: :meth:`OpPlugin.forwards` (the node is a no-op the core may remove),
   :meth:`OpPlugin.as_scale` and :meth:`OpPlugin.fold_scale` (a per-channel scale and shift,
   such as an inference BatchNormalization, folded into an anchor's weights);
   ``foldable`` (whether constant folding may run the reference);
5. engine build: :meth:`OpPlugin.aliases` (the layer's output is an input's bytes: it runs
   no kernel), :meth:`OpPlugin.tactics` (CUDA implementations; anchors also accept an
   epilogue), :meth:`OpPlugin.pointwise` (a scalar device function the core fuses into
   chains and epilogues);
6. plan files: :meth:`OpPlugin.serialize` (extra JSON-safe data; never pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np

from plugrt.errors import UnsupportedError
from plugrt.ir import dims
from plugrt.fusion.codegen import pointwise_tactic, pointwise_tactics
from plugrt.ir.tensor import TensorInfo
from plugrt.tactic import Launch, Tactic

if TYPE_CHECKING:
    from plugrt.ir.graph import Node

#: Sentinel default of an attribute the node must carry.
REQUIRED = object()

ATTRIBUTE_KINDS = ("int", "float", "string", "ints", "floats", "strings", "tensor", "graph")

#: The open upper bound of ``inputs``/``outputs`` for variadic ops.
VARIADIC = 2**31 - 1

#: Where a plugin's graph pass runs (:class:`GraphPass`).
PASS_STAGES = ("cleanup", "fusion", "quantize", "bindings")

#: Op groups the core's rules refer to (fusion, folding).
POINTWISE = "pointwise"
REDUCTION = "reduction"
SHAPE = "shape"
ANCHOR = "anchor"
NORMALIZATION = "normalization"
#: An op that converts a tensor to another dtype (:meth:`OpPlugin.conversion`): the
#: builder's precision step inserts it where layers of two precisions meet.
CONVERT = "convert"

FLOAT_DTYPES = frozenset(np.dtype(t) for t in ("float16", "float32", "float64"))
INT_DTYPES = frozenset(np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"))
NUMERIC_DTYPES = FLOAT_DTYPES | INT_DTYPES
ALL_DTYPES = NUMERIC_DTYPES | {np.dtype(bool)}


@dataclass(frozen=True)
class Attr:
    """One attribute an op accepts: its ONNX kind and default (``REQUIRED`` if none)."""

    name: str
    kind: str
    default: Any = None

    def __post_init__(self):
        if self.kind not in ATTRIBUTE_KINDS:
            raise ValueError(f"attribute {self.name!r}: kind must be one of {ATTRIBUTE_KINDS}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def optional(inputs: Sequence, index: int):
    """The input at ``index``, or ``None`` when the node omits that optional input."""
    return inputs[index] if index < len(inputs) else None


def canonical_domain(domain: str) -> str:
    """``""`` for the default ONNX domain however it is spelled (``""`` or ``"ai.onnx"``)."""
    return "" if domain in ("", "ai.onnx") else domain


class OpIdentity:
    """Which nodes a plugin object serves: ``domain::op_type`` at opsets ``since_opset`` to
    ``until_opset`` (inclusive, ``None`` for open), and its own ``version``. Shared by op
    plugins and tactic providers."""

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    since_opset: ClassVar[int] = 1
    until_opset: ClassVar[int | None] = None
    version: ClassVar[str] = "1.0"
    #: Earlier ``version``s whose plans this one still runs unchanged (attributes added
    #: since default to what those versions did); a plan of any other version is refused.
    loads_versions: ClassVar[tuple[str, ...]] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    def supports_opset(self, opset: int) -> bool:
        return self.since_opset <= opset and (self.until_opset is None or opset <= self.until_opset)

    def serves(self, domain: str, op_type: str, opset: int) -> bool:
        """Whether nodes of ``domain::op_type`` at ``opset`` are this object's."""
        return (canonical_domain(self.domain) == canonical_domain(domain) and self.op_type == op_type
                and self.supports_opset(opset))


class OpPlugin(OpIdentity):
    """Base class of every op plugin. Subclass it, set the class attributes, implement
    :meth:`infer` and :meth:`reference`, and return an instance from ``plugrt_ops``.

    Class attributes:

    - ``op_type``, ``domain`` (``""`` is the default ONNX domain): which nodes it handles;
    - ``since_opset``, ``until_opset`` (inclusive, ``None`` for open): the opset versions
      of that domain it implements;
    - ``version``: the plugin's own version of this op, recorded in plan files;
      ``loads_versions``: the earlier versions whose plans it still runs;
    - ``attributes``: the :class:`Attr` it accepts; others are refused at import;
    - ``inputs``, ``outputs``: ``(min, max)`` counts, optional ones included;
    - ``groups``: names from this module (``POINTWISE``, ``REDUCTION``, ...) for fusion rules;
    - ``dtypes``: the input dtypes it accepts; the core refuses others before ``check``;
    - ``foldable``: ``False`` for ops whose outputs differ from run to run (random
      generators); constant folding and value propagation never run their reference;
    - ``commutative``: its two inputs may be swapped (Add, Mul); pattern rewrites
      (:mod:`plugrt.passes.pattern`) then match them in either order.

    Groups the core's passes read: ``POINTWISE`` (with :meth:`pointwise`: fused into chains
    and epilogues), ``ANCHOR`` (its :meth:`tactics` accept an ``epilogue``), ``CONVERT``
    (with :meth:`conversion`: the builder's dtype conversions).
    """

    attributes: ClassVar[tuple[Attr, ...]] = ()
    inputs: ClassVar[tuple[int, int]] = (1, 1)
    outputs: ClassVar[tuple[int, int]] = (1, 1)
    groups: ClassVar[frozenset[str]] = frozenset()
    dtypes: ClassVar[frozenset[np.dtype]] = ALL_DTYPES
    foldable: ClassVar[bool] = True
    commutative: ClassVar[bool] = False

    # ----------------------------------------------------------------- identity

    def __repr__(self) -> str:
        until = self.until_opset if self.until_opset is not None else ""
        domain = self.domain or "ai.onnx"
        return f"<{type(self).__name__} {domain}::{self.op_type} opset {self.since_opset}-{until}>"

    # ----------------------------------------------------------------- inference

    def check(self, node: "Node", inputs: Sequence[TensorInfo | None]) -> None:
        """Refuse what this plugin does not implement, by raising :class:`UnsupportedError`
        (use :meth:`unsupported`). Called before :meth:`infer`; the default accepts all."""

    def declines(self, node: "Node") -> str | None:
        """For an op ONNX defines as a function: why this plugin leaves ``node`` (no shapes
        known) to the function body, which the importer then expands; ``None``: it takes it."""

    def infer(self, node: "Node", inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        """Return the outputs' dtypes and shapes (symbolic dims allowed).

        ``inputs`` has one entry per input the node names, ``None`` for an omitted
        optional input. An output may carry ``value`` when it is computable from the
        inputs' values; the core also derives values itself by running :meth:`reference`
        on small constant inputs.
        """
        raise NotImplementedError(f"{type(self).__name__}.infer")

    def reference(self, node: "Node", inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Compute the outputs with NumPy, following the ONNX specification.

        This is the ground truth for tests, constant folding and calibration.
        """
        raise NotImplementedError(f"{type(self).__name__}.reference")

    # ----------------------------------------------------------------- graph passes

    def forwards(self, node: "Node", inputs: Sequence[TensorInfo | None]) -> int | None:
        """Return the index of the input that output 0 always equals, or ``None``.

        A node that forwards an input unchanged (Identity, an inference-time Dropout, a
        Reshape to the shape it already has, a Cast to the dtype it already has) is removed
        by the core, its consumers reading that input instead. Only output 0 may be used
        by the graph (other outputs must be unused); the core checks that. ``inputs`` carry
        shapes (maybe symbolic) and, for constants, values.
        """
        return None

    def conversion(self, dtype: np.dtype) -> "Mapping[str, Any] | None":
        """``CONVERT`` ops: the attributes of a node of this op (one input, one output)
        that converts its input to ``dtype``; ``None`` when it cannot."""
        return None

    def as_scale(self, node: "Node", inputs: Sequence[TensorInfo | None]) -> "Scale | None":
        """Return a :class:`Scale` when output 0 is ``inputs[k] * scale + shift`` with constant
        ``scale`` and ``shift`` (an inference BatchNormalization; Mul, Add, Sub or Div by a
        constant), or ``None``. The core folds such a node into a preceding anchor through
        that anchor's :meth:`fold_scale`.
        """
        return None

    def fold_scale(self, node: "Node", inputs: Sequence[TensorInfo | None], output: TensorInfo,
                   scale: np.ndarray, shift: np.ndarray) -> dict[int, np.ndarray] | None:
        """Absorb ``y * scale + shift`` into this node's constant inputs, or return ``None``.

        ``scale`` and ``shift`` broadcast (NumPy rules) against ``output``, this node's
        output 0. Return new constant arrays by input index (an index the node omits, such
        as an absent bias, adds that input) such that the node then computes
        ``node(x) * scale + shift``; return ``None`` when they vary along an axis the
        weights cannot express or the weights are not constants.
        """
        return None

    # ----------------------------------------------------------------- engine

    def aliases(self, node: "Node", inputs: Sequence[TensorInfo | None]) -> int | None:
        """Return the index of the input whose bytes output 0 is, under its own shape, or ``None``.

        Say so when output 0 always holds the same dtype and the same elements in the same
        row-major order as that input (Reshape, Flatten, Squeeze, Unsqueeze, Identity), at
        every shape the node may take. The builder then runs the layer as an alias: no
        kernel, no copy, its output a view of the input's device buffer. Where the bytes
        cannot be shared (an engine output over an engine input or a weight) the layer runs
        one of :meth:`tactics`, so keep offering a copy. Only output 0 may be used; the core
        checks that, and the dtypes and element counts. Unlike :meth:`forwards` the node
        stays (the shapes differ); shapes here are concrete.
        """
        return None

    def output_bounds(self, node: "Node", inputs: Sequence[TensorInfo]) -> list[tuple[int, ...]] | None:
        """Data-dependent outputs (NonZero's): each output's largest shape at these input
        shapes, or ``None`` (the default). Such a node's tactics get one more output, int64
        with an element per output dim, to write the outputs' actual shapes into; each output
        is written C-contiguous at its actual shape (docs/PLUGIN_API.md, "Data-dependent")."""
        return None

    def tactics(self, node: "Node", inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo],
                epilogue=None, wanted=None) -> list:
        """Return the CUDA implementations (:class:`plugrt.tactic.Tactic`) of this node, best first.

        Shapes are concrete here; inputs known at build time carry their ``value``. The
        default wraps :meth:`pointwise` in the toolkit's broadcasting elementwise kernel.

        Plugins in the ``ANCHOR`` group accept an ``epilogue``
        (:class:`plugrt.kernels.Epilogue`): every tactic they return then applies it to each
        output element before the store (see that class for the contract). Others are never
        given one. One naming a ``wanted`` parameter gets, when a new shape looks for the
        tactic a plan recorded, its identity: it may return only the tactics of that name."""
        fn = self.pointwise(node, inputs)
        if fn is None or len(outputs) != 1:
            return []
        return pointwise_tactics(fn, inputs, outputs[0], wanted=wanted)

    def pointwise(self, node: "Node", inputs: Sequence[TensorInfo | None]):
        """Return a scalar ``@jit(device=True)`` function of this op, or ``None``.

        It takes one scalar per present input (float16 arrives as float32) and returns
        the output scalar. The core builds elementwise kernels, and later fused chains
        and epilogues, from it.
        """
        return None

    def examples(self) -> "list[Example]":
        """Return the cases this plugin claims to support, as :class:`Example` objects.

        The conformance kit (:mod:`plugrt.testing`) builds a one-node model for each, draws
        fresh random inputs, and checks ``infer``, every tactic against :meth:`reference`,
        serialization and memory safety. The default claims nothing.
        """
        return []

    def serialize(self, node: "Node") -> Mapping[str, Any]:
        """Return extra JSON-safe data a plan needs beyond the node's attributes."""
        return {}

    # ----------------------------------------------------------------- helpers

    def unsupported(self, node: "Node", what: str, fix: str = "") -> UnsupportedError:
        """An :class:`UnsupportedError` naming the node and what this plugin refuses."""
        message = f"{node.describe()}: {what} is not supported by plugin {type(self).__name__}"
        return UnsupportedError(message + (f"; {fix}" if fix else ""))

    def require_dtypes(self, node: "Node", inputs: Sequence[TensorInfo | None], allowed, which=None):
        """Raise :meth:`unsupported` unless each checked input's dtype is in ``allowed``."""
        for i in range(len(inputs)) if which is None else which:
            info = optional(inputs, i)
            if info is not None and info.dtype not in allowed:
                names = ", ".join(sorted(str(d) for d in allowed))
                raise self.unsupported(node, f"input {i} of dtype {info.dtype}", f"supported: {names}")


@dataclass(frozen=True, eq=False)
class Example:
    """One node configuration a plugin claims to support (returned by :meth:`OpPlugin.examples`).

    ``inputs`` has one entry per node input: a :class:`TensorInfo` with a static shape (a
    runtime input; the kit draws fresh random values of that dtype and shape), a NumPy
    array (a constant initializer, as weights and shape tensors are in real models), or
    ``None`` for an omitted optional input. ``attrs`` are the node's attributes; ``opset``
    the opset of the op's domain (``None``: the plugin's ``since_opset``, at least 17 for
    the default domain). ``rtol``/``atol`` bound the difference between a tactic and the
    reference.

    ``ranges`` says how to draw a runtime input whose values matter, by input index: a
    ``(low, high)`` pair (floats uniform in ``[low, high)``, integers in ``low..high-1``:
    ``(1e-3, 4.0)`` for Log or Sqrt, ``(0, n)`` for indices into an axis of ``n``), or a
    function ``draw(rng, dtype, shape) -> ndarray`` for anything else (sorted, unique,
    a permutation). Inputs not named are drawn by :func:`plugrt.bindings.random_input`
    (standard normal floats, integers 1..4, random booleans).
    ``n_outputs`` is how many outputs the node names (``None``: the op's minimum, so
    optional outputs are claimed by saying so). ``tf32_tolerance`` is ``(rtol, atol)``
    for tactics with ``math == "tf32"``, whose products keep 10 mantissa bits.
    ``name`` labels the example in reports (default: its input types).
    """

    inputs: tuple
    attrs: Mapping[str, Any] = field(default_factory=dict)
    opset: int | None = None
    rtol: float = 1e-5
    atol: float = 1e-6
    name: str = ""
    ranges: Mapping[int, Any] = field(default_factory=dict)
    n_outputs: int | None = None
    tf32_tolerance: tuple[float, float] = (5e-3, 5e-3)

    def label(self) -> str:
        """``name``, or the input types: ``float32(2,3)+const int64(2)+none``."""
        if self.name:
            return self.name
        parts = []
        for entry in self.inputs:
            if entry is None:
                parts.append("none")
            elif isinstance(entry, TensorInfo):
                parts.append(f"{entry.dtype}({','.join(str(d) for d in entry.shape)})")
            else:
                array = np.asarray(entry)
                parts.append(f"const {array.dtype}({','.join(str(d) for d in array.shape)})")
        return "+".join(parts) or "no inputs"


@dataclass(frozen=True, eq=False)
class Scale:
    """``output = inputs[input] * scale + shift``, what :meth:`OpPlugin.as_scale` returns.

    ``scale`` and ``shift`` are constant arrays that broadcast (NumPy rules) against the
    output; the core passes them on to an anchor's :meth:`OpPlugin.fold_scale`.
    """

    input: int
    scale: np.ndarray
    shift: np.ndarray


@dataclass(frozen=True)
class GraphPass:
    """A named graph rewrite a plugin contributes through ``plugrt_passes``.

    ``run(graph, registry)`` rewrites the graph in place, returning its count of changes. ``stage`` says where it runs: ``"cleanup"`` passes (simplifications that change
    no op's work, such as layout pairs that cancel) run with the core's cleanup, even
    without fusion; ``"fusion"`` passes (primitive ops recognized as a fused op) run after
    the scale folding and before epilogue and pointwise fusion, and not with
    ``--no-fusion``; ``"quantize"`` passes (Q/DQ placement and Q/DQ around an op turned
    into its integer form) run after those and the builder's calibration, in every build,
    reading :attr:`Graph.int8`; ``"bindings"`` passes right after import, where the build
    asks binding formats (:attr:`Graph.io_formats`), each rewriting and taking out those it
    knows. Within a stage passes are ordered by ``(priority, owner, name)``; lower first.
    """

    name: str
    run: Any
    priority: int = 100
    description: str = field(default="", compare=False)
    stage: str = "fusion"

    def __post_init__(self):
        if self.stage not in PASS_STAGES:
            raise ValueError(f"graph pass {self.name!r}: stage must be one of {PASS_STAGES}, got {self.stage!r}")



class TacticProvider(OpIdentity):
    """Tactics for an op that another plugin owns, returned from a ``plugrt_tactics`` hook.

    The owner keeps the op (inference, reference, attributes); a provider only adds ways
    to run it. The builder offers the owner's tactics and every provider's to the tuner,
    which verifies each against the owner's and times them; plans record which plugin
    supplied the chosen one. Class attributes:

    - ``op_type``, ``domain``, ``since_opset``, ``until_opset``: the op it serves, as on
      :class:`OpPlugin`;
    - ``version``: the provider's own version, recorded in plans (bump it whenever a plan
      built with the old code would run something else);
    - ``tactic_names``: the names of the tactics it may offer (``plugrt plugins`` lists
      them; each name is unique within the provider).

    The registry it is registered in binds itself as ``registry``, so :meth:`owner` finds
    the owning op plugin of a node (its ``pointwise`` function, say, to wrap in a kernel
    of the provider's own).
    """

    tactic_names: ClassVar[tuple[str, ...]] = ()
    registry: Any = None

    def owner(self, node: "Node") -> OpPlugin:
        """The op plugin that owns ``node`` in the registry this provider serves."""
        if self.registry is None:
            raise UnsupportedError(f"{self!r} is not registered in a plugrt registry, so it has no owner op")
        return self.registry.op(node)

    def tactics(self, node: "Node", inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo],
                epilogue=None) -> list:
        """Return this provider's tactics for the node, best first, exactly as the owning
        :meth:`OpPlugin.tactics` would (same arguments, same contract, an ``epilogue`` for
        ``ANCHOR`` ops); ``[]`` where it has none."""
        raise NotImplementedError

    def examples(self) -> "list[Example]":
        """Return the cases the conformance kit checks these tactics on, as on
        :meth:`OpPlugin.examples` (``[]``: the owner's examples, which its tactics must
        then all serve)."""
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} tactics for {self.domain or 'ai.onnx'}::{self.op_type}>"


__all__ = [
    # the contract
    "OpPlugin", "Attr", "Example", "Scale", "GraphPass", "TacticProvider", "optional",
    # the data it speaks in
    "TensorInfo", "Tactic", "Launch", "pointwise_tactic", "pointwise_tactics", "dims",
    # constants
    "REQUIRED", "VARIADIC", "ATTRIBUTE_KINDS", "PASS_STAGES",
    "POINTWISE", "REDUCTION", "SHAPE", "ANCHOR", "NORMALIZATION", "CONVERT",
    "FLOAT_DTYPES", "INT_DTYPES", "NUMERIC_DTYPES", "ALL_DTYPES",
]
