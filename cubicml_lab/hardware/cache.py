"""Figures kept per machine: this CPU's model name (the key they are kept under) and a locked JSON
cache in ``$CUBICML_LAB_CACHE_DIR`` that processes measuring at once share. The bottom of
:mod:`cubicml_lab.hardware`: it imports none of its siblings, and no torch.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "cpu_model", "locked_json_cache"]


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cache_dir() -> Path:
    """The cubicml_lab cache folder: ``$CUBICML_LAB_CACHE_DIR``, else ``~/.cache/cubicml_lab``."""
    return Path(os.environ.get("CUBICML_LAB_CACHE_DIR") or Path.home() / ".cache" / "cubicml_lab")


@contextmanager
def locked_json_cache(name: str) -> Iterator[dict[str, Any]]:
    """A JSON object kept in ``$CUBICML_LAB_CACHE_DIR/<name>`` (default ``~/.cache/cubicml_lab``),
    held under an exclusive file lock for the block (``<name>`` with a ``.lock`` suffix, where
    ``fcntl`` exists), so that processes measuring at once read one another's results.

    Yields the cache as a dict (empty when the file is missing, unreadable or not an object);
    when the block changed it and ended without an exception, it is written back atomically (a
    temporary file, then ``os.replace``).

    Example:
        >>> import tempfile
        >>> os.environ["CUBICML_LAB_CACHE_DIR"] = tempfile.mkdtemp()
        >>> with locked_json_cache("demo.json") as cache:
        ...     cache["answer"] = 42
        >>> with locked_json_cache("demo.json") as cache:
        ...     cache["answer"]
        42
        >>> del os.environ["CUBICML_LAB_CACHE_DIR"]
    """
    path = cache_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the lock file closes
        except ImportError:
            pass
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
        cache = cache if isinstance(cache, dict) else {}
        before = json.dumps(cache, sort_keys=True)
        yield cache
        if json.dumps(cache, sort_keys=True) != before:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
            os.replace(tmp, path)
