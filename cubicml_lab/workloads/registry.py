"""Workloads of your own, by name: registered in a notebook or declared by an installed package.

A trial spec names its workload (``{"workload": "mynet", ...}``) and the process that runs the
trial looks the name up with :func:`cubicml_lab.workloads.get`. Which processes can find a name
depends on how it was registered:

* ``register("mynet", "my_models:MyNet")``: an **import path** ``"module:attribute"`` (a
  :class:`~cubicml_lab.workloads.base.Workload` subclass, an instance, or a function returning
  one). It works on every launcher: the mapping is also put in the environment variable
  :data:`ENV_VAR`, which the trial processes of ``Subprocess``, ``Torchrun`` and ``LocalPool``
  inherit, and they import the module themselves (a module file next to the notebook is found:
  a trial process starts in the same working directory).
* ``register("mynet", MyNet)`` or ``register("mynet", my_workload)``: an **object** (a class or
  an instance, e.g. defined in a notebook cell). It exists in this process only, so only
  :class:`~cubicml_lab.launch.InProcess` can run it; a fresh interpreter cannot import a
  notebook cell. :func:`check_reachable` refuses it for another launcher, before any trial
  starts, with the fix in the hint.
* An installed package declares its workloads as **entry points** in the group :data:`GROUP`
  (``[project.entry-points."cubicml_lab.workloads"] mynet = "my_pkg.models:MyNet"``); every
  process finds them, nothing to register.

Nothing here imports torch; an import path is imported only when the workload is first asked for.

Example:
    >>> from cubicml_lab.workloads import registry
    >>> registry.parse_path("my_models:MyNet")
    ('my_models', 'MyNet')
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from collections.abc import Callable
from importlib import metadata
from typing import Any

from .._params import brief
from ..errors import ConfigError
from .base import Workload

__all__ = ["BUILT_IN", "ENV_VAR", "GROUP", "MAX_NAME_CHARS", "check_name", "check_reachable", "lookup",
           "parse_path", "register", "registered", "unregister"]

#: The entry-point group an installed package declares its workloads in.
GROUP = "cubicml_lab.workloads"
#: The environment variable carrying this process's registrations to its trial processes: a JSON
#: object, name -> ``"module:attribute"`` (``""`` for an object that exists in one process only).
ENV_VAR = "CUBICML_LAB_WORKLOADS"

#: The built-in workloads: name -> (module, class), imported only when one is asked for.
BUILT_IN: dict[str, tuple[str, str]] = {"dlrm": ("cubicml_lab.workloads.dlrm", "DLRMWorkload"),
                                        "gpt": ("cubicml_lab.workloads.gpt", "GPTWorkload")}
_OBJECTS: dict[str, Any] = {}  # name -> class, instance or factory registered in this process
#: Longest workload name, in characters.
MAX_NAME_CHARS = 100


def check_name(name: Any) -> str:
    """``name`` if it may name a workload: a str of ASCII letters, digits, ``_`` and ``-``,
    starting with a letter or ``_``, at most :data:`MAX_NAME_CHARS` characters.

    Raises:
        ConfigError: Naming what was given (a non-string, an unhashable object, a long or
            non-ASCII string) and the fix.
    """
    if not isinstance(name, str):
        raise ConfigError(f"workload name {brief(name)} is not a string ({type(name).__name__})",
                          hint='name it with a word, e.g. register("my-mlp", ...)')
    if len(name) > MAX_NAME_CHARS or not name.isascii() or \
            not name.replace("-", "_").isidentifier():
        raise ConfigError(f"workload name {brief(name)} must be a word of at most "
                          f"{MAX_NAME_CHARS} ASCII letters, digits, _ and -",
                          hint='e.g. register("my-mlp", ...)')
    return name


def parse_path(path: str) -> tuple[str, str]:
    """``"package.module:attr.sub"`` as ``(module, attribute path)``.

    Raises:
        ConfigError: Not of that form (the message shows the path).
    """
    module, sep, attr = path.partition(":") if isinstance(path, str) else ("", "", "")
    ok = sep and all(p.isidentifier() for p in module.split(".")) and \
        all(p.isidentifier() for p in attr.split("."))
    if not ok:
        raise ConfigError(f"workload import path {brief(path)} is not 'module:attribute'",
                          hint="e.g. 'my_models:MyNet' for class MyNet in my_models.py")
    return module, attr


def _env_paths() -> dict[str, str]:
    """The registrations this process inherited or made (name -> path, or ``""``)."""
    try:
        data = json.loads(os.environ.get(ENV_VAR) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _entry_points() -> dict[str, str]:
    """Installed packages' workloads: name -> ``"module:attr"``."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=GROUP)}


def register(name: str, workload: str | type[Workload] | Workload | Callable[[], Workload], *,
             replace: bool = False) -> None:
    """Make ``workload`` available as ``name`` to campaigns, :func:`cubicml_lab.measure` and
    :func:`cubicml_lab.workloads.get`.

    Args:
        name: The workload's name, as trials and the store record it (its ``name``
            attribute is set to it).
        workload: ``"module:attribute"`` (works on every launcher), or a ``Workload`` subclass,
            instance or zero-argument factory (this process only: ``InProcess``).
        replace: Allow replacing an earlier registration of ``name``.

    Raises:
        ConfigError: ``name`` is built in or taken (without ``replace``), is not an identifier,
            or ``workload`` is neither an import path nor a workload.

    Example:
        >>> register("my-mlp", "my_models:MLP")          # doctest: +SKIP
        >>> cml.measure("my-mlp", {"width": 256}, launcher=cml.launch.Subprocess())  # doctest: +SKIP
    """
    check_name(name)
    if name in BUILT_IN:
        raise ConfigError(f"{name!r} is a built-in workload", hint="register under another name")
    if not replace and (name in _OBJECTS or name in _env_paths()):
        raise ConfigError(f"workload {name!r} is already registered",
                          hint="pass replace=True to register it again")
    if isinstance(workload, str):
        parse_path(workload)
        _OBJECTS.pop(name, None)
        path = workload
    elif isinstance(workload, Workload) or callable(workload):
        _OBJECTS[name] = workload
        path = ""
    else:
        raise ConfigError(f"register({name!r}, {brief(workload)}): not a workload",
                          hint="pass 'module:attribute', a Workload subclass, an instance or a "
                               "function returning one")
    os.environ[ENV_VAR] = json.dumps({**_env_paths(), name: path}, sort_keys=True)


def unregister(name: str) -> None:
    """Forget a registration made with :func:`register` (no error when there is none).

    Raises:
        ConfigError: ``name`` is not a workload name (:func:`check_name`).
    """
    check_name(name)
    _OBJECTS.pop(name, None)
    paths = _env_paths()
    if paths.pop(name, None) is not None:
        os.environ[ENV_VAR] = json.dumps(paths, sort_keys=True)


def registered() -> dict[str, str]:
    """Every workload of your own this process can find, name -> where it comes from
    (``"module:attr"``, ``"entry point module:attr"`` or ``"object in this process"``)."""
    out = {n: f"entry point {p}" for n, p in _entry_points().items()}
    out.update({n: p for n, p in _env_paths().items() if p})
    out.update({n: "object in this process" for n in _OBJECTS})
    return out


def _instance(name: str, obj: Any, where: str) -> Workload:
    """A fresh workload from what was registered, named ``name``."""
    if isinstance(obj, Workload):
        wl = copy.copy(obj)
    elif callable(obj):
        wl = obj()
    else:
        wl = None
    if not isinstance(wl, Workload):
        raise ConfigError(f"workload {name!r} ({where}) gave {type(wl).__name__}, not a Workload",
                          hint="register a Workload subclass, an instance or a function "
                               "returning one")
    wl.name = name
    return wl


def _load(name: str, path: str, where: str) -> Workload:
    module, attr = parse_path(path)
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as err:
        raise ConfigError(f"workload {name!r} ({where}): cannot import {module!r} ({err})",
                          hint="the module must be importable in the trial's process: a file in "
                               "its working directory or an installed package") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"workload {name!r} ({where}): {module!r} has no {attr!r}",
                              hint=f"check the import path {path!r}")
        obj = getattr(obj, part)
    return _instance(name, obj, where)


def lookup(name: str) -> Workload | None:
    """A fresh instance of the workload of your own called ``name``; ``None`` if there is none.

    Looked up in this process's objects, then the registered import paths (this process's or
    its parent's, through :data:`ENV_VAR`), then installed entry points.

    Raises:
        ConfigError: The name was registered as an object in another process (a notebook), which
            this process cannot see; or its import path cannot be imported; or ``name`` is not
            a workload name (a non-string, an unhashable object: :func:`check_name`).
    """
    check_name(name)
    if name in _OBJECTS:
        return _instance(name, _OBJECTS[name], "registered object")
    path = _env_paths().get(name)
    if path:
        return _load(name, path, f"registered as {path!r}")
    if path == "":
        raise ConfigError(
            f"workload {name!r} was registered as an object in the process that started this "
            "trial (e.g. a class defined in a notebook cell); this is a fresh interpreter, which "
            "cannot see it",
            hint=f"{_PORTABLE_HINT}, or run it with launcher=cml.launch.InProcess()")
    eps = _entry_points()
    if name in eps:
        return _load(name, eps[name], f"entry point {eps[name]!r}")
    return None


_PORTABLE_HINT = ("put the workload in a module file (e.g. my_models.py next to the notebook) "
                  "and register('NAME', 'my_models:MyWorkload')")


def check_reachable(name: str, launcher: Any) -> None:
    """Raise where ``launcher`` runs trials in processes that cannot find workload ``name``: one
    registered as an object in this process, with a launcher other than ``InProcess`` (whose
    ``describe()["kind"]`` is ``"inprocess"``; ``None`` stands for it).

    Raises:
        ConfigError: With the import-path fix in the hint.
    """
    if not isinstance(name, str) or name not in _OBJECTS or launcher is None or \
            launcher.describe().get("kind") == "inprocess":
        return
    raise ConfigError(
        f"workload {name!r} is an object registered in this process (e.g. a class defined in a "
        f"notebook cell); {type(launcher).__name__} runs each trial in a fresh interpreter, "
        "which cannot see it", hint=f"{_PORTABLE_HINT.replace('NAME', name)}; or use "
                                    "launcher=cml.launch.InProcess()")
