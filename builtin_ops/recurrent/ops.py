"""The recurrent op plugins: LSTM, GRU and RNN (ONNX opsets 7 on; ``layout`` from 14).

They share everything but the cell: attributes, the shape rules, the reference
(:mod:`.recurrence`) and the stepwise tactic (:mod:`.tactics`). Float inputs are one dtype
(float16, float32 or float64), ``sequence_lens`` int32. The reference computes in float64;
the kernels in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import numpy as np

from plugrt import ShapeError
from plugrt.plugin import FLOAT_DTYPES, Attr, Example, OpPlugin, TensorInfo, optional

from . import recurrence
from .recurrence import B, DIRECTIONS, GATES, INITIAL_C, INITIAL_H, P, R, SEQUENCE_LENS, W, X

_INT32 = np.dtype(np.int32)


def _same(a, b) -> bool:
    """Whether two dims may be equal (a symbolic dim may be anything)."""
    return not (isinstance(a, int) and isinstance(b, int)) or a == b


class RecurrentOp(OpPlugin):
    """What LSTM, GRU and RNN share; subclasses name the cell (``op_type``) and add their
    attributes."""

    since_opset = 7
    inputs = (3, 6)
    outputs = (1, 2)
    dtypes = FLOAT_DTYPES | {_INT32}
    common_attributes = (
        Attr("activation_alpha", "floats", None),
        Attr("activation_beta", "floats", None),
        Attr("activations", "strings", None),
        Attr("clip", "float", None),
        Attr("direction", "string", "forward"),
        Attr("hidden_size", "int", None),
        Attr("layout", "int", 0),
    )

    # ----------------------------------------------------------------- inference

    def check(self, node, inputs):
        x = inputs[X]
        floats = [i for i in range(len(inputs)) if i != SEQUENCE_LENS]
        self.require_dtypes(node, inputs, FLOAT_DTYPES, which=floats)
        self.require_dtypes(node, inputs, {_INT32}, which=[SEQUENCE_LENS])
        for i in floats:
            info = optional(inputs, i)
            if info is not None and info.dtype != x.dtype:
                raise self.unsupported(node, f"input {i} of dtype {info.dtype} beside X of {x.dtype}",
                                       "give every float input X's dtype")
        layout = node.attrs["layout"]
        if node.opset < 14 and layout != 0:
            raise self.unsupported(node, f"layout={layout} at opset {node.opset}",
                                   "the layout attribute exists from opset 14; import the model at opset 14+")
        if layout not in (0, 1):
            raise self.unsupported(node, f"layout={layout}", "layout is 0 ([seq, batch, ...]) or 1 ([batch, seq, ...])")
        found = self.recurrence(node, inputs)
        if isinstance(found, str):
            raise self.unsupported(node, found)

    def recurrence(self, node, inputs) -> "recurrence.Recurrence | str":
        """The node as a :class:`~.recurrence.Recurrence`, or what of it is unsupported."""
        hidden = node.attrs["hidden_size"]
        if hidden is None:
            hidden = inputs[R].shape[-1] if inputs[R].rank == 3 else 0
        return recurrence.describe(self.op_type, node.attrs, hidden if isinstance(hidden, int) else 0)

    def infer(self, node, inputs):
        x, w, r = inputs[X], inputs[W], inputs[R]
        for name, info in (("X", x), ("W", w), ("R", r)):
            if info.rank != 3:
                raise ShapeError(f"{node.describe()}: {name} must have rank 3, got shape {list(info.shape)}")
        layout = node.attrs["layout"]
        steps, batch = (x.shape[1], x.shape[0]) if layout == 1 else (x.shape[0], x.shape[1])
        dirs, gates = len(DIRECTIONS[node.attrs["direction"]]), GATES[self.op_type]
        hidden = node.attrs["hidden_size"]
        if hidden is None:
            hidden = r.shape[2]
        expected = {"W": (w, (dirs, gates * hidden, x.shape[2])), "R": (r, (dirs, gates * hidden, hidden))}
        for index, name, shape in self.optional_shapes(dirs, batch, hidden, layout):
            info = optional(inputs, index)
            if info is not None:
                expected[name] = (info, shape)
        for name, (info, shape) in expected.items():
            if info.rank != len(shape) or not all(_same(a, b) for a, b in zip(info.shape, shape)):
                wanted = [d if isinstance(d, int) else "?" for d in shape]
                raise ShapeError(
                    f"{node.describe()}: {name} has shape {list(info.shape)}, expected {wanted} "
                    f"(direction={node.attrs['direction']!r}, hidden_size={hidden}, {gates} gate(s) of {self.op_type}, "
                    f"layout={layout}); check the weights' export or the hidden_size attribute")
        state = (batch, dirs, hidden) if layout == 1 else (dirs, batch, hidden)
        y = (batch, steps, dirs, hidden) if layout == 1 else (steps, dirs, batch, hidden)
        return [TensorInfo(x.dtype, y)] + [TensorInfo(x.dtype, state)] * (len(self.output_names) - 1)

    def optional_shapes(self, dirs, batch, hidden, layout):
        """``(index, name, shape)`` of the optional inputs."""
        state = (batch, dirs, hidden) if layout == 1 else (dirs, batch, hidden)
        return [(B, "B", (dirs, 2 * GATES[self.op_type] * hidden)), (SEQUENCE_LENS, "sequence_lens", (batch,)),
                (INITIAL_H, "initial_h", state)]

    # ----------------------------------------------------------------- execution

    def reference(self, node, inputs):
        rec = self.recurrence(node, inputs)
        if isinstance(rec, str):
            raise self.unsupported(node, rec)
        padded = list(inputs) + [None] * (8 - len(inputs))
        outputs = recurrence.run(rec, padded[X], padded[W], padded[R], padded[B], padded[SEQUENCE_LENS],
                                 padded[INITIAL_H], padded[INITIAL_C], padded[P])
        return [o.astype(inputs[X].dtype) for o in outputs]

    def tactics(self, node, inputs, outputs):
        from .tactics import stepwise_tactic

        rec = self.recurrence(node, inputs)
        if isinstance(rec, str):
            raise self.unsupported(node, rec)
        present = [optional(inputs, i) is not None for i in range(8)]
        return [stepwise_tactic(rec, inputs[X].shape, inputs[X].dtype, tuple(present))]

    # ----------------------------------------------------------------- claims

    output_names = ("Y", "Y_h")

    def examples(self):
        """A few small cases in the simulator's reach: defaults, every input, bidirectional
        layout 1, float16."""
        f32, f16, i32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
        g, h = GATES[self.op_type], 3
        seq, batch, size = 3, 2, 2
        every = (TensorInfo(f32, (seq, batch, size)), TensorInfo(f32, (1, g * h, size)), TensorInfo(f32, (1, g * h, h)),
                 TensorInfo(f32, (1, 2 * g * h)), np.array([3, 2], np.int32), TensorInfo(f32, (1, batch, h)))
        if self.op_type == "LSTM":
            every += (TensorInfo(f32, (1, batch, h)), TensorInfo(f32, (1, 3 * h)))
        outputs = len(self.output_names)
        return [
            Example((TensorInfo(f32, (seq, batch, size)), TensorInfo(f32, (1, g * h, size)),
                     TensorInfo(f32, (1, g * h, h))), {"hidden_size": h}, n_outputs=outputs, rtol=1e-4, atol=1e-5,
                    name="defaults"),
            Example(every, {"hidden_size": h, "direction": "reverse"}, n_outputs=outputs, rtol=1e-4, atol=1e-5,
                    name="reverse, every input, ragged"),
            Example((TensorInfo(f32, (batch, seq, size)), TensorInfo(f32, (2, g * h, size)),
                     TensorInfo(f32, (2, g * h, h)), TensorInfo(f32, (2, 2 * g * h))),
                    {"hidden_size": h, "direction": "bidirectional", "layout": 1, "clip": 1.5}, opset=14,
                    n_outputs=outputs, rtol=1e-4, atol=1e-5, name="bidirectional, layout 1, clip"),
            Example((TensorInfo(f16, (seq, batch, size)), TensorInfo(f16, (1, g * h, size)),
                     TensorInfo(f16, (1, g * h, h))), {"hidden_size": h}, n_outputs=outputs, rtol=1e-2, atol=1e-2,
                    name="float16"),
        ]


class RNN(RecurrentOp):
    """The simple recurrent cell, ``H = f(X W^T + H' R^T + Wb + Rb)`` (``f``: Tanh by default)."""

    op_type = "RNN"
    attributes = RecurrentOp.common_attributes


class GRU(RecurrentOp):
    """The gated recurrent unit (gates z, r, h; activations Sigmoid, Tanh by default), with
    ``linear_before_reset`` (PyTorch's GRU exports it set)."""

    op_type = "GRU"
    attributes = RecurrentOp.common_attributes + (Attr("linear_before_reset", "int", 0),)


class LSTM(RecurrentOp):
    """The long short-term memory cell (gates i, o, f, c; activations Sigmoid, Tanh, Tanh by
    default), with peepholes (P), ``input_forget``, an initial cell state and the cell
    state output Y_c."""

    op_type = "LSTM"
    inputs = (3, 8)
    outputs = (1, 3)
    attributes = RecurrentOp.common_attributes + (Attr("input_forget", "int", 0),)
    output_names = ("Y", "Y_h", "Y_c")

    def optional_shapes(self, dirs, batch, hidden, layout):
        state = (batch, dirs, hidden) if layout == 1 else (dirs, batch, hidden)
        return super().optional_shapes(dirs, batch, hidden, layout) + [(INITIAL_C, "initial_c", state),
                                                                        (P, "P", (dirs, 3 * hidden))]


OPS = (LSTM, GRU, RNN)
