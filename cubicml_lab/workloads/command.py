"""A user's own training job as a workload: a command line, its environment and config file.

:class:`Command` describes a program the lab launches once per trial: an argument list whose
items may hold ``{knob}`` placeholders, environment variables the same, and optionally a config
file (YAML, TOML or JSON) written per trial from a template, with knob values set at dotted keys
(torchtitan and NeMo are configured that way). Nothing ever goes through a shell: the rendered
argument list is handed to the operating system as a list, so a value with shell
metacharacters is one argument, never interpreted. Where its figures come from (a metrics file
the job appends to, or its log lines) is :mod:`cubicml_lab.workloads.job_reports`; running it is
:mod:`cubicml_lab.launch.job`. Everything is checked when the object is built (or bound to a
space by a campaign), so a mistake shows in the cell that made it. Importing this module imports
no torch.

Example:
    >>> job = Command("toy", argv=["python", "train.py", "--tp={tp}", "--name={name}"])
    >>> job.render({"tp": 2, "name": "a b; rm -rf /"}).argv
    ['python', 'train.py', '--tp=2', '--name=a b; rm -rf /']
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .base import Built, Knob, Workload
from .config_files import dump_config, load_config, set_dotted
from .job_reports import PATTERNS, check_sources
from .templates import clean_text, placeholders, scalar_text

if TYPE_CHECKING:
    from ..space import Space
    from .parallel import World

__all__ = ["Command", "RenderedJob", "RESERVED"]

#: Placeholders the lab fills in itself: the path of the config file it wrote for the trial,
#: and the trial's folder (where the metrics file and the logs are).
RESERVED = ("config_file", "trial_dir")
_SCALARS = (bool, int, float, str)  # what a knob value may be


@dataclass(frozen=True, kw_only=True)
class RenderedJob:
    """One trial's job, ready to start.

    Attributes:
        argv: The argument list (never run through a shell).
        env: Environment variables set on top of the trial's.
        config_name: File name of the config file to write in the trial's folder, or None.
        config_text: Its text, or None.
    """

    argv: list[str]
    env: dict[str, str]
    config_name: str | None = None
    config_text: str | None = None


class Command(Workload):
    """A training job the lab runs as a program, once per trial (see the module docstring).

    Args:
        name: The workload's name in the store (e.g. ``"llama-8b"``).
        argv: The argument list; items may hold ``{knob}`` placeholders, plus ``{config_file}``
            (the config file written for the trial) and ``{trial_dir}`` (the trial's folder).
            ``argv[0]`` is found on ``PATH`` when it has no slash. Never run through a shell.
        env: Environment variables for the job, values with placeholders as in ``argv``.
        config_file: A template config file (``.yaml``/``.yml``, ``.toml`` or ``.json``), read
            now; a copy with ``config_keys`` set is written into each trial's folder.
        config_keys: Dotted key in the config file -> knob name, e.g.
            ``{"parallelism.tensor_parallel_degree": "tp"}``; missing tables are created.
        metrics: Where figures come from, one or more of: ``"report"`` (the metrics file the
            job appends to with :mod:`cubicml_lab.report`; its path is in the environment
            variable ``CUBICML_LAB_METRICS``), a ready log pattern's name (``"torchtitan"``,
            ``"megatron"``, ``"hf_trainer"``; see :attr:`patterns`) or a regular expression
            with named groups matched against each line of the job's stdout and stderr
            (:data:`~cubicml_lab.workloads.job_reports.GROUPS` lists the group names read).
        units: What a step consumes, ``"tokens"`` or ``"samples"``: the throughput metric is
            ``<units>_per_s``.
        cwd: Working directory of the job (default: the trial process's).
        timeout_s: Seconds the job may run in all; past it the job is stopped and the trial is
            ``timeout`` (``"no step reported"`` in its error when none was).
        stall_s: Seconds without a new step report, once steps were reported, after which the
            job counts as hung: stopped, status ``timeout``.
        grace_s: Seconds between SIGTERM to the job's process group and SIGKILL.

    Raises:
        ConfigError: An unknown placeholder form, a control character, a non-scalar value, a
            template that cannot be read or parsed, a bad pattern (no named group the lab
            reads); the message names the field.

    Example:
        >>> job = Command("toy", argv=["python", "-c", "pass", "{mb}"], metrics=["megatron"])
        >>> job.placeholders()
        ['mb']
    """

    version = "command-1"
    #: Ready log patterns by name (regular expressions with named groups).
    patterns: Mapping[str, str] = PATTERNS

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 config_file: str | os.PathLike[str] | None = None,
                 config_keys: Mapping[str, str] | None = None,
                 metrics: str | Sequence[str] = ("report",), units: str = "tokens",
                 cwd: str | os.PathLike[str] | None = None, timeout_s: float = 600.0,
                 stall_s: float = 120.0, grace_s: float = 5.0) -> None:
        if not (isinstance(name, str) and name.strip()):
            raise ConfigError(f"Command name = {name!r} must be a non-empty string",
                              hint='e.g. Command("llama-8b", argv=[...])')
        self.name = clean_text("Command name", name)
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
            raise ConfigError(f"Command argv = {argv!r:.120} must be a non-empty list of strings",
                              hint='split the command line yourself: ["python", "train.py", '
                                   '"--lr=0.1"]; nothing goes through a shell')
        self.argv = [self._text(f"argv[{i}]", a) for i, a in enumerate(argv)]
        self.env = {self._env_name(k): self._text(f"env[{k!r}]", v)
                    for k, v in dict(env or {}).items()}
        self.config_name, self.config_template = self._read_template(config_file)
        self.config_keys = self._config_keys(config_keys)
        self.metrics = check_sources(metrics)
        if units not in ("tokens", "samples"):
            raise ConfigError(f"Command units = {units!r} must be 'tokens' or 'samples'",
                              hint="what one optimizer step consumes")
        self.units = units
        self.cwd = None if cwd is None else os.fspath(cwd)
        self.timeout_s = self._seconds("timeout_s", timeout_s)
        self.stall_s = self._seconds("stall_s", stall_s)
        self.grace_s = self._seconds("grace_s", grace_s)
        self._knobs: dict[str, Knob] | None = None  # set by bind()

    # -- checks at definition ------------------------------------------------------------------
    @staticmethod
    def _text(where: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"Command {where} = {value!r} must be a string",
                              hint="write every argument as text, e.g. '--steps=10'")
        placeholders(f"Command {where}", value)
        return value

    @staticmethod
    def _env_name(key: Any) -> str:
        if not (isinstance(key, str) and key and key.replace("_", "a").isalnum()
                and not key[0].isdigit()):
            raise ConfigError(f"Command env key {key!r} is not an environment variable name",
                              hint="letters, digits and _, not starting with a digit")
        return key

    @staticmethod
    def _seconds(name: str, value: Any) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and value > 0):
            raise ConfigError(f"Command {name} = {value!r} must be a finite number of seconds > 0",
                              hint=f"e.g. {name}=60")
        return float(value)

    @staticmethod
    def _read_template(path: Any) -> tuple[str | None, dict[str, Any] | None]:
        if path is None:
            return None, None
        data = load_config(path)
        try:
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"Command config_file {os.fspath(path)!r} holds a value JSON cannot "
                              f"carry ({err})", hint="dates and times as strings") from None
        return Path(path).name, data

    def _config_keys(self, keys: Mapping[str, str] | None) -> dict[str, str]:
        keys = dict(keys or {})
        if keys and self.config_template is None:
            raise ConfigError("Command config_keys given without config_file",
                              hint="pass config_file= the template the keys are set in")
        for key, knob in keys.items():
            parts = key.split(".") if isinstance(key, str) else [""]
            if not all(p and p.strip() == p for p in parts):
                raise ConfigError(f"Command config_keys key {key!r} is not a dotted key",
                                  hint='e.g. "parallelism.tensor_parallel_degree"')
            if not (isinstance(knob, str) and knob.isidentifier()):
                raise ConfigError(f"Command config_keys[{key!r}] = {knob!r} is not a knob name",
                                  hint='e.g. {"training.local_batch_size": "micro_batch"}')
        return keys

    def _templates(self) -> list[tuple[str, str]]:
        return ([(f"argv[{i}]", a) for i, a in enumerate(self.argv)]
                + [(f"env[{k!r}]", v) for k, v in self.env.items()])

    def placeholders(self) -> list[str]:
        """The knob names the job needs, in order of first use (argv, env, config keys)."""
        seen: dict[str, None] = {}
        for where, text in self._templates():
            for _, name in placeholders(where, text):
                if name is not None and name not in RESERVED:
                    seen.setdefault(name)
        for knob in self.config_keys.values():
            seen.setdefault(knob)
        return list(seen)

    # -- knobs from a space --------------------------------------------------------------------
    def bind(self, space: Space, fixed: Mapping[str, Any] | None = None) -> Command:
        """A copy whose knobs are the space's parameters, constants and derived values (and
        ``fixed``): what a campaign runs. Every placeholder must name one of them, and every
        value they can take must be a plain scalar.

        Raises:
            ConfigError: A placeholder for an unknown knob (named, with the known ones), or a
                knob named like a reserved placeholder.
        """
        sample = space.resolve(space.sample(1, seed=0)[0])
        sample.update(dict(fixed or {}))
        clash = sorted(set(sample) & set(RESERVED))
        if clash:
            raise ConfigError(f"knob(s) {clash} of Command {self.name!r} are reserved "
                              "placeholders", hint=f"rename them; {list(RESERVED)} are the lab's")
        unknown = [n for n in self.placeholders() if n not in sample]
        if unknown:
            raise ConfigError(f"Command {self.name!r} uses placeholder(s) {unknown} that are "
                              "not knobs of the space", hint=f"knobs: {', '.join(sample)}")
        bound = copy.copy(self)
        bound._knobs = {n: Knob(default=v, type=type(v) if isinstance(v, _SCALARS) else str,
                                doc="from the campaign's space") for n, v in sample.items()}
        bound.resolve(sample)
        return bound

    def knobs(self) -> dict[str, Knob]:
        """The bound space's names; unbound, the placeholders (no default)."""
        if self._knobs is not None:
            return dict(self._knobs)
        return {n: Knob(default=None, type=str, doc="placeholder") for n in self.placeholders()}

    def resolve(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``config`` checked: every placeholder has a value, every value is a plain scalar.

        Raises:
            ConfigError: A missing knob, an unknown one (bound), a non-scalar value or text with
                a control character; the message names the knob.
        """
        config = dict(config or {})
        known = self.knobs()
        if self._knobs is not None:
            unknown = sorted(set(config) - set(known), key=str)
            if unknown:
                raise ConfigError(f"unknown knob(s) {unknown} for Command {self.name!r}",
                                  hint=f"known knobs: {', '.join(known)}")
            config = {**{n: k.default for n, k in known.items()}, **config}
        missing = [n for n in self.placeholders() if n not in config]
        if missing:
            raise ConfigError(f"Command {self.name!r} needs a value for {missing}",
                              hint="every {placeholder} needs a knob value")
        for name, value in config.items():
            scalar_text(f"knob {name!r}", value)
        return config

    def build(self, config: Mapping[str, Any], device: str, world: World | None = None) -> Built:
        """A Command is not built in this process: a launcher runs it as a program."""
        raise ConfigError(f"Command {self.name!r} runs as a program, not in this process",
                          hint="run it through a launcher: cml.launch.InProcess().run(spec) "
                               "or a Campaign")

    # -- one trial -----------------------------------------------------------------------------
    def render(self, config: Mapping[str, Any], trial_dir: str = "{trial_dir}") -> RenderedJob:
        """The argument list, environment and config file of one trial.

        Raises:
            ConfigError: As :meth:`resolve`.
        """
        config = self.resolve(config)
        config_path = (os.path.join(trial_dir, self.config_name) if self.config_name
                       else "")
        fill = {**{k: scalar_text(f"knob {k!r}", v) for k, v in config.items()},
                "trial_dir": trial_dir, "config_file": config_path}

        def sub(where: str, text: str) -> str:
            return "".join(lit + (fill[name] if name is not None else "")
                           for lit, name in placeholders(where, text))

        text = None
        if self.config_template is not None and self.config_name is not None:
            data = copy.deepcopy(self.config_template)
            for key, knob in self.config_keys.items():
                set_dotted(data, key, config[knob])
            text = dump_config(data, self.config_name)
        return RenderedJob(argv=[sub(f"argv[{i}]", a) for i, a in enumerate(self.argv)],
                           env={k: sub(f"env[{k!r}]", v) for k, v in self.env.items()},
                           config_name=self.config_name, config_text=text)

    # -- travel ---------------------------------------------------------------------------------
    def to_spec(self) -> dict[str, Any]:
        """Everything needed to run it elsewhere, as plain JSON (the template's content
        included: a worker on another node does not read the user's file)."""
        return {"name": self.name, "argv": list(self.argv), "env": dict(self.env),
                "config_name": self.config_name, "config_template": self.config_template,
                "config_keys": dict(self.config_keys), "metrics": list(self.metrics),
                "units": self.units, "cwd": self.cwd, "timeout_s": self.timeout_s,
                "stall_s": self.stall_s, "grace_s": self.grace_s}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Command:
        """Rebuild from :meth:`to_spec` output, with every check of the constructor.

        Raises:
            ConfigError: Not such a dict, or a field fails its check.
        """
        known = {"name", "argv", "env", "config_name", "config_template", "config_keys",
                 "metrics", "units", "cwd", "timeout_s", "stall_s", "grace_s"}
        if not isinstance(spec, Mapping) or not {"name", "argv"} <= set(spec) \
                or set(spec) - known:
            raise ConfigError(f"not a Command spec: {str(spec)[:200]}",
                              hint=f"pass what Command.to_spec() wrote (keys {sorted(known)})")
        kw = {k: spec[k] for k in ("env", "metrics", "units", "cwd", "timeout_s", "stall_s",
                                   "grace_s") if spec.get(k) is not None}
        job = cls(spec["name"], spec["argv"], **kw)
        template, name = spec.get("config_template"), spec.get("config_name")
        if template is not None:
            if not (isinstance(template, dict) and isinstance(name, str)):
                raise ConfigError(f"Command spec config_template/config_name = "
                                  f"{type(template).__name__}/{name!r}",
                                  hint="a dict and the template's file name")
            dump_config(template, name)  # a name of a known format
            job.config_name, job.config_template = clean_text("config_name", name), template
        job.config_keys = job._config_keys(spec.get("config_keys"))
        return job

    # -- how it shows itself -------------------------------------------------------------------
    def _sample_config(self) -> dict[str, Any]:
        if self._knobs is not None:
            return {n: k.default for n, k in self._knobs.items()}
        return {n: f"<{n}>" for n in self.placeholders()}

    def describe(self) -> str:
        """The job in words: argv template, a rendered argv, env, config keys, figure sources."""
        rendered = self.render(self._sample_config()).argv
        lines = [f"Command {self.name!r} ({self.units}/step)",
                 f"  argv template: {self.argv}", f"  rendered (sample config): {rendered}"]
        if self.env:
            lines.append(f"  env: {self.env}")
        if self.config_name:
            lines.append(f"  config file: {self.config_name}, keys {self.config_keys}")
        lines.append(f"  figures from: {', '.join(self.sources_in_words())}")
        return "\n".join(lines)

    def sources_in_words(self) -> list[str]:
        """Where the figures come from, for a person."""
        words = {"report": "the metrics file ($CUBICML_LAB_METRICS, cubicml_lab.report)"}
        named = {k: f"{k} log lines" for k in PATTERNS}
        return [words.get(s) or named.get(s) or f"log lines matching {s!r}"
                for s in self.metrics]

    def _repr_html_(self) -> str:
        from .._html import card

        sample = self._sample_config()
        facts = [("argv template", " ".join(self.argv)),
                 ("rendered argv", " ".join(self.render(sample).argv)),
                 ("for the config", ", ".join(f"{k}={v}" for k, v in sample.items()) or "-")]
        if self.env:
            facts.append(("env", ", ".join(f"{k}={v}" for k, v in self.env.items())))
        if self.config_name:
            facts.append(("config file", f"{self.config_name}: " + ", ".join(
                f"{k} <- {v}" for k, v in self.config_keys.items())))
        facts += [("figures from", "; ".join(self.sources_in_words())),
                  ("units", f"{self.units}/step"),
                  ("limits", f"timeout {self.timeout_s:g} s, hang after {self.stall_s:g} s "
                             "without a step")]
        return card(f"Command · {self.name}", facts,
                    note="run by a launcher, never through a shell; job.describe() in text")

    def __repr__(self) -> str:
        return f"Command({self.name!r}, argv={self.argv!r})"
