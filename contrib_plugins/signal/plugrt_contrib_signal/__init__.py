"""plugrt-contrib-signal: signal-processing ops for plugrt in the ``plugrt.signal`` domain.

Registered through the entry point ``contrib-signal`` in group ``plugrt.plugins``; uses
only plugrt's public plugin API (``plugrt``, ``plugrt.plugin``, ``plugrt.kernels``,
``plugrt.tactic``, ``plugrt.testing``).
"""

from plugrt import hookimpl

from .stft import DOMAIN, STFTMagnitude

__version__ = "0.1.0"

#: The plugrt plugin API versions this package supports (inclusive range).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [STFTMagnitude()]


__all__ = ["DOMAIN", "PLUGRT_API", "STFTMagnitude", "__version__", "plugrt_ops"]
