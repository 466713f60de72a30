"""BatchBALD (Kirsch, van Amersfoort and Gal, 2019; runtime/trainers/uncertainty/batchbald.h)
against baal's implementation installed from PyPI (baal.active.heuristics.BatchBALD) on the
same member probabilities: the same rows in the same order for batches of 1 to 5, where
packtrain counts the joint entropy exactly and baal estimates it from enough draws that its
choice does not change with its seed. Then the estimators' acquire(strategy="batchbald")."""
import numpy as np
import pytest
import torch

import packtrain
from packtrain import _core

heuristics = pytest.importorskip("baal.active.heuristics")


def member_probabilities(K, N, C, seed):
    """(K, N, C): K members that disagree (Dirichlet(0.5) class probabilities)."""
    return np.random.default_rng(seed).dirichlet(np.full(C, 0.5), size=(K, N))


def baal_batch(members, b, draws, torch_seed):
    """baal's batch of b rows in the order it chose them. Its compute_score marks
    the rows it picked (BALD's argmax, then one per step for num_samples steps) with
    their score, not in pick order: the b-th pick is the row batch b adds to batch b-1."""
    by_baal = members.transpose(1, 2, 0)  # (N, C, K): baal's layout
    order = []
    for size in range(1, b + 1):
        torch.manual_seed(torch_seed)
        scores = heuristics.BatchBALD(num_samples=size - 1, num_draw=draws).compute_score(by_baal)
        picked = set(np.flatnonzero(scores).tolist())
        assert len(picked) == size, (size, sorted(picked))  # no early stop: every pick scored > 0.1
        new = picked - set(order)
        assert len(new) == 1, (order, sorted(picked))
        order += list(new)
    return order


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batches_of_1_to_5_are_baals(seed):
    K, N, C = 8, 40, 3
    members = member_probabilities(K, N, C, seed)
    rows, information = _core.batchbald_select(torch.from_numpy(members), 5)  # 3^4 configurations: exact
    # baal draws 2000 label configurations per member (16,000) at every step; two of its seeds agree.
    theirs = baal_batch(members, 5, draws=2000, torch_seed=0)
    assert baal_batch(members, 5, draws=2000, torch_seed=1) == theirs
    assert rows == theirs
    for b in range(1, 6):  # and each shorter batch is the longer one's start
        assert _core.batchbald_select(torch.from_numpy(members), b)[0] == theirs[:b]
    # The first pick is BALD's (baal's too), the joint information grows with each pick.
    bald = heuristics.BALD().compute_score(members.transpose(1, 2, 0))
    assert rows[0] == int(np.argmax(bald))
    assert information[0] == pytest.approx(bald.max(), abs=1e-9)
    assert all(later > earlier for earlier, later in zip(information, information[1:]))


def test_a_copy_of_the_first_pick_is_not_picked_by_packtrain_or_baal():
    members = member_probabilities(8, 30, 3, 3)
    top = int(np.argmax(heuristics.BALD().compute_score(members.transpose(1, 2, 0))))
    with_copy = np.concatenate([members, members[:, top:top + 1]], axis=1)  # row 30 repeats `top`
    rows, _ = _core.batchbald_select(torch.from_numpy(with_copy), 4)
    assert rows[0] == top and 30 not in rows  # of equal scores packtrain takes the lower row
    theirs = baal_batch(with_copy, 4, draws=2000, torch_seed=0)
    assert theirs[0] in (top, 30) and not {top, 30} <= set(theirs)  # baal, argsort's last: the copy
    assert rows[1:] == theirs[1:]


def test_refuses_what_it_cannot_use():
    members = torch.from_numpy(member_probabilities(4, 10, 3, 4))
    with pytest.raises(ValueError, match="cannot choose 11 rows from a pool of 10"):
        _core.batchbald_select(members, 11)
    with pytest.raises(ValueError, match="samples >= 1"):
        _core.batchbald_select(members, 2, samples=0)
    with pytest.raises(ValueError, match=r"\(members, rows, classes\)"):
        _core.batchbald_select(members[0], 2)


def blobs(n, seed=0):
    g = np.random.default_rng(seed)
    labels = g.integers(0, 3, size=n)
    centers = np.array([[0, 0], [3, 0], [0, 3]], dtype=float)
    return centers[labels] + g.normal(scale=1.2, size=(n, 2)), labels


def test_classifier_acquires_by_batchbald():
    x, labels = blobs(160)
    model = packtrain.EnsembleClassifier(members=6, epochs=20, hidden=16).fit(x[:80], labels[:80])
    pool = x[80:]
    chosen, scores = model.acquire(pool, count=6, strategy="batchbald", seed=3)
    members = torch.from_numpy(np.ascontiguousarray(model.predict_member_proba(pool).transpose(2, 0, 1)))
    assert chosen.tolist() == _core.batchbald_select(members, 6, seed=3)[0]
    assert len(set(chosen.tolist())) == 6
    # Its scores are BALD's, and the first pick is their argmax.
    bald_chosen, bald_scores = model.acquire(pool, count=6, strategy="bald")
    np.testing.assert_allclose(scores, bald_scores)
    assert chosen[0] == bald_chosen[0] == int(np.argmax(scores))
    with pytest.raises(ValueError, match="selection must be 'top'"):
        model.acquire(pool, count=6, strategy="batchbald", selection="softmax")


def test_regressor_refuses_batchbald():
    x, _ = blobs(60)
    model = packtrain.EnsembleRegressor(members=2, epochs=2, hidden=8).fit(x, x[:, 0])
    with pytest.raises(ValueError, match="scores classification predictions"):
        model.acquire(x, count=3, strategy="batchbald")
