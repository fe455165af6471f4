"""Hook specifications: the whole contract between the plugrt core and its plugins.

A plugin is a module (or object) with ``@hookimpl`` functions, found through the entry
point group ``plugrt.plugins``. The built-in ops use the same road. Hooks named
``plugrt_<things>`` return lists; the core flattens them and records which plugin gave
each item.
"""

from plugrt import hookspec

# -------------------------------------------------------------------------
# registration
# -------------------------------------------------------------------------


@hookspec
def plugrt_ops():
    """Return the op plugins this package provides.

    Each item is an :class:`plugrt.plugin.OpPlugin` instance. Two plugins that claim the
    same ``(domain, op_type)`` with overlapping opset ranges are a registration error
    that names both owners.

    :returns: a list of op plugin instances.
    """


@hookspec
def plugrt_passes():
    """Return extra graph rewrites this package provides.

    Each item is a :class:`plugrt.plugin.GraphPass`: a pattern rewrite, typically matching
    a subgraph of primitive ops and replacing it with the package's fused op
    (:mod:`plugrt.passes.pattern` helps). They run after the core's cleanup and pattern
    passes and before epilogue and pointwise fusion, in the order ``(priority, plugin
    name, pass name)``; a node one pass rewrote is gone for the later ones (the first
    wins). ``plugrt build --disable-pass PLUGIN:NAME`` skips one.

    :returns: a list of graph passes.
    """


# -------------------------------------------------------------------------
# tactics
# -------------------------------------------------------------------------


@hookspec
def plugrt_tactics():
    """Return tactic providers: more ways to run ops that other plugins own.

    Each item is a :class:`plugrt.plugin.TacticProvider` naming the op it serves. The
    builder offers the owner's tactics and every provider's to the tuner, which verifies
    them against the owner's and times them; the plan records the provider's plugin,
    distribution and version, and loading refuses a plan whose provider is missing. A
    package may provide tactics and no op at all.

    :returns: a list of tactic provider instances.
    """

