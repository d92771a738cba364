"""Campaign files: a campaign as YAML, which ``cubicml-lab run FILE`` starts or resumes headless.

A campaign file holds plain data only: the space (as :meth:`~cubicml_lab.Space.to_dict` writes
it), the workload's name, the fixed knobs, the device, the measure options, the reference
configuration, the launcher and searcher as descriptions
(:func:`~cubicml_lab.launch.describe.launcher_from_dict`,
:func:`~cubicml_lab.search.describe.searcher_from_dict`), the store's path, the budget and how
many trials run at once. It is read with YAML's safe loader and checked like a space (unknown
keys, bad values, a bad space, launcher or searcher are refused naming the field); nothing in it
is executed. :meth:`Campaign.to_yaml <cubicml_lab.Campaign.to_yaml>` writes one and
:meth:`Campaign.from_yaml <cubicml_lab.Campaign.from_yaml>` reads one, through this module.

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

from .errors import ConfigError, SpaceError
from .space import Space
from .store import TrialStore

__all__ = ["FILE_KEYS", "campaign_from_file", "campaign_to_dict", "read_campaign_file",
           "write_campaign_file"]

#: The keys of a campaign file (``name``, ``workload`` and ``space`` are required).
FILE_KEYS = ("name", "workload", "space", "fixed", "device", "measure_options", "reference",
             "launcher", "searcher", "store", "budget", "parallel", "command")
#: The keys of a file's ``command`` (``Command``'s arguments; the name is ``workload``).
COMMAND_KEYS = ("argv", "env", "config_file", "config_keys", "metrics", "units", "cwd",
                "timeout_s", "stall_s", "grace_s", "config_name", "config_template")
_MAX_BYTES = 1 << 20


def campaign_to_dict(camp: Any, budget: int | None = None,
                     parallel: int | None = None) -> dict[str, Any]:
    """``camp`` (a :class:`~cubicml_lab.Campaign`) as plain data, the form of a campaign file.

    Raises:
        ConfigError: The searcher holds what a file cannot (a cost model function, ...).
    """
    from .search.describe import searcher_to_dict

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
    from .workloads import Command

    entry = data.get("command")
    if entry is None:
        return None
    unknown = sorted(str(k) for k in set(entry) - set(COMMAND_KEYS)) \
        if isinstance(entry, dict) else None
    if unknown is None or unknown:
        raise ConfigError(f"{path}: command must be a mapping of {', '.join(COMMAND_KEYS)}"
                          + (f"; unknown key(s) {unknown}" if unknown else ""),
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


def _consent(path: str | os.PathLike[str], command: Any, space: Space,
             fixed: Any) -> None:
    """Refuse a file that names a program, listing what it would run."""
    shown = command.bind(space, fixed).describe()
    raise ConfigError(f"{path} runs a program of its own; it would run:\n{shown}",
                      hint="run it only if you trust the file: cubicml-lab run --allow-commands "
                           f"{path} (Campaign.from_yaml(path, allow_commands=True))")


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
    from .launch.describe import launcher_from_dict
    from .search.describe import searcher_from_dict

    data = read_campaign_file(path)
    try:
        space = Space.from_dict(data["space"])
    except SpaceError as err:
        raise SpaceError(f"{path}: space: {err.message}", hint=err.hint or "") from None
    command = _file_command(path, data)
    if command is not None and not allow_commands:
        _consent(path, command, space, data.get("fixed"))
    camp = cls(str(data["name"]), space, workload=command or data["workload"],
               launcher=launcher_from_dict(data.get("launcher") or {"kind": "subprocess"}),
               searcher=searcher_from_dict(space, data.get("searcher") or {}),
               store=TrialStore(data.get("store") or "data/lab.sqlite"),
               device=data.get("device") or "cpu", measure_options=data.get("measure_options"),
               fixed=data.get("fixed"), reference=data.get("reference"))
    for key, default in (("budget", None), ("parallel", 1)):
        value = data.get(key, default)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ConfigError(f"{path}: {key} = {value!r} must be a positive int",
                              hint=f"e.g. {key}: {12 if key == 'budget' else 1}")
        setattr(camp, key, value)
    return camp


def read_campaign_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A campaign file's mapping, checked for its shape (safe YAML loader, at most 1 MiB).

    Raises:
        ConfigError: The file cannot be read, is too big, is not UTF-8 YAML or not a mapping,
            has unknown keys or lacks a required one, or a mapping key holds something else.
    """
    import yaml

    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read campaign file {path}: {err.strerror or err}",
                          hint="pass the path of a YAML file (Campaign.to_yaml writes one)") \
            from None
    if len(raw) > _MAX_BYTES:
        raise ConfigError(f"{path}: {len(raw):,} bytes, more than a campaign file's 1 MiB",
                          hint="a campaign file holds a space and a few options")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"{path}: not UTF-8 YAML ({str(err).splitlines()[0][:160]})",
                          hint="fix the file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a campaign file is a mapping, got {type(data).__name__}",
                          hint="keys: " + ", ".join(FILE_KEYS))
    unknown = sorted(str(k) for k in set(data) - set(FILE_KEYS))
    missing = [k for k in ("name", "workload", "space") if k not in data]
    if unknown or missing:
        raise ConfigError(f"{path}: " + (f"unknown key(s) {unknown}" if unknown else
                                         f"missing key(s) {missing}"),
                          hint="keys: " + ", ".join(FILE_KEYS) + " (name, workload, space "
                               "required)")
    for key in ("fixed", "measure_options", "reference"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ConfigError(f"{path}: {key} must be a mapping, got {data[key]!r:.80}",
                              hint=f"e.g. {key}: {{}}")
    return data
