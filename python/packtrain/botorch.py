"""A fitted EnsembleRegressor as a BoTorch model (optional: needs botorch).

    from packtrain.botorch import EnsembleModel
    model = EnsembleModel(packtrain.EnsembleRegressor().fit(X, y))
    acq = qExpectedImprovement(model, best_f=y.max())
    candidates, value = optimize_acqf(acq, bounds, q=4, num_restarts=8, raw_samples=256)

posterior(X) is BoTorch's EnsemblePosterior over the members' predicted means (the
epistemic part: the members' disagreement), each member weighted equally; members
that diverged in training are left out, as in the ensemble's own predictions. The
posterior is differentiable in X (the C++ forward records autograd when X requires
grad), so optimize_acqf's gradient-based search runs unchanged.
"""
import torch
from botorch.models.ensemble import EnsembleModel as _BoTorchEnsembleModel


class EnsembleModel(_BoTorchEnsembleModel):
    """BoTorch's view of a fitted packtrain.EnsembleRegressor: one output, s = the
    members the ensemble predicts with."""

    def __init__(self, regressor):
        super().__init__()
        regressor._check_fitted()
        self.regressor = regressor
        self._num_outputs = 1

    def forward(self, X):
        """X (batch_shape x n x d) -> the members' means (batch_shape x s x n x 1)."""
        if X.shape[-1] != self.regressor.n_features_in_:
            raise ValueError(f"X has {X.shape[-1]} features, the ensemble was fitted with "
                             f"{self.regressor.n_features_in_}")
        batch, n = X.shape[:-2], X.shape[-2]
        flat = X.reshape(-1, X.shape[-1]).to("cpu", torch.float64)
        prediction = self.regressor._trainer.predict(flat)
        means = prediction["member_mean"][prediction["included"]]  # (s, batch * n)
        means = means.reshape(len(prediction["included"]), *batch, n).movedim(0, -2)  # batch x s x n
        return means.unsqueeze(-1).to(X)
