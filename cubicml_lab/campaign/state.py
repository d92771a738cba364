"""What every part of a campaign shares: the attributes :class:`~cubicml_lab.Campaign` sets.

:class:`CampaignState` names them once, with their types, for the parts of the class
(:mod:`~cubicml_lab.campaign.asking`, :mod:`~cubicml_lab.campaign.loop`,
:mod:`~cubicml_lab.campaign.recovery`, :mod:`~cubicml_lab.campaign.view`); it sets nothing
but the defaults of ``_cost_cap_s`` and ``_early_stop``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..launch import Launcher
    from ..search.proposal import Proposal
    from ..space import Space
    from ..store import TrialStore
    from ..workloads.base import Workload

__all__ = ["CampaignState"]


class CampaignState:
    """The attributes of a :class:`~cubicml_lab.Campaign` (set in its ``__init__``)."""

    name: str
    space: Space
    store: TrialStore
    searcher: Any
    launcher: Launcher
    workload: Workload
    device: str
    reference: dict[str, Any] | None
    stop_reason: str | None
    #: Proposals handed out by ``propose`` and not yet launched or skipped.
    proposals: list[Proposal]
    _told_keys: set[str]  # configurations told (a proposal of one: a repeat)
    _resumed: list[Proposal]  # interrupted trials to run again (or to follow) first
    _in_flight: dict[int, Proposal]  # trials running here
    _held: set[int]  # trials running in another live process
    _taking: set[int]  # interrupted trials being taken to run
    _attach: dict[int, dict[str, Any]]  # trial -> dead owner's record of its job
    _stop: threading.Event
    _running: bool  # run() in progress
    _swept: bool  # dead campaigns' trial folders swept
    #: run()'s ``budget_device_hours`` in device-seconds (None: no cost limit).
    _cost_cap_s: float | None = None
    #: run()'s ``early_stop`` margin (None: off): each trial's spec carries the best so far
    #: to beat and this margin.
    _early_stop: float | None = None
