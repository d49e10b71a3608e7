import numpy as np
import pytest

from benchmarks.lib.stats import bootstrap_band, bootstrap_ci, iqm, iqm_along, iqm_ci, stratified_iqm_ci


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert iqm([100, 3, 4, -50, 5, 6, 1000, -7]) == pytest.approx(4.5)  # the tails do not matter
    # n not a multiple of 4: the boundary values count in part (5 values: 1/4 of x1, x2, x3, x4... weights .75,1,.75)
    assert iqm([0, 1, 2, 3, 4]) == pytest.approx((0.75 * 1 + 2 + 0.75 * 3) / 2.5)
    assert iqm([7.0]) == 7.0


def test_iqm_matches_scipy_trimmed_mean_when_n_is_a_multiple_of_four():
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(1).normal(size=64)
    assert iqm(x) == pytest.approx(stats.trim_mean(x, 0.25))


def test_bootstrap_interval_holds_the_estimate_and_narrows_with_more_seeds():
    rng = np.random.default_rng(0)
    few, many = rng.normal(10, 2, 8), rng.normal(10, 2, 256)
    for x in (few, many):
        mid, lo, hi = iqm_ci(x, reps=500)
        assert lo <= mid <= hi
    assert np.diff(bootstrap_ci(many, reps=500)) < np.diff(bootstrap_ci(few, reps=500))
    assert bootstrap_ci([3.0] * 5, reps=50) == (3.0, 3.0)
    assert bootstrap_ci(few, reps=200, seed=4) == bootstrap_ci(few, reps=200, seed=4)  # reproducible


def test_vectorised_iqm_equals_iqm_on_every_slice():
    x = np.random.default_rng(2).normal(size=(7, 5))
    np.testing.assert_allclose(iqm_along(x, axis=0), [iqm(x[:, j]) for j in range(5)])
    np.testing.assert_allclose(iqm_along(x, axis=1), [iqm(row) for row in x])


def test_stratified_interval_pools_tasks_and_skips_missing_ones():
    rng = np.random.default_rng(3)
    scores = np.stack([rng.normal(0, 1, 8), rng.normal(10, 1, 8), np.full(8, np.nan)], axis=1)
    mid, lo, hi = stratified_iqm_ci(scores, reps=300)
    assert mid == pytest.approx(iqm(scores[:, :2].ravel()))
    assert lo <= mid <= hi
    assert stratified_iqm_ci(np.ones((4, 2)), reps=20) == (1.0, 1.0, 1.0)


def test_bootstrap_band_brackets_the_iqm_curve():
    curves = np.random.default_rng(4).normal(size=(6, 10)).cumsum(axis=1)
    mid, lo, hi = bootstrap_band(curves, reps=200)
    assert mid.shape == lo.shape == hi.shape == (10,)
    np.testing.assert_allclose(mid, iqm_along(curves, axis=0))
    assert np.all(lo <= mid + 1e-9) and np.all(mid <= hi + 1e-9)
