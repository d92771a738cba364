"""Templates of a command line: ``{knob}`` placeholders, and the text a knob value becomes.

An item of a :class:`~cubicml_lab.workloads.Command`'s ``argv`` or ``env`` is a template: literal
text with ``{name}`` placeholders (``{{`` and ``}}`` are braces). Only bare names are placeholders
(no attributes, indices, conversions or format specs: nothing is evaluated), and a value that
fills one must be a plain scalar without control characters, so that what reaches the job is
exactly one argument per item. Importing this module imports no torch.

Example:
    >>> [name for _, name in placeholders("argv[1]", "--tp={tp} {{x}}") if name]
    ['tp']
    >>> scalar_text("knob 'ac'", True), scalar_text("knob 'lr'", 0.1)
    ('true', '0.1')
"""

from __future__ import annotations

import math
import string
from typing import Any

from ..errors import ConfigError

__all__ = ["clean_text", "placeholders", "scalar_text"]

_SCALARS = (bool, int, float, str)


def clean_text(where: str, text: str) -> str:
    """``text`` if it holds no control character (a newline, NUL, escape ...), else raise."""
    bad = [c for c in text if ord(c) < 32 or 127 <= ord(c) < 160]
    if bad:
        raise ConfigError(f"{where} = {text!r} holds control character(s) {sorted(set(bad))!r}",
                          hint="a value that reaches a command line must be printable text")
    return text


def scalar_text(where: str, value: Any) -> str:
    """How a knob value is written into a command line, an environment variable or a file name:
    ``true``/``false`` for a bool, ``repr`` for a float, ``str`` otherwise.

    Raises:
        ConfigError: Not a plain scalar (bool, int, finite float, str), or text with a control
            character; the message names ``where``.
    """
    if not isinstance(value, _SCALARS):
        raise ConfigError(f"{where} = {value!r} is a {type(value).__name__}, not a plain scalar",
                          hint="knob values that reach a command are bool, int, float or str")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value!r} is not finite",
                              hint="pass a finite number")
        return repr(value)
    return clean_text(where, str(value))


def placeholders(where: str, template: str) -> list[tuple[str, str | None]]:
    """``template`` as (literal text, placeholder name or None) pieces; ``{{``/``}}`` are braces.

    Raises:
        ConfigError: A placeholder that is not a bare name (``{a.b}``, ``{0}``, ``{x!r}``,
            ``{x:>3}``), or unbalanced braces.
    """
    clean_text(where, template)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ConfigError(f"{where} = {template!r}: {err}",
                          hint="write a literal brace as {{ or }}") from None
    pieces: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (not name.isidentifier() or spec or conversion):
            shown = "{" + name + ("!" + conversion if conversion else "") + \
                (":" + spec if spec else "") + "}"
            raise ConfigError(f"{where} = {template!r}: placeholder {shown} is not a knob name",
                              hint="write {knob} with a knob's name only; {{ for a brace")
        pieces.append((literal, name))
    return pieces
