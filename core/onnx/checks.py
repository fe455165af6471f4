"""Checks the importer runs on an ONNX graph before building the IR: names and node order.

Names end up in plan files (JSON), messages and file names, so every name a model
carries (graph, node, value, initializer, attribute, op type, domain, symbolic dim) must
be valid UTF-8 without control characters, and at most :data:`MAX_NAME_LENGTH` characters:
a bad name is refused with a :class:`ModelError` naming where it is, never decoded
into something else. (The importer puts nodes in topological order with
:func:`plugrt.ir.graph.topological_order`.)
"""

from __future__ import annotations

from typing import Iterable

from plugrt.errors import ModelError

#: The longest name plugrt accepts, in characters.
MAX_NAME_LENGTH = 4096


def printable(text) -> str:
    """A name as it can be shown in a message, whatever it holds."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "backslashreplace")
    text = str(text)
    return repr(text[:80]) + ("..." if len(text) > 80 else "")


def check_name(text, what: str, empty_ok: bool = True) -> str:
    """Return ``text`` as a ``str`` if it is a usable name, else raise :class:`ModelError`.

    :param what: where the name is, for the message ("node 'conv1' input 0").
    """
    if isinstance(text, (bytes, bytearray)):
        raise ModelError(f"{what} {printable(text)} is not valid UTF-8; rename it in the model (ONNX names "
                         "are UTF-8 strings)")
    if not empty_ok and not text:
        raise ModelError(f"{what} is empty; give it a name in the model")
    if len(text) > MAX_NAME_LENGTH:
        raise ModelError(f"{what} {printable(text)} is {len(text)} characters long, over plugrt's limit of "
                         f"{MAX_NAME_LENGTH}; rename it in the model")
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        raise ModelError(f"{what} {printable(text)} contains the control character U+{ord(bad):04X}; "
                         "rename it in the model")
    return text


def check_value_names(texts: Iterable, what: str) -> tuple[str, ...]:
    return tuple(check_name(text, f"{what} {i}") for i, text in enumerate(texts))
