"""The co-design loop: ask the searcher, launch trials, measure, store, tell.

:class:`Campaign` ties a space, a workload, a launcher, a searcher and a trial store together
under a name (:mod:`~cubicml_lab.campaign.core`, which says how a campaign resumes, follows
Slurm jobs and stops). Its rooms, each a part of the one class:

* :mod:`~cubicml_lab.campaign.asking`: proposals, and a person's review of them.
* :mod:`~cubicml_lab.campaign.loop`: launch, store, tell; trials in parallel; the budget.
* :mod:`~cubicml_lab.campaign.recovery`: after a death or an interrupt.
* :mod:`~cubicml_lab.campaign.view`: tables, the best, the card in Jupyter.
* :mod:`~cubicml_lab.campaign.files`: campaign files (``to_yaml``, ``from_yaml``).
* :mod:`~cubicml_lab.campaign.checks`: device, measure options, budget and parallel.
"""

from .core import Campaign
from .view import format_trial

__all__ = ["Campaign", "format_trial"]
