"""A job's config file: read a template (YAML, TOML or JSON), set values at dotted keys, write it.

A :class:`~cubicml_lab.workloads.command.Command` may configure its job through a file, as
torchtitan (TOML, ``--job.config_file``) and NeMo (YAML) are configured. The template is read
once when the command is defined; for each trial a copy with the knob values set is written into
the trial's folder. The format follows the file's suffix. TOML is read with the standard
library's ``tomllib`` and written here (tables, arrays and scalars: what a training config
holds). Importing this module imports no torch.

Example:
    >>> data = {"parallelism": {"tensor_parallel_degree": 1}}
    >>> set_dotted(data, "parallelism.tensor_parallel_degree", 2)
    >>> print(dump_config(data, "train.toml"), end="")
    [parallelism]
    tensor_parallel_degree = 2
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._bounds import load_yaml, read_regular
from .._params import brief
from ..errors import ConfigError

__all__ = ["FORMATS", "MAX_CONFIG_BYTES", "dump_config", "load_config", "set_dotted"]

#: Largest config template read (a training config is a few KiB).
MAX_CONFIG_BYTES = 4 << 20

#: File suffix -> format.
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _format(name: str) -> str:
    fmt = FORMATS.get(Path(name).suffix.lower())
    if fmt is None:
        raise ConfigError(f"config file {name!r}: unknown format (suffix {Path(name).suffix!r})",
                          hint=f"name the template with one of {', '.join(FORMATS)}")
    return fmt


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The template at ``path`` as a dict (its top level must be a table/mapping).

    Raises:
        ConfigError: Unknown suffix, unreadable file, a parse error (with the parser's
            message), or a top level that is not a mapping.
    """
    path = Path(path)
    fmt = _format(path.name)
    raw = read_regular(path, what="config_file", max_bytes=MAX_CONFIG_BYTES, error=ConfigError,
                       hint="pass the path of an existing template file (a regular file)")
    try:
        text = raw.decode("utf-8")
        if fmt == "toml":
            import tomllib

            data: Any = tomllib.loads(text)
        elif fmt == "yaml":  # bounded alias expansion, like every YAML file the lab reads
            data = load_yaml(text, what=f"config_file {brief(os.fspath(path))}",
                             error=ConfigError)
        else:
            data = json.loads(text)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - each parser has its own error type
        raise ConfigError(f"config_file {brief(os.fspath(path))} is not valid {fmt.upper()}: "
                          f"{str(err)[:200]}",
                          hint="fix the template; the lab only sets the keys you name") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config_file {os.fspath(path)!r} holds a {type(data).__name__}, "
                          "not a mapping at its top level", hint="the template is a table of keys")
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``key = "a.b.c"``, creating missing tables.

    Raises:
        ConfigError: A part of the path exists and is not a table.
    """
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key {key!r}: {'.'.join(parts[:i + 1])!r} is a "
                              f"{type(child).__name__} in the template, not a table",
                              hint="name a key inside a table of the template")
        node = child
    node[parts[-1]] = value


def dump_config(data: Mapping[str, Any], name: str) -> str:
    """``data`` as the text of a config file named ``name`` (its suffix picks the format).

    Raises:
        ConfigError: Unknown suffix, or a value TOML cannot hold (None, an array of tables).
    """
    fmt = _format(name)
    if fmt == "json":
        return json.dumps(data, indent=2, allow_nan=False) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(dict(data), sort_keys=False))
    return _toml(data)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(where: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list) and not any(isinstance(v, dict) for v in value):
        return "[" + ", ".join(_toml_value(where, v) for v in value) + "]"
    raise ConfigError(f"config key {where!r}: TOML cannot hold {value!r:.60}",
                      hint="use numbers, strings, booleans, arrays of them, and tables")


def _toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """TOML text of ``data``: its scalars first, then each sub-table under its header."""
    lines = [f"{_toml_key(k)} = {_toml_value(prefix + k, v)}"
             for k, v in data.items() if not isinstance(v, dict)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in data.items():
        if isinstance(v, dict):
            header = f"{prefix}{_toml_key(k)}"
            body = _toml(v, header + ".")
            scalars = any(not isinstance(x, dict) for x in v.values()) or not v
            out += (("\n" if out else "") + f"[{header}]\n" if scalars else "") + body
    return out
