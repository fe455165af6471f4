"""The template ``plugrt new-plugin`` renders (see :mod:`plugrt.scaffold`).

``files/`` is the new package's tree. Every ``*.j2`` file there is rendered with Jinja2
and loses the suffix; path parts are rendered too (``src/{{module}}/``). Installed, this
folder is the package ``plugrt.plugin_template``, so a wheel carries it.
"""
