"""The one error family of plugrt.

Every message names the node, binding, plugin or file at fault and what would fix it.
The CLI turns any ``PlugrtError`` into a one-line message and exit status 2.
"""


class PlugrtError(Exception):
    """Base class of every error plugrt raises on purpose."""


class PluginError(PlugrtError):
    """A plugin failed to load, register or validate."""


class UnsupportedError(PlugrtError):
    """A node, dtype or attribute value that no installed plugin supports."""


class ModelError(PlugrtError):
    """The model file or graph is malformed."""


class ShapeError(PlugrtError):
    """Shape or dtype inference failed for a node."""


class BindingError(PlugrtError):
    """An input or output binding does not match what the graph or engine expects."""


class PlanError(PlugrtError):
    """A plan file is corrupt, truncated, or needs plugins that are not installed."""
