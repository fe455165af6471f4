"""plugrt: an ONNX inference engine builder in which every operator is a plugin."""

import pluggy

from plugrt.device import select_backend

select_backend()  # before any plugin imports numba.cuda

__version__ = "0.1.0"

#: The plugin API version this core implements. Plugins may state the range they support.
API_VERSION = 1

hookspec = pluggy.HookspecMarker("plugrt")
hookimpl = pluggy.HookimplMarker("plugrt")

from plugrt.errors import (  # noqa: E402
    BindingError,
    ModelError,
    PlanError,
    PluginError,
    PlugrtError,
    ShapeError,
    UnsupportedError,
)

__all__ = [
    "API_VERSION",
    "BindingError",
    "ModelError",
    "PlanError",
    "PluginError",
    "PlugrtError",
    "ShapeError",
    "UnsupportedError",
    "hookimpl",
    "hookspec",
]
