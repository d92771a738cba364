"""The knob vocabulary of :class:`~cubicml_lab.physics.model.LLMTrainingModel`, and the checks
of what a job and a config give it: which knobs and facts exist, what values each accepts, the
defaults, the layouts a job's GPUs can hold, and the ``names=``, ``values=`` and ``defaults=``
mappings that rename a user's knobs to these.

Example:
    >>> "tp" in KNOBS and "n_gpus" in FACTS
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._params import brief
from ..errors import ConfigError
from .profiles import GPUS, PRECISIONS, GPUSpec

__all__ = ["BUILTIN_DEFAULTS", "FACTS", "KNOBS", "MAX_FACT", "accepts", "check_defaults",
           "check_names", "check_values", "describe", "gpu_spec", "holds", "is_number",
           "layout_hint", "layout_message", "one_row", "typed_values"]

# ------------------------------------------------------------------------ the knob vocabulary
DEGREE, BOOL, SIZE = "a number from 1 to 2**53", "a bool", "a positive integer up to 2**53"
#: Largest fact or degree (GPUs, layers, sizes): the integers a float64 holds exactly.
MAX_FACT = 2**53
#: What each knob accepts: a description, or the tuple of its values.
KNOB_VALUES: dict[str, str | tuple[Any, ...]] = {
    "tp": DEGREE, "pp": DEGREE, "dp": DEGREE, "micro_batch": DEGREE,
    "virtual_stages": DEGREE, "recompute": ("none", "selective", "full"),
    "sequence_parallel": BOOL, "tp_overlap": BOOL, "dp_overlap": BOOL,
    "distributed_optimizer": BOOL, "zero_stage": (0, 1, 2, 3), "offload_weights": BOOL,
    "offload_activations": BOOL, "offload_optimizer": BOOL, "precision": tuple(PRECISIONS),
}
#: The knobs :class:`LLMTrainingModel` understands (its fixed vocabulary).
KNOBS: tuple[str, ...] = tuple(KNOB_VALUES)
#: Facts of the job that a config may also carry per row (e.g. a table whose rows differ in
#: model width); they then override the job's.
FACTS: tuple[str, ...] = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq_len", "vocab",
                          "global_batch", "n_gpus")
ACCEPTS: dict[str, str | tuple[Any, ...]] = {**KNOB_VALUES, **{f: DEGREE for f in FACTS}}
#: Knob values a job takes when neither its config nor ``defaults=`` sets them (precision: the
#: job's; dp: ``n_gpus / (tp pp)``).
BUILTIN_DEFAULTS: dict[str, Any] = {
    "tp": 1, "pp": 1, "micro_batch": 1, "virtual_stages": 1, "recompute": "none",
    "sequence_parallel": False, "tp_overlap": False, "dp_overlap": True,
    "distributed_optimizer": False, "zero_stage": 0, "offload_weights": False,
    "offload_activations": False, "offload_optimizer": False}


def is_number(value: Any) -> bool:
    """A finite real number (not a bool) no larger than :data:`MAX_FACT`."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or \
            isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return abs(int(value)) <= MAX_FACT
    return bool(np.isfinite(value)) and abs(float(value)) <= MAX_FACT


def accepts(name: str, value: Any) -> bool:
    """Whether ``value`` is a valid value of knob or fact ``name``."""
    kind = ACCEPTS[name]
    if kind == DEGREE:
        return is_number(value) and value >= 1
    if kind == BOOL:
        return isinstance(value, (bool, np.bool_)) or (is_number(value) and value in (0, 1))
    if name == "zero_stage":
        return is_number(value) and value in kind
    return isinstance(value, str) and value in kind


def describe(name: str) -> str:
    kind = ACCEPTS[name]
    return kind if isinstance(kind, str) else "one of " + ", ".join(map(repr, kind))


def typed_values(name: str, values: list[Any]) -> np.ndarray:
    """Valid values of ``name`` as the array type the physics computes with."""
    kind = ACCEPTS[name]
    if kind == DEGREE:
        return np.asarray(values, dtype=np.float64)
    if kind == BOOL:
        return np.asarray([bool(v) for v in values], dtype=bool)
    if name == "zero_stage":
        return np.asarray(values, dtype=np.int64)
    return np.asarray(values, dtype=object)


def hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------------ checks
def holds(x: Mapping[str, np.ndarray], derived: np.ndarray) -> np.ndarray:
    """Per row: dp a whole number >= 1 where it was derived from ``n_gpus / (tp pp)``,
    ``tp pp dp <= n_gpus`` where it was given."""
    n, tp, pp, dp = x["n_gpus"], x["tp"], x["pp"], x["dp"]
    whole = (dp >= 1) & (np.abs(dp - np.round(dp)) < 1e-9)
    return np.where(derived, whole, tp * pp * dp <= n * (1 + 1e-9))


def layout_message(x: Mapping[str, np.ndarray], i: int, derived: bool, frame: bool) -> str:
    tp, pp, dp, n = (float(x[k][i]) for k in ("tp", "pp", "dp", "n_gpus"))
    row = f"row {i}: " if frame else ""
    if derived:
        return (f"{row}tp * pp = {tp:g} * {pp:g} = {tp * pp:g} does not divide n_gpus = {n:g}: "
                f"the data-parallel degree would be {dp:g}, not a whole number >= 1")
    return (f"{row}tp * pp * dp = {tp:g} * {pp:g} * {dp:g} = {tp * pp * dp:g} is more than "
            f"n_gpus = {n:g}")


def layout_hint(names: Mapping[str, str], n_gpus: int) -> str:
    user = {v: k for k, v in names.items()}
    tp, pp = user.get("tp", "tp"), user.get("pp", "pp")
    divisors = [d for d in range(1, min(n_gpus, 100_000) + 1) if n_gpus % d == 0][:12]
    return (f"choose {tp} * {pp} among {', '.join(map(str, divisors))}: add the constraint "
            f"'n_gpus % ({tp} * {pp}) == 0' to the space (with n_gpus as a constant)")


def one_row(config: Mapping[str, Any]) -> dict[str, list[Any]]:
    if not isinstance(config, Mapping):
        raise ConfigError(f"config = {brief(config)} is not a dict",
                          hint="pass one configuration as a dict, many as a DataFrame to the "
                               "*_frame methods")
    return {k: [v] for k, v in config.items()}


def gpu_spec(gpu: Any) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    if not isinstance(gpu, str) or gpu not in GPUS:
        raise ConfigError(f"gpu = {brief(gpu)} is not one of {list(GPUS)}",
                          hint="pick one, or pass a GPUSpec(...) describing yours")
    return GPUS[gpu]


def _as_mapping(arg: str, given: Any, example: str) -> Mapping[Any, Any]:
    """``given`` (None: empty) as the mapping argument ``arg`` of the model, else an error
    showing ``example``."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"{arg} = {brief(given)} is not a dict", hint=f"{arg}={example}")
    return given


def check_names(names: Any) -> dict[str, str]:
    names = _as_mapping("names", names, "{'tensor_par': 'tp'} maps your name onto the "
                                        "vocabulary")
    seen: dict[str, str] = {}
    for user, target in names.items():
        if not isinstance(target, str) or target not in ACCEPTS:
            raise ConfigError(f"names[{brief(user)}] = {brief(target)} is not a knob or fact "
                              "of the model",
                              hint=f"map {brief(user)} onto one of {', '.join(KNOBS)} "
                                            f"(or facts {', '.join(FACTS)}), or leave it out "
                                            "of names= to let the GP model it")
        if target in seen:
            raise ConfigError(f"names[{brief(seen[target])}] and names[{brief(user)}] both map "
                              f"onto {brief(target)}", hint="map each vocabulary name from one key")
        seen[target] = user
    return dict(names)


def check_values(values: Any, names: Mapping[str, str]) -> dict[str, dict[Any, Any]]:
    values = _as_mapping("values", values, "{'activation_recompute': {'attn_only': "
                                           "'selective'}}")
    out = {}
    for user, mapping in values.items():
        target = names.get(user, user)
        if not isinstance(target, str) or target not in ACCEPTS:
            raise ConfigError(f"values[{brief(user)}]: {brief(user)} is neither a key of "
                              "names= nor a knob of the model",
                              hint=f"add names={{{brief(user)}: <knob>}} or key "
                                                   f"values= by a knob: {', '.join(KNOBS)}")
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"values[{brief(user)}] = {brief(mapping)} is not a dict",
                              hint=f"values={{{brief(user)}: {{<your value>: <model value>}}}}")
        for raw, value in mapping.items():
            if not accepts(target, value):
                raise ConfigError(f"values[{brief(user)}][{brief(raw)}] = {brief(value)} is "
                                  f"not a valid {brief(target)}: it must be {describe(target)}",
                                  hint=f"map {brief(raw)} onto a valid value of {brief(target)}")
        out[user] = dict(mapping)
    return out


def check_defaults(defaults: Any, names: Mapping[str, str],
                    values: Mapping[str, Mapping[Any, Any]]) -> dict[str, Any]:
    defaults = _as_mapping("defaults", defaults, "{'sequence_parallel': True}")
    out = {}
    for user, raw in defaults.items():
        knob = names.get(user, user)
        value = values.get(user, {}).get(raw, raw) if hashable(raw) else raw
        if not isinstance(knob, str) or knob not in KNOBS or knob == "dp" or \
                not accepts(knob, value):
            raise ConfigError(f"defaults[{brief(user)}] = {brief(raw)} is not a valid default",
                              hint=f"give a knob of {', '.join(k for k in KNOBS if k != 'dp')} "
                                   "a valid value (dp follows from n_gpus / (tp pp))")
        out[knob] = value
    return out
