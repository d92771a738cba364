"""What a :class:`~cubicml_lab.space.Space` is given, checked: its arguments and its files.

The constructor's arguments (a list of parameters, mappings of constants and derived values, a
list of constraint strings) are refused with a :class:`~cubicml_lab.errors.SpaceError` naming the
field and what it got; a space file (YAML or JSON) is read only as a regular UTF-8 file of at
most :data:`MAX_FILE_BYTES`, and its description must be a mapping with a ``parameters`` list.
Pure Python: :mod:`cubicml_lab.space` builds the space from what this module lets through.

Example:
    >>> string_list("constraints", ["tp <= 8"])
    ['tp <= 8']
    >>> description_parameters({"parameters": [{"type": "bool", "name": "compile"}]})
    [{'type': 'bool', 'name': 'compile'}]
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._bounds import read_regular
from ._params import PARAM_TYPES, Parameter, brief
from .errors import SpaceError

__all__ = ["MAX_FILE_BYTES", "MAX_NAMED", "description_parameters", "mapping_arg",
           "parameter_list", "parse_file", "read_text", "shown_path", "string_list"]

#: Largest space file (YAML or JSON) read, in bytes; a space description is a few KiB.
MAX_FILE_BYTES = 1 << 20
#: Most parameters, constants, derived values or constraints a space may have (each, not in all).
MAX_NAMED = 1_000
_EXAMPLE = "Space([Int('micro_batch', 1, 16)], constraints=['micro_batch <= 8'])"


def parameter_list(parameters: Any) -> list[Parameter]:
    """``parameters`` as a non-empty list of Parameter, or a SpaceError naming what it got."""
    if isinstance(parameters, Parameter):
        raise SpaceError(f"parameters must be a list; got the single parameter "
                         f"{brief(parameters)}", hint=f"wrap it in a list: Space([{parameters.name}"
                                                      " parameter])")
    if isinstance(parameters, (str, bytes, Mapping)) or not isinstance(parameters, Iterable):
        raise SpaceError(f"parameters must be a list of parameters; got {type(parameters).__name__}"
                         f" {brief(parameters)}", hint=f"e.g. {_EXAMPLE}")
    out = list(itertools.islice(parameters, MAX_NAMED + 1))
    _check_many("parameters", out)
    if not out:
        raise SpaceError("a Space needs a non-empty list of parameters", hint=f"e.g. {_EXAMPLE}")
    for i, p in enumerate(out):
        if not isinstance(p, Parameter):
            raise SpaceError(f"parameters[{i}] = {brief(p)} is not a parameter",
                             hint=f"use one of {', '.join(PARAM_TYPES)}")
    return out


def string_list(field: str, value: Any) -> list[str]:
    """``constraints`` as a list of strings; a bare string is refused, not read per character."""
    if value is None:
        return []
    if isinstance(value, str):
        raise SpaceError(f"{field} must be a list of strings; got the string {brief(value)}: "
                         "wrap it in a list", hint=f"{field}=[{brief(value)}]")
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise SpaceError(f"{field} must be a list of strings; got {type(value).__name__} "
                         f"{brief(value)}", hint=f"e.g. {field}=['tp * pp <= world_size']")
    out = list(itertools.islice(value, MAX_NAMED + 1))
    _check_many(field, out)
    for i, item in enumerate(out):
        if not isinstance(item, str):
            raise SpaceError(f"{field}[{i}] = {brief(item)} is not a string",
                             hint="write each one as text, e.g. 'tp * pp <= world_size'")
    return out


def mapping_arg(field: str, value: Any, what: str, example: str) -> dict[Any, Any]:
    """``constants``/``derived`` as a dict, or a SpaceError naming the field and what it got."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        got = "the string" if isinstance(value, str) else type(value).__name__
        raise SpaceError(f"{field} must be a mapping of name -> {what}; got {got} {brief(value)}",
                         hint=f"e.g. {field}={example}")
    _check_many(field, value)
    return dict(value)


def _check_many(field: str, items: Any) -> None:
    if len(items) > MAX_NAMED:
        raise SpaceError(f"{field} has more than MAX_NAMED = {MAX_NAMED:,} entries",
                         hint="a space has a few dozen knobs; generate fewer")


def shown_path(path: Any) -> str:
    """``path`` as messages show it: whole up to 300 printable characters, else cut short."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    return text if len(text) <= 300 and text.isprintable() else brief(text)


def read_text(path: Any) -> str:
    """The UTF-8 text of a space file (a regular file of at most MAX_FILE_BYTES), or a
    SpaceError naming the path and what is wrong."""
    if not isinstance(path, (str, os.PathLike)):
        raise SpaceError(f"the space file path {brief(path)} is a {type(path).__name__}, not a "
                         "path", hint="pass a str or pathlib.Path")
    raw = read_regular(path, what="the space file", max_bytes=MAX_FILE_BYTES, error=SpaceError,
                       hint="pass the path of a space file (YAML or JSON, a few KiB)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpaceError(f"{shown_path(path)} is not UTF-8 text: byte {raw[err.start]:#04x} at "
                         f"offset {err.start}", hint="save the file as UTF-8") from None


def _parse_error(err: Exception) -> str:
    if isinstance(err, RecursionError):
        return "nested too deeply to read; a space file nests 3 or 4 levels"
    return str(err)


def parse_file(path: Any, parse: Any, what: str,
               errors: tuple[type[BaseException], ...]) -> Any:
    """Read ``path`` (checked: :func:`read_text`) and ``parse`` its text; a parse error (one of
    ``errors``) becomes a SpaceError naming the file."""
    text = read_text(path)
    try:
        return parse(text)
    except errors as err:
        raise SpaceError(f"{shown_path(path)}: not valid {what} ({_parse_error(err)})",
                         hint="fix the file") from None


def description_parameters(data: Any) -> Sequence[Any]:
    """The ``parameters`` list of a space description (:meth:`Space.to_dict
    <cubicml_lab.space.Space.to_dict>` output or a hand-written file), after checking that
    ``data`` is a mapping with only the known keys.

    Raises:
        SpaceError: Naming what is wrong and the format.
    """
    if not isinstance(data, Mapping) or "parameters" not in data:
        got = (f"a mapping with keys {', '.join(sorted(map(brief, data))) or '(none)'}"
               if isinstance(data, Mapping)
               else "nothing (an empty file?)" if data is None
               else f"{type(data).__name__} {brief(data)}")
        raise SpaceError(f"a space description must be a mapping with a 'parameters' list; "
                         f"got {got}", hint="see Space.to_dict() for the format")
    extra = set(data) - {"parameters", "constants", "derived", "constraints"}
    if extra:
        raise SpaceError(f"unknown key(s) {', '.join(sorted(map(brief, extra)))} in the "
                         "space description",
                         hint="allowed: parameters, constants, derived, constraints")
    params = data["parameters"]
    if isinstance(params, (str, bytes, Mapping)) or not isinstance(params, Sequence):
        raise SpaceError(f"'parameters' must be a list of parameter mappings; got "
                         f"{type(params).__name__} {brief(params)}",
                         hint="write '- {type: int, name: micro_batch, low: 1, high: 16}' "
                         "items under 'parameters:'")
    return params
