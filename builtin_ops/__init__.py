"""The built-in op plugins of plugrt, one module per op family.

Each module is registered through its own entry point in group ``plugrt.plugins``,
exactly as a third-party plugin is; the core never imports this package.
"""
