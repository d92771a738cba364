"""Jupyter views of a space, a campaign and a predictor, as ipywidgets 8 boxes.

One module per widget (``space_editor``, ``dashboard``, ``review``, ``explorer``) and what they
share (``_common``); this package exports the four.

Each widget is an ``ipywidgets.VBox``: a cell's last line or ``display(w)`` renders it, and it
nests in other boxes. Every number it shows comes from the library; the widgets only wire it.

=====================  ==========================================================================
widget                 shows and does
=====================  ==========================================================================
SpaceEditor            a form that builds a :class:`~cubicml_lab.Space`: size, a sample, the error
CampaignDashboard      a campaign live: counts, best against the reference, figure, latest trials,
                       the proposals waiting or running with what the searcher expects of them
ProposalReview         the next proposal(s) with prediction, interval, P(fits) and why: accept and
                       run, skip (never proposed again), or edit the knobs and run that instead
PredictorExplorer      one control per knob -> predicted objective, 95% interval and P(fits)
=====================  ==========================================================================

State and drawing are kept apart: each state change is a plain method (``editor.apply()``,
``dashboard.refresh()``, ``review.accept()``, ``explorer.set_config(...)``) that the buttons call,
and the ``_draw*`` methods only read what those methods leave. A method that fails on a person's
input (a bad constraint, an edited configuration outside the space) keeps the error in ``.error``
and shows its message and hint in red instead of raising: in a button callback a traceback would
go to JupyterLab's log console, where nobody sees it. Kernel -> Interrupt while a click runs a
trial stops it there: the campaign ends and re-queues the trial and the widget says so in red;
the same method called from a cell (``review.accept()``) raises the ``KeyboardInterrupt`` on, so
*Run All* stops.

While ``campaign.run()`` blocks the kernel, the updates a dashboard sends on each campaign event
(:meth:`~cubicml_lab.campaign.Campaign.observe`) still reach JupyterLab, but button clicks wait
until the cell finishes. A dashboard of a campaign that runs in another process reads the store on
its refresh button, or every ``refresh_s`` seconds from a background thread.

Example:
    >>> import cubicml_lab as cml
    >>> editor = cml.widgets.SpaceEditor(cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)]))
    >>> editor.space.size(), editor.error is None
    (4, True)
"""

from __future__ import annotations

try:
    import ipywidgets  # noqa: F401
except ImportError as err:  # the notebooks extra is optional for the library
    from ..errors import DependencyError

    raise DependencyError(f"cubicml_lab.widgets needs ipywidgets ({err})",
                          hint="pip install -e '.[notebooks]' (make lab installs it)") from None

from .dashboard import CampaignDashboard
from .explorer import PredictorExplorer
from .review import ProposalReview
from .space_editor import SpaceEditor

__all__ = ["CampaignDashboard", "PredictorExplorer", "ProposalReview", "SpaceEditor"]
