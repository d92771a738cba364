"""The CubicML paper's kind of predictor: a small MLP regressor, here an ensemble for uncertainty.

:class:`MLPPredictor` fits ``members`` multilayer perceptrons (two hidden layers of ``width``
SiLU units) to the standardised log objective from the configurations' encoding
(:meth:`Space.encode <cubicml_lab.space.Space.encode>`, scaled to [0, 1] by the space's bounds),
each from its own random initialisation and on its own bootstrap resample of the trials (full
batch Adam, weight decay, fixed number of epochs). The ensemble's mean is ``mu``; the spread of
the members is the model uncertainty ``s^2``; the observation noise of a new measurement is the
variance of the out-of-bag residuals (each trial predicted by the members that did not see it),
so intervals are not fooled by members that memorised their training data. Predictions come back
in the objective's units exactly as :class:`~cubicml_lab.surrogate.GPPredictor`'s do (median of
the log-normal by default), so the two compare one for one in
:func:`~cubicml_lab.surrogate.evaluate_predictor`.

Example:
    >>> from cubicml_lab.space import Space, PowerOfTwo
    >>> space = Space([PowerOfTwo("micro_batch", 1, 64)])
    >>> configs = space.enumerate()
    >>> pred = MLPPredictor(space).fit(configs, [100.0 * c["micro_batch"] ** 0.5 for c in configs])
    >>> mean, std = pred.predict([{"micro_batch": 16}])
    >>> bool(300 < mean[0] < 500)
    True
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import PredictorError
from .base import BasePredictor, _as_float_array, one_thread

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["MLPPredictor"]


class MLPPredictor(BasePredictor):
    """An ensemble of small MLPs predicting an objective from a configuration.

    Args:
        space: The configurations' space.
        objective: Name of the predicted metric.
        log_objective: Model ``log(y)`` (default) instead of ``y``.
        seed: Seed of the initialisations and resamples (fits are deterministic).
        members: Ensemble size.
        width: Units per hidden layer.
        epochs: Full-batch Adam steps per member.
        lr: Adam learning rate.
        weight_decay: Adam's L2 penalty.
    """

    def __init__(self, space: Space, objective: str = "throughput", *, log_objective: bool = True,
                 seed: int = 0, members: int = 5, width: int = 64, epochs: int = 400,
                 lr: float = 3e-3, weight_decay: float = 1e-4) -> None:
        super().__init__(space, objective, log_objective=log_objective, seed=seed)
        for name, value in (("members", members), ("width", width), ("epochs", epochs)):
            if not isinstance(value, int) or value < 1:
                raise PredictorError(f"MLPPredictor {name} = {value!r} must be an int >= 1",
                                     hint="e.g. members=5, width=64, epochs=400")
        self.members, self.width, self.epochs = members, width, epochs
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self._y_mean = 0.0
        self._y_std = 1.0

    def __repr__(self) -> str:
        state = f"n_train={self.n_train}" if self.model is not None else "not fitted"
        return f"MLPPredictor(objective={self.objective!r}, members={self.members}, {state})"

    def _inputs(self, configs: Sequence[dict], what: str):
        import torch

        X = self._encode(configs, what).to(torch.float32)
        lo, hi = (torch.as_tensor(b, dtype=torch.float32) for b in self.space.encoded_bounds())
        return (X - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(hi))

    def fit(self, configs: Sequence[dict], values: Sequence[float],
            noise: Sequence[float] | None = None) -> MLPPredictor:
        """Fit the ensemble; ``noise`` is accepted for a common signature and not used.

        Raises:
            PredictorError: Fewer than 2 trials, lengths that do not match, NaN/inf values,
                values <= 0 with ``log_objective``, or a configuration outside the space.
        """
        import torch
        from torch import nn

        t0 = time.perf_counter()
        configs = list(configs)
        y = _as_float_array("values", values, len(configs))
        if len(configs) < 2:
            raise PredictorError(f"need at least 2 trials to fit an MLP, got {len(configs)}",
                                 hint="measure more configurations first")
        X = self._inputs(configs, "configs")
        y_model = self._to_model_units(y)
        self._y_mean, self._y_std = float(y_model.mean()), float(y_model.std()) or 1.0
        Y = torch.as_tensor((y_model - self._y_mean) / self._y_std, dtype=torch.float32)
        n, d = X.shape
        gen = torch.Generator().manual_seed(self.seed)
        nets, oob_sum, oob_count = [], np.zeros(n), np.zeros(n)
        with torch.random.fork_rng(devices=[]), one_thread():
            torch.manual_seed(self.seed)
            for _ in range(self.members):
                net = nn.Sequential(nn.Linear(d, self.width), nn.SiLU(),
                                    nn.Linear(self.width, self.width), nn.SiLU(),
                                    nn.Linear(self.width, 1))
                idx = torch.randint(0, n, (n,), generator=gen)
                opt = torch.optim.Adam(net.parameters(), lr=self.lr,
                                       weight_decay=self.weight_decay)
                for _ in range(self.epochs):
                    opt.zero_grad(set_to_none=True)
                    loss = ((net(X[idx]).squeeze(-1) - Y[idx]) ** 2).mean()
                    loss.backward()
                    opt.step()
                net.eval()
                out = np.ones(n, dtype=bool)
                out[idx.numpy()] = False
                if out.any():
                    with torch.no_grad():
                        oob_sum[out] += net(X[out]).squeeze(-1).numpy()
                    oob_count[out] += 1
                nets.append(net)
        seen = oob_count > 0
        resid = (oob_sum[seen] / oob_count[seen]) - Y.numpy()[seen]
        noise_std = float(np.sqrt(np.mean(resid**2))) if seen.sum() >= 2 else 0.0
        self._new_noise_var = (noise_std * self._y_std) ** 2
        self.model = nets
        self.n_train = n
        self.fit_seconds = time.perf_counter() - t0
        return self

    def _posterior(self, configs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        import torch

        self._check_fitted()
        X = self._inputs(configs, "configs")
        with torch.no_grad():
            preds = np.stack([net(X).squeeze(-1).numpy().astype(np.float64)
                              for net in self.model])
        mu = preds.mean(axis=0) * self._y_std + self._y_mean
        var = preds.var(axis=0) * self._y_std**2
        return mu, var
