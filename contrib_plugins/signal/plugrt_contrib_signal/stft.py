"""``plugrt.signal::STFTMagnitude``: the magnitude of a short-time Fourier transform.

Input ``signal``: float32 ``[B, N]``. Output: float32 ``[B, frames, n_fft // 2 + 1]``,
``|rfft(window * frame_t, n_fft)|`` for every frame ``t``.

Attributes:

- ``frame_length`` (int, required): samples per frame, also the window's length;
- ``hop_length`` (int, default 0 meaning ``max(frame_length // 4, 1)``): samples between
  frame starts;
- ``n_fft`` (int, default 0 meaning ``frame_length``): DFT size, at least
  ``frame_length``; the windowed frame is zero-padded at its end (``numpy.fft.rfft(x, n)``);
- ``window`` (string, default ``"hann"``): ``"hann"``, ``"hamming"`` or ``"rect"``, all
  periodic (the DFT-even form ``scipy.signal.get_window`` and ``torch.stft`` use);
- ``center`` (int, default 0): 1 reflect-pads the signal by ``frame_length // 2`` on both
  sides first, so frame ``t`` is centered on sample ``t * hop_length`` (needs
  ``N > frame_length // 2``).

``frames = 1 + (N + 2 * pad - frame_length) // hop_length`` (``pad`` is 0 unless
centered); a signal shorter than one frame is refused.
"""

from __future__ import annotations

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import REQUIRED, Attr, Example, OpPlugin, TensorInfo

from .stft_kernels import stft_tactics

DOMAIN = "plugrt.signal"
WINDOWS = ("hann", "hamming", "rect")
F32 = np.dtype(np.float32)


def make_window(name: str, length: int) -> np.ndarray:
    """The periodic window ``name`` of ``length`` samples, float64."""
    phase = 2.0 * np.pi * np.arange(length, dtype=np.float64) / length
    if name == "hann":
        return 0.5 - 0.5 * np.cos(phase)
    if name == "hamming":
        return 0.54 - 0.46 * np.cos(phase)
    return np.ones(length, dtype=np.float64)


class STFTMagnitude(OpPlugin):
    """Batched STFT magnitude of float32 signals (see the module doc for the semantics)."""

    op_type = "STFTMagnitude"
    domain = DOMAIN
    since_opset = 1
    version = "1.0"
    inputs = (1, 1)
    outputs = (1, 1)
    dtypes = frozenset({F32})
    attributes = (
        Attr("frame_length", "int", REQUIRED),
        Attr("hop_length", "int", 0),
        Attr("n_fft", "int", 0),
        Attr("window", "string", "hann"),
        Attr("center", "int", 0),
    )

    # ----------------------------------------------------------------- attributes

    def settings(self, node) -> dict:
        """The node's attributes with defaults resolved and checked.

        :raises ModelError: for impossible values; :class:`UnsupportedError` for an unknown
            window, both naming the node and the fix.
        """
        a = node.attrs
        length, hop, n_fft, center = a["frame_length"], a["hop_length"], a["n_fft"], a["center"]
        if length < 1:
            raise ModelError(f"{node.describe()}: frame_length={length}; it must be at least 1")
        if hop < 0:
            raise ModelError(f"{node.describe()}: hop_length={hop}; give a positive hop, or 0 for frame_length // 4")
        if n_fft < 0 or 0 < n_fft < length:
            raise ModelError(f"{node.describe()}: n_fft={n_fft} is shorter than frame_length={length}; give "
                             f"n_fft >= frame_length, or 0 for n_fft = frame_length")
        if center not in (0, 1):
            raise ModelError(f"{node.describe()}: center={center}; it must be 0 or 1")
        if a["window"] not in WINDOWS:
            raise self.unsupported(node, f"window {a['window']!r}", f"use one of {', '.join(WINDOWS)}")
        return {
            "frame_length": length,
            "hop_length": hop or max(length // 4, 1),
            "n_fft": n_fft or length,
            "window": a["window"],
            "pad": length // 2 if center else 0,
        }

    # ----------------------------------------------------------------- inference

    def check(self, node, inputs):
        settings = self.settings(node)
        signal = inputs[0]
        if signal.rank != 2:
            raise self.unsupported(node, f"a signal of rank {signal.rank}", "give a [batch, samples] signal "
                                   "(Reshape a single signal to [1, N], or flatten leading axes into the batch)")
        n = signal.shape[1]
        if isinstance(n, int):
            self._check_length(node, settings, n)

    def _check_length(self, node, settings: dict, n: int) -> None:
        pad, length = settings["pad"], settings["frame_length"]
        if pad and pad >= n:
            raise ShapeError(f"{node.describe()}: center=1 reflect-pads {pad} samples, which needs more than "
                             f"{pad} samples; the signal has {n}: use center=0 or a longer signal")
        if n + 2 * pad < length:
            raise ShapeError(f"{node.describe()}: the signal has {n} samples{' after padding' if pad else ''}, "
                             f"fewer than one frame of {length}; use a shorter frame_length or a longer signal")

    def infer(self, node, inputs):
        s = self.settings(node)
        batch, n = inputs[0].shape
        length, hop, pad = s["frame_length"], s["hop_length"], s["pad"]
        if isinstance(n, int):
            frames = 1 + (n + 2 * pad - length) // hop
        else:  # a symbol naming how it was derived, distinct per (frame, hop, center)
            frames = f"stft_frames_{length}_{hop}{'c' if pad else ''}({n})"
        return [TensorInfo(F32, (batch, frames, s["n_fft"] // 2 + 1))]

    def reference(self, node, inputs):
        s = self.settings(node)
        x = np.asarray(inputs[0]).astype(np.float64)
        self._check_length(node, s, x.shape[1])
        pad, length, hop = s["pad"], s["frame_length"], s["hop_length"]
        if pad:
            x = np.pad(x, ((0, 0), (pad, pad)), mode="reflect")
        count = 1 + (x.shape[1] - length) // hop
        index = np.arange(count)[:, None] * hop + np.arange(length)[None, :]
        frames = x[:, index] * make_window(s["window"], length)
        return [np.abs(np.fft.rfft(frames, n=s["n_fft"], axis=-1)).astype(np.float32)]

    # ----------------------------------------------------------------- engine

    def tactics(self, node, inputs, outputs, epilogue=None):
        s = self.settings(node)
        batch, n = (int(d) for d in inputs[0].shape)
        self._check_length(node, s, n)
        frames = int(outputs[0].shape[1])
        return stft_tactics(batch, n, frames, s["frame_length"], s["hop_length"], s["pad"], s["n_fft"],
                            make_window(s["window"], s["frame_length"]))

    def serialize(self, node):
        """The resolved settings (defaults applied) and the window convention, JSON-safe."""
        s = self.settings(node)
        return {"frame_length": s["frame_length"], "hop_length": s["hop_length"], "n_fft": s["n_fft"],
                "window": s["window"], "window_periodic": True,
                "padding": {"mode": "reflect", "samples": s["pad"]} if s["pad"] else None}

    def examples(self):
        def signal(batch, n):
            return (TensorInfo(F32, (batch, n)),)

        tol = {"rtol": 1e-4, "atol": 1e-4}
        return [
            Example(signal(2, 32), {"frame_length": 8, "hop_length": 4}, name="hann", **tol),
            Example(signal(1, 24), {"frame_length": 8, "hop_length": 3, "n_fft": 12, "window": "hamming"},
                    name="hamming_zero_padded", **tol),
            Example(signal(2, 20), {"frame_length": 6, "hop_length": 5, "window": "rect", "center": 1},
                    name="rect_centered", **tol),
            Example(signal(1, 9), {"frame_length": 9, "n_fft": 9}, name="one_frame_odd_fft", **tol),
        ]
