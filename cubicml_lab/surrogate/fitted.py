"""What a fitted GP says: its posterior at encoded rows, and what its cost-model mean learned.

:class:`FittedGP` is the reading half of :class:`~cubicml_lab.surrogate.GPPredictor`: the
exact predictive mean and variance from one cached Cholesky factor (:meth:`posterior_encoded`),
each cost term's share of a configuration's modelled cost (:meth:`cost_shares`), the inputs'
importance (:meth:`importance`) and the slope of the targets on a covariate
(:meth:`covariate_slope`). It holds no fitting code; ``GPPredictor.fit`` sets the model it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PredictorError
from .base import BasePredictor, _as_float_array
from .terms import names_of

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = ["FittedGP"]

#: Exact (Cholesky) solves up to this many training points; GPyTorch's default (800) switches to
#: iterative solvers that are several times slower at these sizes.
_CHOLESKY_MAX = 5000
#: Kernel entries per block of candidates in the fast exact posterior (a block is this many
#: entries over the number of training points, at least 256 rows): about 16 MB of float64, so
#: the block's temporaries stay in cache; 8,192 rows at 655 training points took 1.6x longer.
_PREDICT_ENTRIES = 2**21
#: Candidates per posterior evaluation on GPyTorch's general path.
_GPYTORCH_CHUNK = 512
#: Training points whose factor gives :meth:`FittedGP.top_encoded` its cheap variance bound.
SCREEN_BLOCK = 256


class FittedGP(BasePredictor):
    """The posterior and the learned cost-model mean of a fitted GP (module doc).

    A subclass fits ``model`` and sets ``cost_model``, ``features``, ``_n_terms`` and
    ``_factor`` (None), and extends the encoding (:meth:`_encode`) with its derived inputs.
    """

    cost_model: Any
    features: Any
    _n_terms: int
    _factor: tuple | None

    def term_names(self) -> list[str]:
        """Names of the cost model's terms: its ``term_names`` attribute (a tuple of str, e.g.
        :func:`cubicml_lab.workloads.gpt.cost_terms`'s), else ``"term 0"``, ``"term 1"``, ...

        Raises:
            PredictorError: Without a cost model, before :meth:`fit`, or when ``term_names``
                does not name every term.
        """
        self._require_cost_model("term_names")
        return names_of(self.cost_model, "term_names", "term", self._n_terms)

    def cost_shares(self, configs: Sequence[dict]) -> pd.DataFrame:
        """Share of each cost term in the fitted prior mean's cost, per configuration.

        The cost-model mean is ``b + c * log(sum_i w_i t_i)`` (module doc) with fitted weights
        ``w_i`` (up to a common factor). The share of term ``i`` in a configuration is
        ``w_i t_i / sum_j w_j t_j``: where the cost model says a step's time goes (a term that
        is 0 for a configuration has share 0). The kernel also sees the log cost terms and may
        take up part of what they explain, so read the shares as the mean's view.

        Args:
            configs: n configurations of the space.

        Returns:
            DataFrame of shape (n, k), one column per term (:meth:`term_names`), rows summing
            to 1, in the order of ``configs``.

        Raises:
            PredictorError: Without a cost model, before :meth:`fit`, or on configurations
                outside the space or that the cost model rejects.

        Example:
            >>> from cubicml_lab.space import Space, PowerOfTwo
            >>> from cubicml_lab.surrogate import GPPredictor
            >>> space = Space([PowerOfTwo("micro_batch", 1, 64)])
            >>> def terms(cfg): return [1.0, 16.0 / cfg["micro_batch"]]
            >>> cfgs = space.enumerate()
            >>> pred = GPPredictor(space, cost_model=terms).fit(
            ...     cfgs, [1e4 / sum(terms(c)) for c in cfgs])
            >>> shares = pred.cost_shares([{"micro_batch": 1}, {"micro_batch": 64}])
            >>> [round(float(s), 1) for s in shares["term 1"]]
            [0.9, 0.2]
        """
        import pandas as pd
        import torch

        self._require_cost_model("cost_shares")
        configs = list(configs)
        BasePredictor._encode(self, configs, "configs")  # the space's checks
        logs = self._logs("cost_model", self.cost_model, configs, "configs", self._n_terms)
        mean = self.model.mean_module
        with torch.no_grad():
            shares = torch.softmax(mean.a[mean.src] - mean.shift + logs, dim=1).numpy()
        return pd.DataFrame(shares, columns=self.term_names())

    def cost_calibration(self) -> tuple[np.ndarray, float]:
        """What the cost-model mean learned, as ``(weights, slope)``.

        The mean is ``b + c * log(sum_i w_i t_i)`` (module doc of
        :mod:`~cubicml_lab.surrogate.gp`): ``weights`` are the ``w_i``, one per term (a term
        the fit never saw takes its anchor's weight), up to a common factor that ``b``
        absorbs; ``slope`` is ``c`` in log units of the objective as the GP models it (-1: the
        modelled quantity goes as one over the weighted total, as a speed over seconds).

        Raises:
            PredictorError: Without a cost model, or before :meth:`fit`.
        """
        import torch

        self._require_cost_model("cost_calibration")
        mean = self.model.mean_module
        with torch.no_grad():
            logw = (mean.a[mean.src] - mean.shift).numpy().astype(np.float64)
            slope = float(mean.c.reshape(())) * float(mean.scale) * float(
                self.model.outcome_transform.stdvs.reshape(()))
        return np.exp(logw - np.max(logw[np.isfinite(logw)], initial=0.0)), slope

    def at_training(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(targets, mean, leave-one-out)`` at the training rows, in model units (the log of
        the objective by default) and in the order the fit was given them: what the GP was
        fitted to, its mean function alone (no kernel correction: with a cost model, the
        calibrated cost model), and each row's leave-one-out posterior mean with the fitted
        hyperparameters (closed form, ``y_i - [K^-1 r]_i / [K^-1]_ii`` of the standardised
        residuals ``r``: as honest about each row as a refit without it, but for the
        hyperparameters, which saw every row).

        Raises:
            PredictorError: Before :meth:`fit`.
        """
        import torch

        self._check_fitted()
        m = self.model
        _, L, alpha = self._train_factor()
        with torch.no_grad():
            tf = m.outcome_transform
            scale, shift = tf.stdvs.reshape(()), tf.means.reshape(())
            y = m.train_targets
            mean = m.mean_module(m.train_inputs[0])
            loo = y - alpha.squeeze(-1) / torch.cholesky_inverse(L).diagonal()
        return tuple((v * scale + shift).numpy().astype(np.float64).reshape(-1)
                     for v in (y, mean, loo))  # type: ignore[return-value]

    def importance(self) -> pd.Series:
        """How much each kernel input matters to the GP's kernel: ``1 / lengthscale``.

        Each input is scaled to [0, 1] over the space's range (derived inputs over the fit's
        range) before the kernel sees it, so relevances compare across inputs: the kernel
        forgets a configuration's neighbour at a distance of about one lengthscale. A
        ``Choice`` knob's one-hot columns are summarised by the largest relevance among them.
        With ``features`` or a ``cost_model`` their log inputs follow as ``"feature <name>"``
        and ``"cost <name>"``. This is the kernel's view only: what the cost-model mean
        explains does not show here. For the whole model's view, per knob, use
        :func:`~cubicml_lab.surrogate.knob_importance`, which also works for an MLP.

        Returns:
            Series named ``"relevance"`` (1 / lengthscale), indexed by knob (then derived
            input), sorted descending.

        Raises:
            PredictorError: Before :meth:`fit`, or with ``categorical="mixed"`` (its kernel has
                no single lengthscale per knob).
        """
        import pandas as pd

        self._check_fitted()
        if self.categorical == "mixed":
            raise PredictorError("importance() needs categorical='onehot': the mixed kernel has "
                                 "no single lengthscale per knob",
                                 hint="use cubicml_lab.surrogate.knob_importance(pred, configs)")
        kernel = self.model.covar_module
        while getattr(kernel, "base_kernel", None) is not None:  # a ScaleKernel around it
            kernel = kernel.base_kernel
        relevance = 1.0 / kernel.lengthscale.detach().reshape(-1).numpy()
        owners = [p.name for p in self.space.parameters for _ in p.encoded_names()]
        if self.features is not None:
            owners += [f"feature {n}" for n in names_of(self.features, "feature_names", "",
                                                     self._n_feats)]
        if self.cost_model is not None:
            owners += [f"cost {n}" for n in self.term_names()]
        out = pd.Series(relevance, index=owners).groupby(level=0, sort=False).max()
        return out.sort_values(ascending=False, kind="stable").rename("relevance")

    def _require_cost_model(self, what: str) -> None:
        if self.cost_model is None:
            raise PredictorError(f"{what}() needs a cost model, and this GPPredictor has none",
                                 hint="fit GPPredictor(space, cost_model=...), e.g. "
                                      "cost_model=cml.datasets.load(name).cost_model")
        if self.model is None:
            raise PredictorError(f"{what}() called before fit",
                                 hint="call pred.fit(configs, values) first")

    def covariate_slope(self, covariate: Sequence[float], current: float,
                        prior: tuple[float, float]) -> float:
        """The slope of the fitted targets on a per-trial covariate that is not a knob (e.g.
        how slow the machine was during each trial), estimated under the fit.

        The fit's targets (model units: the log of the objective with ``log_objective``) are
        taken to contain ``current * covariate``. The estimate is the slope ``s`` for which
        ``targets + (s - current) * covariate`` is likeliest under the fitted GP (its mean,
        kernel and noise: generalised least squares, the residuals' correlations counted), with
        a normal prior ``(mean, sd)`` on ``s``; refitting at ``s`` and asking again converges in
        a round or two.

        Args:
            covariate: One value per trial of the fit, in the model units of the targets.
            current: The slope the fitted targets carry.
            prior: Mean and standard deviation of the slope's normal prior.

        Raises:
            PredictorError: Before :meth:`fit`, or a covariate of the wrong length or not finite.
        """
        import torch

        self._check_fitted()
        c = _as_float_array("covariate", covariate, self.n_train)
        if not np.all(np.isfinite(c)):
            raise PredictorError("covariate has a NaN or inf entry",
                                 hint="pass one finite number per trial of the fit")
        _, L, alpha = self._train_factor()  # alpha: (K + noise)^-1 times the residuals
        with torch.no_grad():
            cs = torch.as_tensor(c, dtype=torch.float64).unsqueeze(-1) \
                / self.model.outcome_transform.stdvs.reshape(())
            mean, sd = prior
            num = -float((cs * alpha).sum()) + (mean - current) / sd**2
            den = float((cs * torch.cholesky_solve(cs, L)).sum()) + 1.0 / sd**2
        return float(current + num / den)

    def botorch_model(self) -> Any:
        """The fitted model for BoTorch's Monte-Carlo acquisitions: for a ``SingleTaskGP``
        (``MixedSingleTaskGP`` included) a
        :class:`~cubicml_lab.surrogate.posterior.FactorPosteriorModel`, which answers the
        same latent posterior from the cached Cholesky factor, solving each distinct input
        row once (a batch of candidates that share ``X_baseline`` rows, as noisy EI's, is
        many times faster than through GPyTorch); other models as they are (``model``).

        Raises:
            PredictorError: Before :meth:`fit`.
        """
        from botorch.models import SingleTaskGP

        self._check_fitted()
        if not isinstance(self.model, SingleTaskGP):
            return self.model
        from .posterior import FactorPosteriorModel

        return FactorPosteriorModel(self.model, self._train_factor())

    def _train_factor(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(train inputs, Cholesky factor of K + noise, (K + noise)^-1 residuals)`` of the
        fitted model in its standardised units, computed once per fit."""
        import torch

        m = self.model
        if self._factor is None or self._factor[0] is not m:
            with torch.no_grad():
                Xt = m.train_inputs[0]
                K = m.covar_module(Xt).to_dense()
                noise = m.likelihood.noise.reshape(-1).expand(Xt.shape[0])
                L = torch.linalg.cholesky(K + torch.diag(noise))
                resid = (m.train_targets - m.mean_module(Xt)).unsqueeze(-1)
                self._factor = (m, Xt, L, torch.cholesky_solve(resid, L), None)
        return self._factor[1:4]

    def top_encoded(self, X: torch.Tensor, score: Any, keep: int,
                    weight: Any = None) -> tuple[Any, Any]:
        """The ``keep`` rows of ``X`` of highest ``score(mean, variance)`` (plus ``weight``), as
        ranking every row by :meth:`posterior_encoded` would, for a ``score`` that never falls
        as the variance grows (expected improvement, an upper confidence bound).

        For a ``SingleTaskGP`` with more than ``SCREEN_BLOCK`` training points the exact
        variance is not computed for every row. Conditioning on fewer observations never
        lowers a Gaussian process's variance, so the variance given a block of the training
        points (the ``SCREEN_BLOCK`` of highest target, where an improvement is likely, half of
        them spread over the rest) bounds each row's score from above at the cost of that
        block's small factor. Rows are then scored exactly in the order of their bound
        (``2 * keep`` first, then at most twice as many as so far) until every row whose bound
        reaches the ``keep``-th best exact score is scored: no row left unscored can enter the
        top, so the result is exact, not an approximation. The mean is
        always exact (one product with the cached ``alpha``).

        Args:
            X: Encoded rows, shape (n, d), as :meth:`encode` returns.
            score: ``score(mean, variance)`` of float64 tensors in model units, a tensor; NaN
                counts as the worst.
            keep: How many rows to return.
            weight: ``weight(indices)``: a tensor of at most 0 per row of ``X`` asked for
                (a log probability), added to the score; asked only for rows scored exactly
                whose score reaches the ``keep``-th best so far (a costly model, e.g. the
                probability of fitting in memory: a row below stays out whatever its weight).

        Returns:
            ``(indices, scores)``: the kept rows' indices in ``X``'s order and their scores.
        """
        import torch
        from botorch.models import SingleTaskGP

        self._check_fitted()
        X = X.to(torch.float64)
        keep = min(keep, len(X))

        def exact(rows: torch.Tensor, kth: Any) -> torch.Tensor:
            """Exact scores of ``rows``; weighed only where the score reaches ``kth``: a row
            below the keep-th best so far stays out whatever its weight (at most 0)."""
            Xr = X[rows]
            if isinstance(self.model, SingleTaskGP):
                mu, var = self._fast_posterior(Xr)
            else:
                mu, var = (torch.as_tensor(a) for a in self.posterior_encoded(Xr))
            s = torch.nan_to_num(score(mu, var), nan=-torch.inf)
            if weight is not None:
                reach = s >= kth
                s[~reach] = -torch.inf
                if bool(reach.any()):
                    s[reach] += torch.as_tensor(weight(rows[reach]), dtype=s.dtype)
            return s

        n_train = len(self.model.train_targets) if isinstance(self.model, SingleTaskGP) else 0
        if n_train <= SCREEN_BLOCK or len(X) <= 2 * keep:
            s = exact(torch.arange(len(X)), -torch.inf)
            self.last_top_scored = len(X)
            top = torch.topk(s, keep).indices.sort().values
            return top, s[top]
        bound = torch.nan_to_num(score(*self._fast_posterior(X, bound_only=True)),
                                 nan=-torch.inf)
        order = torch.argsort(bound, descending=True)
        s = torch.full_like(bound, -torch.inf)
        done, upto, kth = 0, 2 * keep, -torch.inf
        while upto > done:
            s[order[done:upto]] = exact(order[done:upto], kth)
            done = upto
            kth = float(torch.topk(s[order[:done]], keep).values[-1])
            # the rows whose bound reaches the keep-th best so far, a prefix of ``order``
            upto = min(int((bound >= kth).sum()), 2 * done)
        self.last_top_scored = done  # how many rows were scored exactly (tests, benchmarks)
        top = torch.topk(s, keep).indices.sort().values
        return top, s[top]

    def _screen_block(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(indices, Cholesky factor)`` of the training block that bounds the variance in
        :meth:`top_encoded`: half the ``SCREEN_BLOCK`` of highest target, half spread evenly
        over the others; once per fit."""
        import torch

        _, L, _ = self._train_factor()
        if self._factor[4] is None:  # type: ignore[index]
            y = self.model.train_targets
            by_y = torch.argsort(y, descending=True)
            best = by_y[:SCREEN_BLOCK // 2]
            rest = by_y[SCREEN_BLOCK // 2:]
            spread = rest[torch.linspace(0, len(rest) - 1, SCREEN_BLOCK - len(best)).long()]
            block = torch.cat([best, spread]).sort().values
            rows = L[block]  # (K + noise)[block, block] = L[block] L[block]^T
            self._factor = (*self._factor[:4], (block, torch.linalg.cholesky(rows @ rows.T)))
        return self._factor[4]  # type: ignore[index]

    def _posterior(self, configs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the latent function in model units, shape (n,) each."""
        self._check_fitted()
        return self.posterior_encoded(self._encode(configs, "configs"))

    def posterior_encoded(self, X: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the latent function at rows encoded by :meth:`encode`.

        For a ``SingleTaskGP`` (``MixedSingleTaskGP`` and a cost-model mean included) the exact
        predictive mean and variance are computed here from one Cholesky factor of the training
        kernel matrix (``mu = m(x*) + k*^T alpha``, ``var = k** - |L^-1 k*|^2``), cached per
        fitted model: GPyTorch's general posterior builds a lazy joint covariance per chunk and
        was 3-30x slower for tens of thousands of candidates. Other models go through
        ``model.posterior``. Both agree to rounding (``tests/test_surrogate.py``). Searchers and
        :class:`~cubicml_lab.surrogate.feasibility.FeasibilityModel` score their pools here.

        Args:
            X: Encoded rows, shape (n, d), as :meth:`encode` returns.

        Returns:
            ``(mean, variance)``, float64 arrays of shape (n,), in model units (the log of the
            objective by default); the variance is the latent function's, without the noise.

        Raises:
            PredictorError: Before :meth:`fit`.
        """
        import gpytorch
        import torch
        from botorch.models import SingleTaskGP

        self._check_fitted()
        X = X.to(torch.float64)
        if isinstance(self.model, SingleTaskGP):  # MixedSingleTaskGP included
            mu, var = self._fast_posterior(X)
            return mu.numpy(), var.numpy()
        mus, variances = [], []
        with torch.no_grad(), gpytorch.settings.max_cholesky_size(_CHOLESKY_MAX):
            for chunk in torch.split(X, _GPYTORCH_CHUNK):
                post = self.model.posterior(chunk)
                mus.append(post.mean.squeeze(-1))
                variances.append(post.variance.squeeze(-1).clamp_min(0.0))
        return (torch.cat(mus).numpy().astype(np.float64),
                torch.cat(variances).numpy().astype(np.float64))

    def _fast_posterior(self, X: torch.Tensor,
                        bound_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact mean and variance; with ``bound_only`` the exact mean and an upper bound of
        the variance, from the training block of :meth:`_screen_block` only."""
        import torch

        m = self.model
        Xt, L, alpha = self._train_factor()
        if bound_only:
            block, L = self._screen_block()
        with torch.no_grad():
            tf = m.outcome_transform
            scale, shift = tf.stdvs.reshape(()), tf.means.reshape(())
            mus, variances = [], []
            for chunk in torch.split(X, max(256, _PREDICT_ENTRIES // max(1, len(Xt)))):
                xt = m.input_transform(chunk) if hasattr(m, "input_transform") else chunk
                Ks = m.covar_module(xt, Xt).to_dense()
                v = torch.linalg.solve_triangular(L, (Ks[:, block] if bound_only else Ks).T,
                                                  upper=False)
                prior = m.covar_module(xt, diag=True)
                mus.append((m.mean_module(xt) + (Ks @ alpha).squeeze(-1)) * scale + shift)
                variances.append((prior - (v * v).sum(0)).clamp_min(0.0) * scale**2)
        return torch.cat(mus), torch.cat(variances)
