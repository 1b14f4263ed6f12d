"""Tests for relyscope.scorers.bootstrap (metrics.md §10): coverage by simulation, exact
hand-derived degenerate cases, clustering, strata, pairing, seeding."""

from __future__ import annotations

import numpy as np
import pytest

from relyscope.scorers import bootstrap as B


def test_clustered_ci_covers_and_trial_level_undercovers() -> None:
    """1000 simulated suites of 40 tasks × 5 trials, per-task pass rates p_t ~ Beta(1, 1) (true
    population mean 0.5), B = 500. The task-clustered 95 % CI of the success rate must cover 0.5 in
    93–97 % of suites; a trial-level bootstrap (resampling the 200 trials, which ignores that trials
    of one task are correlated) must cover clearly less on the same data.

    Expected under-coverage, worked out: Var(mean) ∝ 5·Var(p) + E[p(1−p)] = 5/12 + 1/6 per task
    cluster, while the trial-level bootstrap sees p̄(1−p̄) ≈ 1/4: SE ratio ≈ 1.53 → ~80 % coverage.
    """
    rng = np.random.default_rng(20260)
    n_suites, n_tasks, n_trials, n_boot, truth = 1000, 40, 5, 500, 0.5
    hit_clustered = hit_trial = 0
    for s in range(n_suites):
        p = rng.beta(1.0, 1.0, n_tasks)
        outcomes = rng.random((n_tasks, n_trials)) < p[:, None]
        c = outcomes.sum(axis=1)
        n = np.full(n_tasks, n_trials)
        ci = B.bootstrap_ratio(c, n, n_boot=n_boot, seed=s).ci
        assert ci is not None
        hit_clustered += ci[0] <= truth <= ci[1]
        flat = outcomes.reshape(-1).astype(float)
        idx = rng.integers(0, flat.size, size=(n_boot, flat.size))
        lo, hi = np.percentile(flat[idx].mean(axis=1), [2.5, 97.5])
        hit_trial += lo <= truth <= hi
    cov_c, cov_t = hit_clustered / n_suites, hit_trial / n_suites
    print(f"coverage clustered={cov_c:.4f} trial-level={cov_t:.4f}")
    assert 0.93 <= cov_c <= 0.97, cov_c
    assert cov_t < 0.90, cov_t
    assert cov_t < cov_c - 0.05


def test_resamples_whole_tasks_only() -> None:
    # task A: 5/5, task B: 0/5. Whole-task replicates can only be AA, AB, BA, BB → {1, .5, 0};
    # resampling single trials would give other fractions (e.g. 0.3).
    sums = B.replicate_sums(np.array([[5.0, 5.0], [0.0, 5.0]]), n_boot=300, seed=1)
    rates = sums[:, 0] / sums[:, 1]
    assert set(np.round(rates, 12)) <= {0.0, 0.5, 1.0}
    assert (sums[:, 1] == 10).all()  # every replicate has 2 tasks × 5 trials


def test_weights_sum_to_n_tasks_and_strata_keep_sizes() -> None:
    rng = np.random.default_rng(0)
    strata = np.array(["a"] * 3 + ["b"] * 7)
    for w in B.resample_weights(10, n_boot=50, rng=rng, strata=strata, chunk_rows=16):
        assert (w.sum(axis=1) == 10).all()
        assert (w[:, :3].sum(axis=1) == 3).all() and (w[:, 3:].sum(axis=1) == 7).all()


def test_stratified_ci_is_degenerate_when_strata_are_homogeneous() -> None:
    # stratum A: 10 tasks all success, stratum B: 30 tasks all failure → every stratified replicate
    # has exactly 10 A and 30 B tasks → mean 0.25 always. Unstratified replicates vary.
    values = np.array([1.0] * 10 + [0.0] * 30)
    labels = ["A"] * 10 + ["B"] * 30
    strat = B.bootstrap_mean(values, n_boot=400, seed=3, strata=labels)
    assert strat.estimate == 0.25 and strat.ci == (0.25, 0.25)
    plain = B.bootstrap_mean(values, n_boot=400, seed=3)
    assert plain.ci is not None and plain.ci[0] < 0.25 < plain.ci[1]


def test_seeded_and_reproducible() -> None:
    v = np.random.default_rng(5).random(30)
    a = B.bootstrap_mean(v, n_boot=300, seed=11)
    b = B.bootstrap_mean(v, n_boot=300, seed=11)
    c = B.bootstrap_mean(v, n_boot=300, seed=12)
    assert a == b and a.ci != c.ci
    assert a.estimate == pytest.approx(v.mean())
    assert a.ci is not None and a.ci[0] < a.estimate < a.ci[1]


def test_nan_values_are_skipped_and_undefined_gives_no_ci() -> None:
    v = np.array([1.0, np.nan, 0.0, np.nan])
    r = B.bootstrap_mean(v, n_boot=200, seed=0)
    assert r.estimate == 0.5 and r.n_defined < 200  # replicates drawing only NaN tasks are undefined
    empty = B.bootstrap_mean(np.array([np.nan, np.nan]), n_boot=50, seed=0)
    assert np.isnan(empty.estimate) and empty.ci is None and empty.n_defined == 0


def test_percentile_interval() -> None:
    r = np.arange(101, dtype=float)  # percentiles 2.5 and 97.5 of 0..100 are 2.5 and 97.5
    assert B.percentile_interval(r) == pytest.approx((2.5, 97.5), abs=1e-9)
    assert B.percentile_interval(np.append(r, np.nan)) == pytest.approx((2.5, 97.5), abs=1e-9)
    assert B.percentile_interval(r, level=0.5) == pytest.approx((25.0, 75.0), abs=1e-9)
    assert B.percentile_interval([np.nan]) is None
    with pytest.raises(ValueError):
        B.percentile_interval(r, level=1.0)


def test_paired_delta_cancels_task_difficulty() -> None:
    # candidate = baseline + 0.1 on every shared task: Δ = 0.1 in every paired replicate.
    rng = np.random.default_rng(2)
    base = rng.random(50) * 0.8
    d = B.paired_bootstrap_mean(base, base + 0.1, n_boot=300, seed=4)
    assert d.delta == pytest.approx(0.1) and d.n_tasks == 50
    assert d.ci is not None and d.ci[0] == pytest.approx(0.1) and d.ci[1] == pytest.approx(0.1)
    # unpaired intervals of the two means would be wide and overlapping
    wide = B.bootstrap_mean(base, n_boot=300, seed=4).ci
    assert wide is not None and wide[1] - wide[0] > 0.1


def test_paired_ratio_on_shared_tasks() -> None:
    base_ids, cand_ids = ["t1", "t2", "t3", "t4"], ["t4", "t2", "t9", "t1"]
    ib, ic, ids = B.shared_tasks(base_ids, cand_ids)
    assert ids == ["t1", "t2", "t4"]
    base_cn = np.array([[1, 4], [2, 4], [0, 4], [4, 4]], dtype=float)  # (c, n) per baseline task
    cand_cn = np.array([[4, 4], [3, 4], [4, 4], [1, 4]], dtype=float)
    d = B.paired_bootstrap([base_cn[ib]], [cand_cn[ic]], B.ratio_statistic, n_boot=200, seed=0)
    # shared: t1 base 1/4 cand 1/4; t2 2/4 vs 3/4; t4 4/4 vs 4/4 → Δ = (8 − 7)/12
    assert d.delta == pytest.approx(1 / 12)
    assert d.ci is not None and d.ci[0] <= d.delta <= d.ci[1]
    with pytest.raises(ValueError):
        B.shared_tasks(["a", "a"], ["a"])


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        B.bootstrap_mean(np.array([]), n_boot=10)
    with pytest.raises(ValueError):
        B.bootstrap_ratio([1, 2], [2, 2], n_boot=10, strata=["x"])
    with pytest.raises(ValueError):
        B.replicate_sums(np.array([[np.nan]]), n_boot=5)


def test_yielding_pauses_before_each_chunk_in_this_thread_only() -> None:
    """``yielding(pause)`` calls ``pause`` once before each chunk of replicates, in the calling
    thread only, and changes no replicate. 1 000 tasks: a chunk holds 1 000 000 // 1 000 = 1 000
    replicates, so B = 2 500 is 3 chunks (1 000, 1 000, 500)."""
    import threading

    rng = np.random.default_rng(7)
    cols = rng.random((1000, 3))
    plain = B.replicate_sums(cols, n_boot=2500, seed=3)
    calls: list[str] = []
    with B.yielding(lambda: calls.append(threading.current_thread().name)):
        paused = B.replicate_sums(cols, n_boot=2500, seed=3)
        other: list[np.ndarray] = []
        t = threading.Thread(target=lambda: other.append(B.replicate_sums(cols, n_boot=2500, seed=3)), name="other")
        t.start()
        t.join()
    assert calls == [threading.current_thread().name] * 3
    np.testing.assert_array_equal(paused, plain)
    np.testing.assert_array_equal(other[0], plain)
    B.replicate_sums(cols, n_boot=2500, seed=3)  # the block ended: no more calls
    assert len(calls) == 3
