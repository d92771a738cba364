"""Bounded reading of untrusted inputs: regular files of a known size, YAML with a bounded alias
expansion, counts within a limit, and words that stay one word in a generated script.

Every function here raises the error class its caller passes (``error=``), with a message that
names the field or path and a hint, so each caller keeps its own exception type.

Rules:
    * Only regular files are read; the size is checked with ``fstat`` before reading, so a FIFO,
      a device such as ``/dev/zero`` or a directory is refused at once instead of hanging.
    * YAML is parsed with the safe loader; the document's size with every alias expanded is
      counted on the composed node graph (shared nodes counted once per use, without expanding
      them) and refused past ``max_nodes`` before any Python object is built.
    * A count a user gives (processes, candidates, samples, parallel trials, budget) is an int
      (not a bool) in ``[low, high]``.
    * A word headed for a script line (an sbatch option, an environment value) holds no control
      character (newline, carriage return, NUL, escape, ...).

Example:
    >>> from cubicml_lab._bounds import check_count, load_yaml
    >>> from cubicml_lab.errors import ConfigError
    >>> check_count("parallel", 4, high=64, error=ConfigError)
    4
    >>> bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\\n" + "".join(
    ...     f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\\n"
    ...     for p, n in zip("abcdefgh", "bcdefghi"))
    >>> try:
    ...     load_yaml(bomb, what="bomb.yaml", error=ConfigError)
    ... except ConfigError as err:
    ...     print(err.message[:59])
    bomb.yaml: the YAML expands to more than 100,000 nodes (its
"""

from __future__ import annotations

import functools
import os
import stat
import unicodedata
from typing import Any

from ._params import brief

__all__ = ["MAX_YAML_NODES", "check_count", "check_regular_or_absent", "check_word", "load_yaml",
           "read_regular"]

#: Most nodes a YAML document may hold with its aliases expanded (a campaign or space file holds
#: a few hundred).
MAX_YAML_NODES = 100_000


def read_regular(path: str | os.PathLike[str], *, what: str, max_bytes: int,
                 error: type[Exception], hint: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    The file is opened without blocking and checked with ``fstat`` before any byte is read: a
    FIFO, socket, device or directory is refused, and so is a file larger than ``max_bytes``.

    Raises:
        error: The path cannot be opened, is not a regular file, or is too large; the message
            names ``what`` and the path, ``hint`` says what to pass instead.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as err:
        raise error(f"cannot read {what} {brief(str(path))}: "
                    f"{getattr(err, 'strerror', None) or err}", hint=hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(info.st_mode) else
                    "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                    "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise error(f"{what} {brief(str(path))} is {kind}, not a regular file", hint=hint)
        if info.st_size > max_bytes:
            raise error(f"{what} {brief(str(path))} is {info.st_size:,} bytes, more than the "
                        f"{max_bytes:,} allowed", hint=hint)
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
    except OSError as err:
        raise error(f"cannot read {what} {brief(str(path))}: {err.strerror or err}",
                    hint=hint) from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:  # it grew while we read it
        raise error(f"{what} {brief(str(path))} is more than the {max_bytes:,} bytes allowed",
                    hint=hint)
    return raw


def check_regular_or_absent(path: str | os.PathLike[str], *, what: str,
                            error: type[Exception], hint: str) -> None:
    """Refuse ``path`` when it exists and is not a regular file (a FIFO, device, socket or
    folder), which opening as a file to read or write could hang on; a missing path is fine."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what} {brief(str(path))} exists and is not a regular file", hint=hint)


def _expanded_size(root: Any, limit: int) -> int:
    """Nodes under ``root`` with every alias expanded, counted without expanding (memoised on
    the node objects an alias shares); stops counting once past ``limit``."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[id(node)] = 1
            continue
        if not done:
            sizes_missing = [c for c in children if id(c) not in sizes]
            if sizes_missing:
                stack.append((node, True))
                stack.extend((c, False) for c in sizes_missing)
                continue
        if any(id(c) not in sizes for c in children):  # a cycle: a recursive alias
            return limit + 1
        sizes[id(node)] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children))
    return sizes[id(root)]


#: Most ``[``/``{`` collections one YAML document nests: PyYAML's scanner checks every open one
#: at each token, so a deep nesting costs its depth squared (seconds at a few hundred).
MAX_YAML_FLOW_DEPTH = 100


@functools.cache
def _flow_bounded_loader() -> type:
    """YAML's safe loader, refusing flow collections nested past :data:`MAX_YAML_FLOW_DEPTH`."""
    import yaml

    class FlowBoundedLoader(yaml.SafeLoader):
        def fetch_flow_collection_start(self, token_class: Any) -> None:
            if self.flow_level >= MAX_YAML_FLOW_DEPTH:
                raise yaml.scanner.ScannerError(
                    None, None, "nested too deeply to read ([ and { more than "
                    f"{MAX_YAML_FLOW_DEPTH} deep)",
                    self.get_mark())
            super().fetch_flow_collection_start(token_class)

    return FlowBoundedLoader


def load_yaml(text: str, *, what: str, error: type[Exception],
              max_nodes: int = MAX_YAML_NODES) -> Any:
    """``text`` parsed with YAML's safe loader, refused when its aliases expand past
    ``max_nodes`` nodes (an alias bomb) or it refers to itself.

    Raises:
        error: Not YAML, too large once expanded, or recursive; the message names ``what``.
    """
    import yaml

    try:  # the reader checks the characters when the loader is built (a NUL is refused)
        loader = _flow_bounded_loader()(text)
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise error(f"{what}: not valid YAML ({first})", hint="fix the file") from None
    try:
        try:
            root = loader.get_single_node()
        except (yaml.YAMLError, RecursionError) as err:
            first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise error(f"{what}: not valid YAML ({first})", hint="fix the file") from None
        if root is None:
            return None
        if _expanded_size(root, max_nodes) > max_nodes:
            raise error(f"{what}: the YAML expands to more than {max_nodes:,} nodes (its "
                        "aliases, &name and *name, repeat parts many times over)",
                        hint="write the values out; a campaign or space file holds a few "
                             "hundred")
        try:
            return loader.construct_document(root)
        except (yaml.YAMLError, RecursionError, ValueError, TypeError) as err:
            raise error(f"{what}: not valid YAML ({str(err).splitlines()[0][:160]})",
                        hint="fix the file") from None
    finally:
        loader.dispose()


def check_count(field: str, value: Any, *, high: int, error: type[Exception], low: int = 1,
                why: str = "") -> int:
    """``value`` as an int in ``[low, high]``, else ``error`` naming ``field`` and the limit.

    ``why`` says where ``high`` comes from (e.g. "the machine has 2 CPU cores").
    """
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{field} = {brief(value)} must be an int from {low:,} to {high:,}",
                    hint=f"e.g. {field}={max(low, 1)}")
    value = int(value)
    if not low <= value <= high:
        because = f" ({why})" if why else ""
        raise error(f"{field} = {brief(value)} is outside {low:,}..{high:,}{because}",
                    hint=f"pass {field} between {low:,} and {high:,}")
    return value


def check_word(field: str, value: Any, *, error: type[Exception], hint: str = "") -> str:
    """``value`` as a str with no control character (so it stays on its script line), else
    ``error`` naming ``field`` and the character."""
    if not isinstance(value, str):
        raise error(f"{field} = {brief(value)} must be a string",
                    hint=hint or f"pass {field} as text")
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") and ch != "\t" or ch == "\x7f":
            raise error(f"{field} = {brief(value)} holds the control character "
                        f"{ch!r} at position {i}; it would break the generated script",
                        hint=hint or f"remove line breaks and control characters from {field}")
    return value
