"""Placeholder: filled in by the op family work."""

from plugrt import hookimpl


@hookimpl
def plugrt_ops():
    return []
