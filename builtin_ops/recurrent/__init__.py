"""Recurrent layers: LSTM, GRU and RNN.

- :mod:`.ops`: the op plugins (attributes, shape rules, reference, tactics, claims);
- :mod:`.recurrence`: what a node computes, as data, and the NumPy reference;
- :mod:`.activations`: the activation functions a node may name, for NumPy and the device;
- kernels: :mod:`.projection` (X W^T + Wb for every time at once; the state copies),
  :mod:`.cell_steps` (one time step of each cell), and :mod:`.tactics`, which orders them
  into the stepwise tactic.
"""

from plugrt import hookimpl

from . import ops

#: Every op of the family, in the order they register.
OPS = ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
