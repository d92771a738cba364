"""Campaign files: a campaign as YAML, which ``cubicml-lab run FILE`` starts or resumes headless.

A campaign file holds the space (as :meth:`~cubicml_lab.Space.to_dict` writes it), the
workload's name, the fixed knobs, the device, the measure options, the reference configuration,
the launcher and searcher as descriptions
(:func:`~cubicml_lab.launch.describe.launcher_from_dict`,
:func:`~cubicml_lab.search.describe.searcher_from_dict`), the store's path, the budget and how
many trials run at once. :meth:`Campaign.to_yaml <cubicml_lab.Campaign.to_yaml>` writes one and
:meth:`Campaign.from_yaml <cubicml_lab.Campaign.from_yaml>` reads one, through this module.

Loading checks everything before anything runs: the file must be a regular file of at most
1 MiB (a FIFO or a device is refused, not read), it is parsed with YAML's safe loader with its
aliases' expansion bounded, and unknown keys, bad values, a bad space, launcher or searcher,
a size past its limit, or a value holding a control character are refused naming the field.

**A campaign file can name programs, and those run only with your consent.** Its recipe parts
are: a ``command`` (a user's program and its argv), a launcher interpreter other than the
default (``python``), any launcher ``env`` (``PYTHONPATH`` alone can make Python run code of the
file's choosing), and Slurm ``setup`` lines and ``extra_sbatch`` options (lines of the job
script). A file holding any of them is refused, with a list of exactly what it would run
(interpreter, variables with their values, sbatch and setup lines, argv), unless you pass
``allow_commands=True`` (``cubicml-lab run --allow-programs FILE``, or the older
``--allow-commands``). A file that :meth:`~cubicml_lab.Campaign.to_yaml` writes for a default
launcher and a built-in workload names no program and loads without it. See
``docs/threat-model.md``.

Example:
    >>> import pathlib, tempfile, cubicml_lab as cml
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)])
    >>> camp = cml.Campaign("gpt-cpu", space, workload="gpt",
    ...                     store=cml.TrialStore(folder / "lab.sqlite"))
    >>> path = camp.to_yaml(folder / "gpt-cpu.yaml", budget=12)
    >>> again = cml.Campaign.from_yaml(path)
    >>> again.name, again.budget, again.space == space
    ('gpt-cpu', 12, True)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._bounds import check_count, check_regular_or_absent, load_yaml, read_regular
from .._params import brief
from ..errors import ConfigError, SpaceError
from ..space import Space
from ..store import TrialStore

__all__ = ["FILE_KEYS", "campaign_from_file", "campaign_to_dict", "read_campaign_file",
           "recipe_of", "write_campaign_file"]

#: The keys of a campaign file (``name``, ``workload`` and ``space`` are required).
FILE_KEYS = ("name", "workload", "space", "fixed", "device", "measure_options", "reference",
             "launcher", "searcher", "store", "budget", "parallel", "command")
#: The keys of a file's ``command`` (``Command``'s arguments; the name is ``workload``).
COMMAND_KEYS = ("argv", "env", "config_file", "config_keys", "metrics", "units", "cwd",
                "timeout_s", "stall_s", "grace_s", "config_name", "config_template")
_MAX_BYTES = 1 << 20
_READ_HINT = "pass the path of a YAML file (Campaign.to_yaml writes one)"
#: Most trials a file's ``budget`` asks for, and most at once (``parallel``).
MAX_BUDGET, MAX_PARALLEL = 1_000_000, 1024


def campaign_to_dict(camp: Any, budget: int | None = None,
                     parallel: int | None = None) -> dict[str, Any]:
    """``camp`` (a :class:`~cubicml_lab.Campaign`) as plain data, the form of a campaign file.

    Raises:
        ConfigError: The searcher holds what a file cannot (a cost model function, ...).
    """
    from ..search.describe import searcher_to_dict

    return {"name": camp.name, "workload": camp.workload.name, "space": camp.space.to_dict(),
            "fixed": dict(camp.fixed), "device": camp.device,
            "measure_options": dict(camp.measure_options), "reference": camp.reference,
            "launcher": camp.launcher.describe(), "searcher": searcher_to_dict(camp.searcher),
            "store": str(camp.store.path),
            "budget": camp.budget if budget is None else budget,
            "parallel": camp.parallel if parallel is None else parallel,
            **_command_entry(camp.workload)}


def _command_entry(workload: Any) -> dict[str, Any]:
    """``{"command": ...}`` for a user's command (its config template inline), else ``{}``."""
    to_spec = getattr(workload, "to_spec", None)
    if not callable(to_spec):
        return {}
    return {"command": {k: v for k, v in to_spec().items() if k != "name" and v is not None}}


def _file_command(path: str | os.PathLike[str], data: dict[str, Any]) -> Any:
    """The file's ``command`` as a :class:`~cubicml_lab.workloads.Command` named by its
    ``workload`` (a relative ``config_file`` or ``cwd`` is the file's folder's), or None.

    Raises:
        ConfigError: Not a mapping, an unknown key, or what ``Command`` refuses, with the path.
    """
    from ..workloads import Command

    entry = data.get("command")
    if entry is None:
        return None
    unknown = sorted(str(k) for k in set(entry) - set(COMMAND_KEYS)) \
        if isinstance(entry, dict) else None
    if unknown is None or unknown:
        raise ConfigError(f"{path}: command must be a mapping of {', '.join(COMMAND_KEYS)}"
                          + (f"; unknown key(s) {brief(unknown)}" if unknown else ""),
                          hint="e.g. command: {argv: [python, train.py, '--batch={batch}']}")
    entry, here = dict(entry), Path(path).resolve().parent
    for key in ("config_file", "cwd"):
        if isinstance(entry.get(key), str):
            entry[key] = str(here / entry[key])
    try:
        if "config_file" in entry or "config_template" not in entry:
            return Command(str(data["workload"]), **entry)
        return Command.from_spec({"name": str(data["workload"]), **entry})
    except (ConfigError, TypeError) as err:
        message = getattr(err, "message", str(err))
        raise ConfigError(f"{path}: command: {message}",
                          hint=getattr(err, "hint", None) or "see Command's arguments") from None


def recipe_of(command: Any, launcher: Any, space: Space, fixed: Any) -> list[str]:
    """What a campaign would run besides the lab's own trial worker, one part per item: the
    command (its argv template and a rendered argv) and the launcher's recipe
    (:meth:`~cubicml_lab.launch.base.Launcher.recipe`). Empty when it names no program."""
    parts = [] if command is None else ["command: " + command.bind(space, fixed).describe()]
    return parts + launcher.recipe()


def _consent(path: str | os.PathLike[str], parts: list[str]) -> None:
    """Refuse a file that names programs, listing what it would run."""
    shown = "\n".join("  " + part.replace("\n", "\n    ") for part in parts)
    raise ConfigError(f"{path} names programs to run, and nothing in it runs without your "
                      f"consent; it would run:\n{shown}",
                      hint="run it only if you trust the file: cubicml-lab run --allow-programs "
                           f"{path} (or --allow-commands; in Python "
                           "Campaign.from_yaml(path, allow_commands=True))")


def write_campaign_file(camp: Any, path: str | os.PathLike[str], budget: int | None = None,
                        parallel: int | None = None) -> Path:
    """Write ``camp``'s campaign file to ``path`` and return the path."""
    import yaml

    out = Path(path)
    out.write_text(yaml.safe_dump(campaign_to_dict(camp, budget, parallel), sort_keys=False),
                   encoding="utf-8")
    return out


def campaign_from_file(cls: type, path: str | os.PathLike[str],
                       allow_commands: bool = False) -> Any:
    """The campaign (of class ``cls``) that the file at ``path`` describes, ready to run.

    Keys: ``name``, ``workload``, ``space`` (required); ``fixed``, ``device``,
    ``measure_options``, ``reference``, ``launcher`` (default subprocess), ``searcher``
    (default bayesian), ``store`` (default ``data/lab.sqlite``, relative to the working
    directory), ``budget``, ``parallel``; ``command`` (:data:`COMMAND_KEYS`: a user's program
    as :class:`~cubicml_lab.workloads.Command`, named by ``workload``), which is run only with
    ``allow_commands=True``: without it the file is checked and refused with what it would run.

    Raises:
        ConfigError, SpaceError, StoreError: What is wrong, with the file's path.
    """
    from ..search.describe import searcher_from_dict

    data = read_campaign_file(path)
    try:
        space = Space.from_dict(data["space"])
    except SpaceError as err:
        raise SpaceError(f"{path}: space: {err.message}", hint=err.hint or "") from None
    command = _file_command(path, data)
    launcher = _file_launcher(path, data.get("launcher") or {"kind": "subprocess"})
    parts = recipe_of(command, launcher, space, data.get("fixed"))
    if parts and not allow_commands:
        _consent(path, parts)
    sizes = {"budget": _size(path, data, "budget", None, MAX_BUDGET),
             "parallel": _size(path, data, "parallel", 1, MAX_PARALLEL)}
    store = data.get("store") or "data/lab.sqlite"
    if isinstance(store, str):
        check_regular_or_absent(store, what=f"{path}: store", error=ConfigError,
                                hint="name an SQLite file, or a new path")
    camp = cls(str(data["name"]), space, workload=command or data["workload"],
               launcher=launcher, searcher=searcher_from_dict(space, data.get("searcher") or {}),
               store=TrialStore(store),
               device=data.get("device") or "cpu", measure_options=data.get("measure_options"),
               fixed=data.get("fixed"), reference=data.get("reference"))
    for key, value in sizes.items():
        setattr(camp, key, value)
    return camp


def _size(path: str | os.PathLike[str], data: dict[str, Any], key: str, default: int | None,
          high: int) -> int | None:
    """The file's ``budget`` or ``parallel``: None (run's default) or an int in 1..``high``."""
    value = data.get(key, default)
    return None if value is None else check_count(f"{path}: {key}", value, high=high,
                                                  error=ConfigError)


def _file_launcher(path: str | os.PathLike[str], entry: Any) -> Any:
    """The file's launcher, its errors prefixed with the file's path."""
    from ..launch.describe import launcher_from_dict

    try:
        return launcher_from_dict(entry)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err.message}", hint=err.hint) from None


def read_campaign_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A campaign file's mapping, checked for its shape (safe YAML loader, at most 1 MiB).

    Raises:
        ConfigError: The file cannot be read, is too big, is not UTF-8 YAML or not a mapping,
            has unknown keys or lacks a required one, or a mapping key holds something else.
    """
    raw = read_regular(path, what="campaign file", max_bytes=_MAX_BYTES, error=ConfigError,
                       hint=_READ_HINT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 YAML ({err})", hint="fix the file") from None
    data = load_yaml(text, what=str(path), error=ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a campaign file is a mapping, got {type(data).__name__}",
                          hint="keys: " + ", ".join(FILE_KEYS))
    unknown = sorted(str(k) for k in set(data) - set(FILE_KEYS))
    missing = [k for k in ("name", "workload", "space") if k not in data]
    if unknown or missing:
        raise ConfigError(f"{path}: " + (f"unknown key(s) {brief(unknown)}" if unknown else
                                         f"missing key(s) {missing}"),
                          hint="keys: " + ", ".join(FILE_KEYS) + " (name, workload, space "
                               "required)")
    for key in ("fixed", "measure_options", "reference"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ConfigError(f"{path}: {key} must be a mapping, got {brief(data[key])}",
                              hint=f"e.g. {key}: {{}}")
    return data
