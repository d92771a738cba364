"""Matplotlib figures of campaigns and predictors, computed as data first, then drawn.

Each ``*_data`` function returns a pandas DataFrame that a notebook can show or test; each
``plot_*`` function draws it on an Axes (a new Figure when none is given) and returns the Figure.
Nothing here changes the store or the model: plots only read the API below them. One style
throughout: trial axes count whole trials, regret and other fractions are drawn in percent
(the data keep fractions, 0.05 = 5 %), failures are red crosses, and legends sit where they hide
the least (``loc="best"`` on a translucent frame) or below the axes when the data fill them.

=========================  ==================================================================
figure                     data
=========================  ==================================================================
plot_best_so_far           a campaign's trials (:func:`best_so_far_data`)
plot_regret_curves         replays stacked over seeds (:func:`regret_curves_data`)
plot_parity                measured vs out-of-fold predictions (``cross_val_predict``)
plot_learning_curve        ``learning_curve`` output (:func:`learning_curve_data`)
plot_partial_dependence    ``partial_dependence`` or ``slices`` output, one panel per knob
plot_importance            ``knob_importance`` or ``GPPredictor.importance`` output
plot_pareto                trials or ``BayesianSearch.pareto()`` (:func:`pareto_data`)
plot_feasibility_map       ``feasibility_map`` output, measured statuses overlaid
campaign_figure            best-so-far and parity side by side
=========================  ==================================================================

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"trial_id": [1, 2, 3], "status": ["ok", "oom", "ok"],
    ...                    "throughput": [10.0, None, 30.0]})
    >>> best_so_far_data(df)["best"].tolist()
    [10.0, 10.0, 30.0]
"""

from __future__ import annotations

from ._campaign import (best_so_far_data, campaign_figure, pareto_data, plot_best_so_far,
                        plot_pareto, plot_regret_curves, plot_repeats, regret_curves_data)
from ._predictor import (learning_curve_data, plot_feasibility_map, plot_importance,
                         plot_learning_curve, plot_parity, plot_partial_dependence, plot_slices)

__all__ = ["best_so_far_data", "campaign_figure", "learning_curve_data", "pareto_data",
           "plot_best_so_far", "plot_feasibility_map", "plot_importance", "plot_learning_curve",
           "plot_pareto", "plot_parity", "plot_partial_dependence",
           "plot_regret_curves", "plot_repeats", "plot_slices", "regret_curves_data"]
