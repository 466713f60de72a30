"""The drop-in adapters against the real libraries from PyPI: BoTorch runs
qExpectedImprovement and optimize_acqf unchanged on an ensemble posterior, and baal's
BALD heuristic ranks a pool from the classifier's member probabilities."""
import numpy as np
import pytest
import torch

import packtrain


def branin_like(x):
    """A smooth 2-D toy function to maximize on [0, 1]^2 (maximum 0 at (0.7, 0.2))."""
    return -((x[..., 0] - 0.7) ** 2 + 2 * (x[..., 1] - 0.2) ** 2)


def test_botorch_bayesian_optimization_runs_unchanged():
    pytest.importorskip("botorch")
    from botorch.acquisition import qExpectedImprovement
    from botorch.optim import optimize_acqf
    from botorch.posteriors.ensemble import EnsemblePosterior

    from packtrain.botorch import EnsembleModel

    torch.manual_seed(0)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    x = torch.rand(24, 2, dtype=torch.float64)
    y = branin_like(x)
    start_best = y.max().item()
    for iteration in range(3):
        regressor = packtrain.EnsembleRegressor(members=8, epochs=150, hidden=32, batch_size=8, val_fraction=0,
                                                seed=iteration).fit(x, y)
        model = EnsembleModel(regressor)
        posterior = model.posterior(x[:5])
        assert isinstance(posterior, EnsemblePosterior) and posterior.mean.shape == (5, 1)
        # the posterior's mean is the ensemble's mean of member means
        np.testing.assert_allclose(posterior.mean.squeeze(-1).detach().numpy(),
                                   regressor.predict_members(x[:5])[0].mean(0).numpy(), rtol=1e-10)
        acq = qExpectedImprovement(model, best_f=y.max())
        candidates, value = optimize_acqf(acq, bounds=bounds, q=2, num_restarts=4, raw_samples=64)
        assert candidates.shape == (2, 2) and torch.isfinite(value)
        assert ((candidates >= 0) & (candidates <= 1)).all()
        x = torch.cat([x, candidates.detach()])
        y = torch.cat([y, branin_like(candidates.detach())])
    assert y.max().item() >= start_best


def test_posterior_gradients_reach_x():
    pytest.importorskip("botorch")
    from packtrain.botorch import EnsembleModel

    x = torch.rand(30, 2, dtype=torch.float64)
    model = EnsembleModel(packtrain.EnsembleRegressor(members=4, epochs=30, hidden=16, batch_size=8).fit(x, branin_like(x)))
    probe = torch.rand(3, 4, 2, dtype=torch.float64, requires_grad=True)  # batch 3, q 4
    mean = model.posterior(probe).mean
    assert mean.shape == (3, 4, 1)
    mean.sum().backward()
    assert probe.grad is not None and probe.grad.abs().sum() > 0


def numpy_bald(probs):
    """Mutual information between label and member: H[mean_k p] - mean_k H[p_k]; probs (N, C, K)."""
    eps = 1e-12
    mean = probs.mean(axis=2)
    total = -(mean * np.log(mean + eps)).sum(axis=1)
    expected = -(probs * np.log(probs + eps)).sum(axis=1).mean(axis=1)
    return total - expected


def test_baal_bald_ranks_the_pool_as_a_numpy_bald():
    pytest.importorskip("baal")
    from baal.active.heuristics import BALD

    rng = np.random.default_rng(1)
    centers = np.array([[0, 0], [3, 0], [0, 3]], dtype=float)
    labels = rng.integers(0, 3, size=240)
    x = centers[labels] + rng.normal(scale=1.2, size=(240, 2))
    model = packtrain.EnsembleClassifier(members=6, epochs=40, hidden=16).fit(x[:120], labels[:120])
    pool = model.predict_member_proba(x[120:])  # (N, C, K): baal's layout
    ours = numpy_bald(pool)
    theirs = BALD().get_uncertainties(pool)
    assert ours.std() > 0  # the members disagree somewhere: a ranking to compare
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-7)
    assert list(BALD()(pool)[:20]) == list(np.argsort(-ours, kind="stable")[:20])
