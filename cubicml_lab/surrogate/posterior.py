"""A fitted GP's joint posterior for BoTorch's Monte-Carlo acquisitions, from one cached factor.

BoTorch's ``qLogNoisyExpectedImprovement`` scores each candidate ``x`` by sampling the joint
posterior of ``[X_baseline, x]``: a batch of ``b`` candidates asks the model for ``b`` joint
posteriors of ``nb + q`` rows each. GPyTorch's exact prediction computes ``k*^T K^-1 k*`` for
every row of every batch, ``b (nb + q) n^2`` flops for ``n`` training points, so the
``nb`` baseline rows, the same in every batch, are solved against the training factor ``b``
times over (about 9 s for 2,048 candidates at ``n`` = 656 on 2 cores).
:class:`FactorPosteriorModel` answers the same posterior (same mean and covariance, to
rounding; ``tests/test_surrogate.py``) from the fitted model's cached Cholesky factor ``L``
(:meth:`~cubicml_lab.surrogate.fitted.FittedGP.botorch_model`): it solves ``v = L^-1 k*`` once
per *distinct* input row, and each batch's covariance is ``K(X_i, X_i) - V_i V_i^T`` of its
rows' ``v``. This module imports BoTorch; it is imported only when an acquisition needs it.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.models.gpytorch import GPyTorchModel
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from linear_operator import to_linear_operator

__all__ = ["FactorPosteriorModel"]


class FactorPosteriorModel(GPyTorchModel):
    """The exact latent posterior of a fitted single-output ``SingleTaskGP`` (module doc).

    Args:
        model: The fitted BoTorch ``SingleTaskGP`` (eval mode; its ``input_transform``,
            ``covar_module``, ``mean_module`` and ``Standardize`` outcome transform are read).
        factor: ``(train inputs (n, d) as the kernel sees them, Cholesky factor (n, n) of the
            training kernel matrix plus noise, (K + noise)^-1 residuals (n, 1))``, in
            standardised units (``FittedGP._train_factor``).

    Only ``observation_noise=False`` (the latent function) is answered: what BoTorch's
    MC acquisitions ask for.
    """

    _num_outputs = 1

    def __init__(self, model: Any, factor: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                 ) -> None:
        super().__init__()
        self._gp = [model]  # a list: not registered as a submodule (no parameters of our own)
        self._Xt, self._L, self._alpha = factor

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    def posterior(self, X: torch.Tensor, output_indices: Any = None,
                  observation_noise: bool | torch.Tensor = False,
                  posterior_transform: Any = None, **kwargs: Any) -> GPyTorchPosterior:
        """The joint posterior of each batch of ``X`` (``(*batch, q, d)``, model inputs as
        ``GPPredictor.encode`` makes them): a ``GPyTorchPosterior`` of a ``(*batch)``-batched
        ``q``-dimensional normal, in the objective's model units."""
        if observation_noise is not False:
            raise NotImplementedError("FactorPosteriorModel answers the latent posterior only")
        m = self._gp[0]
        with torch.no_grad():
            *batch, q, d = X.shape
            rows, inverse = torch.unique(X.reshape(-1, d).to(self._L.dtype), dim=0,
                                         return_inverse=True)
            xt = m.input_transform(rows) if hasattr(m, "input_transform") else rows
            Ks = m.covar_module(xt, self._Xt).to_dense()  # (u, n)
            V = torch.linalg.solve_triangular(self._L, Ks.T, upper=False).T  # (u, n)
            mean = m.mean_module(xt) + (Ks @ self._alpha).squeeze(-1)
            idx = inverse.reshape(*batch, q)
            xb, Vb = xt[idx], V[idx]  # (*batch, q, d), (*batch, q, n)
            cov = m.covar_module(xb, xb).to_dense() - Vb @ Vb.transpose(-1, -2)
            tf = m.outcome_transform
            scale, shift = tf.stdvs.reshape(()), tf.means.reshape(())
            # a linear operator, factored only when sampled (with GPyTorch's jitter retries):
            # a candidate next to a baseline row has a near-singular joint covariance
            mvn = MultivariateNormal(mean[idx] * scale + shift,
                                     to_linear_operator(cov * scale**2))
        post = GPyTorchPosterior(mvn)
        return post if posterior_transform is None else posterior_transform(post)
