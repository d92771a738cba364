"""Launchers back from plain data: :func:`launcher_from_dict` reverses ``Launcher.describe()``.

A campaign file names its launcher the way ``describe()`` writes it, e.g.
``{"kind": "subprocess", "timeout_s": 600}`` or ``{"kind": "local_pool",
"devices_per_trial": 1}``; options left out take their defaults. A ``repeated`` launcher names
the launcher it repeats the same way: ``{"kind": "repeated", "processes": 2, "launcher":
{"kind": "subprocess"}}``; descriptions nest at most :data:`MAX_DEPTH` launchers deep.

Example:
    >>> from cubicml_lab.launch.describe import launcher_from_dict
    >>> launcher_from_dict({"kind": "torchrun", "nproc_per_node": 2}).world_size
    2
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from .._params import brief
from ..errors import ConfigError
from .base import Launcher
from .inprocess import InProcess
from .pool import LocalPool
from .repeated import Repeated
from .slurm import Slurm
from .subprocess import Subprocess
from .torchrun import Torchrun

__all__ = ["MAX_DEPTH", "launcher_from_dict"]

#: Most launchers one description nests (a ``repeated`` launcher around another is two).
MAX_DEPTH = 4

_KINDS: dict[str, type[Launcher]] = {"inprocess": InProcess, "subprocess": Subprocess,
                                     "torchrun": Torchrun, "local_pool": LocalPool, "slurm": Slurm,
                                     "repeated": Repeated}


def launcher_from_dict(data: Mapping[str, Any], *, _depth: int = 1) -> Launcher:
    """The launcher ``data`` describes (the form of ``Launcher.describe()``).

    Raises:
        ConfigError: Not a mapping, an unknown kind or option, a bad value, or launchers
            nested more than :data:`MAX_DEPTH` deep; the message names it and lists the
            options of that kind.
    """
    if _depth > MAX_DEPTH:
        raise ConfigError(f"launcher descriptions nest more than {MAX_DEPTH} launchers deep",
                          hint="a repeated launcher names one launcher that starts processes, "
                               "e.g. {kind: repeated, launcher: {kind: subprocess}}")
    if not isinstance(data, Mapping) or not isinstance(data.get("kind"), str):
        raise ConfigError(f"launcher must be a mapping with a 'kind', got {brief(data)}",
                          hint="e.g. launcher: {kind: subprocess, timeout_s: 600}")
    kind = data["kind"]
    if kind not in _KINDS:
        raise ConfigError(f"launcher kind {brief(kind)} is not one of {', '.join(_KINDS)}",
                          hint="e.g. kind: subprocess")
    cls = _KINDS[kind]
    options = {k: v for k, v in data.items() if k != "kind"}
    if kind == "local_pool" and "slot_devices" in options:  # describe() writes the slots
        slots = options.pop("slot_devices")
        if not isinstance(slots, list) or not all(isinstance(s, list) for s in slots):
            raise ConfigError(f"launcher local_pool: slot_devices = {brief(slots)} is not a list "
                              "of lists", hint="or give devices: [0, 1, ...]")
        options.setdefault("devices", [i for slot in slots for i in slot])
    if kind == "repeated" and "launcher" in options:
        options["launcher"] = launcher_from_dict(options["launcher"], _depth=_depth + 1)
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(str(k) for k in set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"launcher {kind}: unknown option(s) {brief(unknown)}",
                          hint=f"its options: {', '.join(allowed) or '(none)'}")
    try:
        return cls(**options)
    except TypeError as err:
        raise ConfigError(f"launcher {kind}: {str(err)[:300]}",
                          hint=f"its options: {', '.join(allowed)}") from None
