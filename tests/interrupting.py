"""What the interrupt tests share: a campaign whose one trial trains until it is stopped, as
source text (for a script, a CLI campaign file or a Jupyter kernel) or as an object, and a look
at the store for its running trial."""

from __future__ import annotations

from pathlib import Path

import cubicml_lab as cml

#: Measure options of a trial that trains until it is stopped (2 minutes at the most).
UNTIL_STOPPED = {"max_time_s": 120, "warmup_max_s": 0.5, "min_steps": 3, "max_steps": 10**7,
                 "target_rel_ci": 1e-9}
TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "vocab": 128}

#: Source that builds ``camp``, campaign "int" stored at ``STORE_PATH`` (replace it with the
#: path's repr), one subprocess per trial, each training until it is stopped.
CAMPAIGN_SOURCE = f"""
import cubicml_lab as cml
space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 4)])
store = cml.TrialStore(STORE_PATH)
camp = cml.Campaign("int", space, workload="gpt", store=store,
                    launcher=cml.launch.Subprocess(timeout_s=300),
                    searcher=cml.RandomSearch(space, seed=0),
                    measure_options={UNTIL_STOPPED!r}, fixed={TINY!r})
"""


def campaign(path: Path, name: str = "int") -> cml.Campaign:
    """The campaign :data:`CAMPAIGN_SOURCE` builds, as an object in this process."""
    scope: dict = {}
    exec(CAMPAIGN_SOURCE.replace("STORE_PATH", repr(str(path))).replace('"int"', repr(name)),
         scope)
    return scope["camp"]


def trial_running(path: Path, name: str = "int") -> bool:
    """Whether the store at ``path`` holds a running trial of campaign ``name``."""
    if not path.exists():
        return False
    with cml.TrialStore(path) as store:
        return name in store.campaigns() and bool(store.trials(name, status="running"))
