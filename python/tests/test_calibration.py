"""packtrain's uncertainty, calibration and acquisition math (runtime/trainers/
predictive_distribution, calibration, acquisition) against independent reference
implementations installed from PyPI, on random inputs: torch.distributions
(mixture density, CDF, variance), properscoring (CRPS), uncertainty-toolbox
(miscalibration area), scikit-learn (RMSE, log loss, Brier score, accuracy),
torchmetrics (expected calibration error), baal (BALD, entropy, margin) and scipy
(mixture quantiles by root finding, normal intervals)."""
import numpy as np
import pytest
import torch

from packtrain import _core

properscoring = pytest.importorskip("properscoring")
uct = pytest.importorskip("uncertainty_toolbox")
scipy_stats = pytest.importorskip("scipy.stats")
scipy_optimize = pytest.importorskip("scipy.optimize")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
torchmetrics_classification = pytest.importorskip("torchmetrics.functional.classification")
baal_heuristics = pytest.importorskip("baal.active.heuristics")


def regression_case(K=5, N=300, seed=0):
    g = np.random.default_rng(seed)
    mean = g.normal(0, 1, (K, N))
    var = g.uniform(0.05, 2.0, (K, N))
    y = g.normal(0, 1.5, N)
    prediction = {"member_mean": torch.from_numpy(mean), "member_variance": torch.from_numpy(var)}
    return prediction, mean, var, y


def torch_mixture(mean, var):
    K, N = mean.shape
    d = torch.distributions
    return d.MixtureSameFamily(d.Categorical(torch.full((N, K), 1.0 / K, dtype=torch.float64)),
                               d.Normal(torch.from_numpy(mean.T.copy()), torch.from_numpy(np.sqrt(var).T.copy())))


class ScipyMixture:
    """One row's uniform Gaussian mixture, with the .cdf properscoring integrates."""

    def __init__(self, means, sds):
        self.means, self.sds = means, sds

    def cdf(self, x):
        return np.mean(scipy_stats.norm.cdf((np.asarray(x)[..., None] - self.means) / self.sds), axis=-1)


def test_decomposition_density_and_cdf_match_torch_distributions():
    prediction, mean, var, y = regression_case()
    mix = torch_mixture(mean, var)
    d = _core.decompose(prediction)
    np.testing.assert_allclose(d["mean"].numpy(), mix.mean.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d["total_std"].numpy() ** 2, mix.variance.numpy(), rtol=1e-10)
    np.testing.assert_allclose(d["aleatoric_std"].numpy() ** 2, var.mean(0), rtol=1e-12)
    np.testing.assert_allclose(d["epistemic_std"].numpy(), mean.std(0), rtol=1e-10)
    yt = torch.from_numpy(y)
    np.testing.assert_allclose(_core.mixture_log_density(prediction, yt).numpy(), mix.log_prob(yt).numpy(),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_core.mixture_cdf(prediction, yt).numpy(), mix.cdf(yt).numpy(), atol=1e-12)


def test_variance_scale_minimizes_uncertainty_toolbox_gaussian_nll():
    """The recalibration scale (runtime/trainers/variance_calibration) is the factor on
    the moment-matched variance that minimizes the Gaussian NLL — here uncertainty-
    toolbox's nll_gaussian minimized by scipy over the std's factor — and applying it
    stretches the mixture about its mean (torch.distributions' CDF moves with it)."""
    prediction, mean, var, y = regression_case()
    m, v = mean.mean(0), var.mean(0) + mean.var(0)
    ref = scipy_optimize.minimize_scalar(
        lambda r: uct.metrics_scoring_rule.nll_gaussian(m, r * np.sqrt(v), y), bounds=(1e-2, 1e2), method="bounded",
        options={"xatol": 1e-10})
    s = _core.fit_variance_scale(prediction, torch.from_numpy(y))
    assert s == pytest.approx(ref.x ** 2, rel=1e-6)
    scaled = _core.scale_variance(prediction, s)
    np.testing.assert_allclose(scaled["mean"].numpy(), m, rtol=1e-12)
    np.testing.assert_allclose(scaled["variance"].numpy(), s * v, rtol=1e-10)
    moved = m + np.sqrt(s) * (y - m)
    np.testing.assert_allclose(_core.mixture_cdf(scaled, torch.from_numpy(moved)).numpy(),
                               torch_mixture(mean, var).cdf(torch.from_numpy(y)).numpy(), atol=1e-12)
    assert uct.metrics_scoring_rule.nll_gaussian(m, np.sqrt(s * v), y) < uct.metrics_scoring_rule.nll_gaussian(
        m, np.sqrt(v), y)


def test_quantiles_and_intervals_match_scipy_root_finding():
    prediction, mean, var, _ = regression_case(K=4, N=40, seed=1)
    probabilities = [0.025, 0.25, 0.5, 0.9, 0.975]
    q = _core.mixture_quantiles(prediction, probabilities).numpy()
    sds = np.sqrt(var)
    for n in range(mean.shape[1]):
        m = ScipyMixture(mean[:, n], sds[:, n])
        for j, p in enumerate(probabilities):
            expected = scipy_optimize.brentq(lambda x: m.cdf(x) - p, -50, 50, xtol=1e-13)
            assert q[n, j] == pytest.approx(expected, abs=1e-9)
    # One member: the Gaussian's own interval.
    one = {"member_mean": torch.from_numpy(mean[:1]), "member_variance": torch.from_numpy(var[:1])}
    (level, lower, upper), = _core.central_intervals(one, [0.9])
    lo, hi = scipy_stats.norm.interval(0.9, loc=mean[0], scale=sds[0])
    np.testing.assert_allclose(lower.numpy(), lo, atol=1e-9)
    np.testing.assert_allclose(upper.numpy(), hi, atol=1e-9)


def test_crps_matches_properscoring():
    prediction, mean, var, y = regression_case(K=3, N=25, seed=2)
    crps = _core.mixture_crps(prediction, torch.from_numpy(y)).numpy()
    sds = np.sqrt(var)
    for n in range(len(y)):
        expected = properscoring.crps_quadrature(y[n], ScipyMixture(mean[:, n], sds[:, n]), xmin=-60, xmax=60)
        assert crps[n] == pytest.approx(float(expected), rel=1e-6, abs=1e-8)
    # One member: properscoring's closed form for a Gaussian.
    one = {"member_mean": torch.from_numpy(mean[:1]), "member_variance": torch.from_numpy(var[:1])}
    np.testing.assert_allclose(_core.mixture_crps(one, torch.from_numpy(y)).numpy(),
                               properscoring.crps_gaussian(y, mean[0], sds[0]), rtol=1e-10)
    # A mean head (point masses): properscoring's ensemble CRPS.
    points = {"member_mean": torch.from_numpy(mean)}
    np.testing.assert_allclose(_core.mixture_crps(points, torch.from_numpy(y)).numpy(),
                               properscoring.crps_ensemble(y, mean.T), rtol=1e-10)


def test_regression_scores_match_sklearn_torch_and_uncertainty_toolbox():
    prediction, mean, var, y = regression_case(N=500, seed=3)
    c = _core.regression_calibration(prediction, torch.from_numpy(y), [0.5, 0.9, 0.95], 100)
    mix = torch_mixture(mean, var)
    assert c["rmse"] == pytest.approx(sklearn_metrics.root_mean_squared_error(y, mean.mean(0)), rel=1e-12)
    assert c["mixture_nll"] == pytest.approx(-mix.log_prob(torch.from_numpy(y)).mean().item(), rel=1e-10)
    gaussian = torch.nn.functional.gaussian_nll_loss(mix.mean, torch.from_numpy(y), mix.variance, full=True,
                                                     eps=1e-300).item()
    assert c["gaussian_nll"] == pytest.approx(gaussian, rel=1e-10)
    sds = np.sqrt(var)
    for interval in c["intervals"]:  # coverage and width of the mixture's own interval, by root finding
        level = interval["level"]
        lows, highs = [], []
        for n in range(len(y)):
            m = ScipyMixture(mean[:, n], sds[:, n])
            lows.append(scipy_optimize.brentq(lambda x: m.cdf(x) - (1 - level) / 2, -60, 60, xtol=1e-12))
            highs.append(scipy_optimize.brentq(lambda x: m.cdf(x) - (1 + level) / 2, -60, 60, xtol=1e-12))
        lows, highs = np.array(lows), np.array(highs)
        assert interval["coverage"] == pytest.approx(np.mean((y >= lows) & (y <= highs)), abs=1e-12)
        assert interval["mean_width"] == pytest.approx(np.mean(highs - lows), rel=1e-8)
    # Miscalibration area: uncertainty-toolbox's own area routine on the observed
    # proportions of the mixture's intervals (PIT from torch's mixture CDF) ...
    pit = mix.cdf(torch.from_numpy(y)).numpy()
    expected = np.linspace(0, 1, 100)
    observed = np.array([np.mean(np.abs(pit - 0.5) <= p / 2) for p in expected])
    np.testing.assert_allclose(c["observed"], observed, atol=1e-12)
    assert c["miscalibration_area"] == pytest.approx(
        uct.metrics_calibration.miscalibration_area_from_proportions(expected, observed), rel=1e-10, abs=1e-12)
    # ... and, for one Gaussian member, uncertainty-toolbox's miscalibration_area itself.
    one = {"member_mean": torch.from_numpy(mean[:1]), "member_variance": torch.from_numpy(var[:1])}
    c1 = _core.regression_calibration(one, torch.from_numpy(y), [0.9], 100)
    assert c1["miscalibration_area"] == pytest.approx(
        uct.miscalibration_area(mean[0], sds[0], y, num_bins=100), rel=1e-10, abs=1e-12)
    assert "intervals cover" in c["summary"]


def classification_case(K=6, N=600, C=4, seed=4):
    g = np.random.default_rng(seed)
    members = g.dirichlet(np.full(C, 0.7), size=(K, N))  # (K, N, C)
    target = g.integers(0, C, N)
    # Make the labels agree with the mixture often enough for every bin to hold rows.
    mix = members.mean(0)
    target = np.where(g.random(N) < 0.5, mix.argmax(1), target)
    return members, target


def test_classification_scores_match_sklearn_and_torchmetrics():
    members, target = classification_case()
    probs = members.mean(0)
    C = probs.shape[1]
    c = _core.classification_calibration(torch.from_numpy(probs), torch.from_numpy(target), 15)
    assert c["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(target, probs.argmax(1)), abs=1e-15)
    assert c["nll"] == pytest.approx(sklearn_metrics.log_loss(target, probs, labels=list(range(C))), rel=1e-10)
    assert c["brier"] == pytest.approx(
        sklearn_metrics.brier_score_loss(target, probs, labels=list(range(C)), scale_by_half=False), rel=1e-10)
    ece = torchmetrics_classification.multiclass_calibration_error(
        torch.from_numpy(probs), torch.from_numpy(target), num_classes=C, n_bins=15, norm="l1").item()
    assert c["ece"] == pytest.approx(ece, rel=1e-6)  # torchmetrics bins in float32
    assert sum(b["count"] for b in c["bins"]) == len(target)
    assert len(c["bins"]) == 15
    assert "expected calibration error" in c["summary"]


def test_classification_uncertainty_and_scores_match_baal():
    members, _ = classification_case(N=200)
    prediction = {"member_probabilities": torch.from_numpy(members)}
    by_baal = members.transpose(1, 2, 0)  # (N, C, K): baal's layout
    d = _core.decompose(prediction)
    np.testing.assert_allclose(d["mutual_information"].numpy(), baal_heuristics.BALD().compute_score(by_baal),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d["entropy"].numpy(), scipy_stats.entropy(members.mean(0), axis=1), rtol=1e-10)
    np.testing.assert_allclose(d["entropy"].numpy(), baal_heuristics.Entropy().compute_score(by_baal),
                               rtol=1e-6, atol=1e-9)
    bald = _core.acquisition_scores(prediction, "bald").numpy()
    np.testing.assert_allclose(bald, d["mutual_information"].numpy())
    # Margin: baal's is the mixture's top-2 gap (lower: more uncertain); packtrain's 1 - gap.
    np.testing.assert_allclose(_core.acquisition_scores(prediction, "margin").numpy(),
                               1 - baal_heuristics.Margin().compute_score(by_baal), rtol=1e-12, atol=1e-12)
    # Variation ratio: 1 - the modal vote's share, counted here with numpy.
    votes = members.argmax(2)  # (K, N)
    modal = np.array([np.bincount(votes[:, n], minlength=members.shape[2]).max() for n in range(votes.shape[1])])
    np.testing.assert_allclose(_core.acquisition_scores(prediction, "variation-ratio").numpy(),
                               1 - modal / members.shape[0])


def test_regression_scores_and_batch_selection():
    prediction, mean, var, _ = regression_case(N=50)
    d = _core.decompose(prediction)
    np.testing.assert_allclose(_core.acquisition_scores(prediction, "epistemic").numpy(), d["epistemic_std"].numpy())
    np.testing.assert_allclose(_core.acquisition_scores(prediction, "variance").numpy(), d["total_std"].numpy() ** 2)
    np.testing.assert_allclose(_core.acquisition_scores(prediction, "ucb", ucb_beta=1.5).numpy(),
                               d["mean"].numpy() + 1.5 * d["total_std"].numpy())
    with pytest.raises(ValueError, match="regressor"):
        _core.acquisition_scores(prediction, "bald")
    scores = _core.acquisition_scores(prediction, "epistemic")
    top = _core.select_batch(scores, 7, "top")
    assert top == list(np.argsort(-scores.numpy(), kind="stable")[:7])
    assert _core.select_batch(scores, 7, "power", 2.0, 5) == _core.select_batch(scores, 7, "power", 2.0, 5)
    with pytest.raises(ValueError, match="from a pool of 50"):
        _core.select_batch(scores, 51, "top")
    with pytest.raises(ValueError, match="softmax"):
        _core.select_batch(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64), 1, "power")


def test_power_sampling_draws_in_proportion_to_score_to_the_power():
    # First pick of a power-sampled batch: P(row i) = s_i^power / sum s^power.
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    power, draws = 2.0, 4000
    counts = np.bincount([_core.select_batch(scores, 1, "power", power, seed)[0] for seed in range(draws)],
                         minlength=4)
    expected = scores.numpy() ** power / np.sum(scores.numpy() ** power) * draws
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < scipy_stats.chi2.ppf(0.9999, df=3), (counts, expected)
    # Softmax with power 0 is uniform; top is deterministic.
    counts = np.bincount([_core.select_batch(scores, 1, "softmax", 0.0, seed)[0] for seed in range(draws)],
                         minlength=4)
    assert scipy_stats.chisquare(counts).pvalue > 1e-4
    assert _core.select_batch(scores, 2, "top") == [3, 2]
