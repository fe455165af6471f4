"""The activation functions a recurrent node may name (``activations``), as NumPy functions
for the reference and as device functions for the kernels.

ONNX lets LSTM, GRU and RNN pick each gate's activation from a list of names, some of them
taking ``alpha`` (and ``beta``) from ``activation_alpha`` (``activation_beta``). The spec
does not say which activation a value belongs to when only some of the listed ones take
one (onnxruntime gives the values to those that take one, in order; ONNX's reference
indexes them by position), so a node may carry those lists only when every activation it
names takes that parameter: then both readings agree. Others take their ONNX operator's
defaults.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from plugrt.kernels import jit


@dataclass(frozen=True)
class Activation:
    """An activation by name with its parameters (``None`` where the function takes none)."""

    name: str
    alpha: float | None = None
    beta: float | None = None

    def numpy(self, x: np.ndarray) -> np.ndarray:
        """The activation of ``x`` (float64 in the reference)."""
        return _NUMPY[self.name](x, self.alpha, self.beta)


_NUMPY = {
    "Sigmoid": lambda x, a, b: 1.0 / (1.0 + np.exp(-x)),
    "Tanh": lambda x, a, b: np.tanh(x),
    "Relu": lambda x, a, b: np.maximum(x, 0.0),
    "LeakyRelu": lambda x, a, b: np.where(x >= 0.0, x, a * x),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0.0, 1.0),
    "Elu": lambda x, a, b: np.where(x >= 0.0, x, a * (np.exp(x) - 1.0)),
    "Softsign": lambda x, a, b: x / (1.0 + np.abs(x)),
    "Softplus": lambda x, a, b: np.logaddexp(0.0, x),
}

#: The activations supported, with the ONNX operator defaults of ``(alpha, beta)``; ``None``
#: for a parameter the function does not take.
DEFAULTS: dict[str, tuple[float | None, float | None]] = {
    "Sigmoid": (None, None),
    "Tanh": (None, None),
    "Relu": (None, None),
    "LeakyRelu": (0.01, None),
    "HardSigmoid": (0.2, 0.5),
    "Elu": (1.0, None),
    "Softsign": (None, None),
    "Softplus": (None, None),
}

SUPPORTED = tuple(DEFAULTS)


def canonical_name(name: str) -> str | None:
    """The supported activation spelled ``name`` in any case (ONNX names are case-insensitive
    in practice: exporters write ``Tanh`` and ``tanh``), or ``None``."""
    for known in SUPPORTED:
        if known.lower() == name.lower():
            return known
    return None


def resolve(names: list[str], alphas: list[float] | None, betas: list[float] | None) -> list[Activation] | str:
    """The activations of ``names`` with their parameters, or why they cannot be resolved."""
    canonical = [canonical_name(n) for n in names]
    unknown = [n for n, c in zip(names, canonical) if c is None]
    if unknown:
        return f"activation {unknown[0]!r} (supported: {', '.join(SUPPORTED)})"
    values = {}
    for k, given in ((0, alphas), (1, betas)):
        label = ("activation_alpha", "activation_beta")[k]
        if not given:
            continue
        takers = [c for c in canonical if DEFAULTS[c][k] is not None]
        if len(takers) != len(canonical) or len(given) != len(canonical):
            shown = ", ".join(f"{v:.6g}" for v in given)
            return (f"{label}=[{shown}] for activations {names} (accepted only when every activation takes "
                    f"that parameter, one value each: there onnxruntime's and ONNX's readings agree)")
        values[k] = [float(v) for v in given]
    found = []
    for i, name in enumerate(canonical):
        alpha, beta = DEFAULTS[name]
        if 0 in values:
            alpha = values[0][i]
        if 1 in values:
            beta = values[1][i]
        found.append(Activation(name, alpha, beta))
    return found


@functools.lru_cache(maxsize=None)
def device_activation(activation: Activation, acc_name: str):
    """``fn(x)``: ``activation`` as a device function on a scalar of the accumulator type
    ``acc_name`` (float32 or float64); its parameters are compile-time constants."""
    A = np.dtype(acc_name).type
    alpha = A(0 if activation.alpha is None else activation.alpha)
    beta = A(0 if activation.beta is None else activation.beta)
    zero, one = A(0), A(1)
    name = activation.name

    if name == "Sigmoid":
        @jit(device=True)
        def fn(x):
            return one / (one + math.exp(-x))
    elif name == "Tanh":
        @jit(device=True)
        def fn(x):
            return math.tanh(x)
    elif name == "Relu":
        @jit(device=True)
        def fn(x):
            return x if x > zero else zero
    elif name == "LeakyRelu":
        @jit(device=True)
        def fn(x):
            return x if x >= zero else alpha * x
    elif name == "HardSigmoid":
        @jit(device=True)
        def fn(x):
            return min(max(alpha * x + beta, zero), one)
    elif name == "Elu":
        @jit(device=True)
        def fn(x):
            return x if x >= zero else alpha * (math.exp(x) - one)
    elif name == "Softsign":
        @jit(device=True)
        def fn(x):
            return x / (one + abs(x))
    elif name == "Softplus":
        @jit(device=True)
        def fn(x):  # log(1 + e^x) without overflow for large x
            return max(x, zero) + math.log1p(math.exp(-abs(x)))
    else:
        raise ValueError(f"no device function for activation {name!r}")
    return fn
