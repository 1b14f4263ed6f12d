"""Drift (metrics.md §10): Δ = current − reference per metric with the task-clustered bootstrap
over the union of both windows' tasks; flagged when the CI excludes 0 and |Δ| > threshold."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from live_traffic import make_trial
from relyscope.scoring.drift import drift
from relyscope.scoring.stats import contribution, score_stats, stats_from_contributions


def _trial(i: int, task: str, ok: bool):
    t = make_trial(random.Random(i), i, task=task, end_ns=10**18)
    return dataclasses.replace(t, outcome="success" if ok else "failure", status="complete",
                               perturbation_family=None)


def _stats(trials):
    return stats_from_contributions([(t.task_id, contribution(t)) for t in trials])


def test_identical_windows_never_drift():
    rng = random.Random(0)
    trials = [make_trial(rng, i, task=f"t{i % 15}", end_ns=10**18) for i in range(150)]
    d = drift(_stats(trials), _stats(trials), safety_measured=False, n_boot=300)
    assert d and all(x.delta == 0 or math.isnan(x.delta) for x in d.values())
    assert not any(x.flagged for x in d.values())


def test_uniform_drop_is_flagged_with_a_degenerate_interval():
    # 20 tasks × 5 trials: all succeed before, 2 of 5 now. Every task changes by −0.6, so every
    # replicate's Δ is −0.6 and the interval is [−0.6, −0.6]; pass^1 likewise; C_out (2p−1)²:
    # 1 → 0.04, Δ = −0.96.
    ref = [_trial(i, f"t{i // 5}", True) for i in range(100)]
    cur = [_trial(1000 + i, f"t{i // 5}", i % 5 < 2) for i in range(100)]
    d = drift(_stats(cur), _stats(ref), safety_measured=False, n_boot=200)
    assert d["success_rate"].delta == pytest.approx(-0.6)
    assert d["success_rate"].ci == pytest.approx((-0.6, -0.6))
    assert d["success_rate"].flagged and d["pass^1"].flagged
    assert d["C_out"].delta == pytest.approx(0.04 - 1.0)
    assert d["success_rate"].tasks_current == d["success_rate"].tasks_reference == 20


def test_small_change_below_threshold_is_not_flagged():
    ref = [_trial(i, f"t{i // 5}", True) for i in range(100)]
    cur = [_trial(1000 + i, f"t{i // 5}", i != 0) for i in range(100)]  # one failure in task t0
    d = drift(_stats(cur), _stats(ref), safety_measured=False, threshold=0.05, n_boot=500)
    assert d["success_rate"].delta == pytest.approx(-0.01)
    assert not d["success_rate"].flagged


def test_deltas_equal_the_difference_of_the_window_scores():
    rng = random.Random(4)
    ref = [make_trial(rng, i, task=f"t{rng.randint(0, 20)}", end_ns=10**18) for i in range(300)]
    cur = [make_trial(rng, 5000 + i, task=f"t{rng.randint(10, 30)}", end_ns=10**18, p_success=0.3)
           for i in range(200)]  # partly other tasks
    a = score_stats(_stats(ref), safety_measured=False, n_boot=0, max_k=4)
    b = score_stats(_stats(cur), safety_measured=False, n_boot=0, max_k=4)
    d = drift(_stats(cur), _stats(ref), safety_measured=False, n_boot=300, max_k=4)
    assert set(d) == set(a.metrics) & set(b.metrics)
    for k, x in d.items():
        want = b.metrics[k].value - a.metrics[k].value
        assert (math.isnan(x.delta) and math.isnan(want)) or x.delta == pytest.approx(want), k
        if x.ci is not None:
            assert x.ci[0] <= x.ci[1]
    # success 0.6 → 0.3: a drop of ~0.3 with 200–300 trials is flagged
    assert d["success_rate"].delta < -0.2 and d["success_rate"].flagged
    with pytest.raises(ValueError):
        drift(_stats(cur), _stats(ref), safety_measured=False, threshold=-1)


# ------------------------------------------------------------------------------------------------
# The alerting decision: Δ ± z·se with the CR1-corrected bootstrap SE, |Δ| > threshold, min trials

import numpy as np  # noqa: E402

from relyscope.scoring.drift import outcome_drift_batch  # noqa: E402
from relyscope.scoring.stats import SUM_COLUMNS, TaskStats  # noqa: E402

_IDX = {name: i for i, (name, _) in enumerate(SUM_COLUMNS)}


def _counts_stats(c, n) -> TaskStats:
    """Outcome-only per-task statistics (task j = id t{j:04d}) from success and trial counts."""
    c, n = np.asarray(c), np.asarray(n)
    keep = np.flatnonzero(n > 0)
    sums = np.zeros((keep.size, len(SUM_COLUMNS)), dtype=object)
    for col, vals in (("n_all", n), ("n", n), ("n_nom", n), ("c", c)):
        sums[:, _IDX[col]] = [int(v) for v in vals[keep]]
    return TaskStats([f"t{i:04d}" for i in keep], sums, [], [[] for _ in keep])


# 10 tasks × 4 trials in both windows; all succeed in the reference, the current successes below.
# Every replicate draws 10 tasks, so Σ w n = 40 on both sides and Δ* = Σ w_t d_t / 40 with
# d_t = c_cur − 4: the ideal bootstrap variance is T·var_pop(d/4)/T², and × T/(T−1) it is the
# paired-t SE s/√T of the per-task differences d_t/4 = 0,0,0,0,−¼,−¼,−¼,−½,−½,−¾:
# mean −0.25 (30 of 40 succeed now); Σ(x − x̄)² = 4·0.25² + 3·0 + 2·0.25² + 0.5² = 0.625;
# se² = 0.625 / 9 / 10 = 1/144, se = 1/12.
_CUR = [4, 4, 4, 4, 3, 3, 3, 2, 2, 1]
_SE = 1 / 12


def test_se_is_the_paired_cluster_se_of_a_worked_case():
    d = drift(_counts_stats(_CUR, [4] * 10), _counts_stats([4] * 10, [4] * 10), safety_measured=False,
              n_boot=2000, min_trials=0)["success_rate"]
    assert d.delta == pytest.approx(-0.25)
    assert d.se == pytest.approx(_SE, rel=0.05)  # B = 2000: Monte Carlo error of an SD ≈ 1/sqrt(2B) = 1.6 %
    assert d.trials_current == 40


def test_alert_level_and_min_trials_decide_the_flag():
    # |Δ| / se = 0.25 · 12 = 3.0: beyond t(9 df) at 0.975 = 2.262 (level 0.95), inside t(9 df) at
    # 0.9995 = 4.781 (level 0.999) — published t table values
    cur, ref = _counts_stats(_CUR, [4] * 10), _counts_stats([4] * 10, [4] * 10)
    kw = dict(safety_measured=False, n_boot=2000)
    assert drift(cur, ref, alert_level=0.95, min_trials=40, **kw)["success_rate"].flagged
    assert not drift(cur, ref, alert_level=0.999, min_trials=40, **kw)["success_rate"].flagged
    assert not drift(cur, ref, alert_level=0.95, min_trials=41, **kw)["success_rate"].flagged  # 40 trials only
    assert not drift(cur, ref, alert_level=0.95, min_trials=0, threshold=0.25, **kw)["success_rate"].flagged
    with pytest.raises(ValueError):
        drift(cur, ref, alert_level=1.0, **kw)
    with pytest.raises(ValueError):
        drift(cur, ref, min_trials=-1, **kw)


def _null_windows(rng, reps, T, n_cur_per_task, n_ref_per_task):
    """``reps`` window pairs with the same per-task success probabilities (true Δ = 0)."""
    p = rng.beta(7, 3, (reps, T))
    n_cur = rng.poisson(n_cur_per_task, (reps, T))
    n_ref = rng.poisson(n_ref_per_task, (reps, T))
    return rng.binomial(n_cur, p), n_cur, rng.binomial(n_ref, p), n_ref


def test_interval_covers_zero_at_its_nominal_level_on_stable_traffic():
    # 40 tasks, ~3 trials each in the current window and ~60 in the reference, true Δ = 0: the
    # 95 % interval Δ ± 1.96·se covers 0 in ≈ 95 % of 1500 replications (binomial SD 0.56 %).
    # (The flag's interval uses t(39 df) = 2.023 instead, slightly wider.)
    rng = np.random.default_rng(3)
    cc, nc, cr, nr = _null_windows(rng, 1500, 40, 3, 60)
    out = outcome_drift_batch(cc, nc, cr, nr, n_boot=1000, alert_level=0.95, min_trials=0, percentiles=False)
    r = out["success_rate"]
    covered = np.abs(r["delta"]) <= 1.959964 * r["se"]
    assert 0.93 <= covered.mean() <= 0.97


def test_stable_traffic_with_few_trials_per_task_rarely_flags():
    # the bug: 50 tasks, ~1 trial per task in the current hour, 24 in the reference — the 95 %
    # percentile interval with the 0.05 threshold flagged ~6 % of evaluations (bench/README.md).
    # The default decision (level 0.9998, ≥ 100 trials) flags none at 50 trials and ≤ 0.3 % at 150.
    rng = np.random.default_rng(5)
    for per_task, bound in ((1, 0.0), (3, 0.003)):
        cc, nc, cr, nr = _null_windows(rng, 1000, 50, per_task, 24 * per_task)
        out = outcome_drift_batch(cc, nc, cr, nr, n_boot=1000)
        flagged = out["success_rate"]["flagged"] & (out["success_rate"]["delta"] < 0)
        assert flagged.mean() <= bound, per_task


def test_ten_point_drop_is_flagged_with_the_power_of_a_z_test():
    # 50 tasks, ~8 trials each in the current hour (~400 trials), p_t − 0.10: Δ ≈ −0.10 with se ≈
    # sqrt(0.6·0.4/400) = 0.0245 (a trial's outcome is Bernoulli(p̄) over the task mix); at level
    # 0.999 the critical value is t(49 df) at 0.9995 = 3.50 (scipy.stats.t.ppf), so P(flag) ≈
    # Φ(0.10/0.0245 − 3.50) = Φ(0.58) = 0.72 (normal approximation; 200 replications: SD 0.03)
    rng = np.random.default_rng(9)
    p = rng.beta(7, 3, (200, 50))
    n_cur, n_ref = rng.poisson(8, (200, 50)), rng.poisson(192, (200, 50))
    out = outcome_drift_batch(rng.binomial(n_cur, np.clip(p - 0.1, 0, 1)), n_cur, rng.binomial(n_ref, p), n_ref,
                              n_boot=1000, alert_level=0.999, percentiles=False)
    assert 0.62 <= out["success_rate"]["flagged"].mean() <= 0.82


def test_batch_equals_drift():
    """The bench's fast path is the sidecar's decision: same Δ, SE, interval and flag as drift()
    on the same windows (same draws), for every watched outcome metric."""
    rng = np.random.default_rng(1)
    E, T = 10, 30
    p = rng.beta(7, 3, T)
    n_cur = rng.poisson(rng.choice([0.3, 2, 5], size=(E, 1)), size=(E, T))
    n_ref = rng.poisson(10, size=(E, T)) * (rng.random((E, T)) < 0.8)  # some tasks absent: unions differ
    c_cur = rng.binomial(n_cur, np.clip(p - 0.1 * (np.arange(E)[:, None] % 2), 0, 1))
    c_ref = rng.binomial(n_ref, p)
    kw = dict(n_boot=500, min_trials=10, alert_level=0.99)
    b = outcome_drift_batch(c_cur, n_cur, c_ref, n_ref, **kw)
    flags = 0
    for e in range(E):
        d = drift(_counts_stats(c_cur[e], n_cur[e]), _counts_stats(c_ref[e], n_ref[e]), safety_measured=False,
                  max_k=1, **kw)
        for k, r in b.items():
            assert d[k].delta == pytest.approx(r["delta"][e], abs=1e-12), (e, k)
            assert d[k].se == pytest.approx(r["se"][e], rel=1e-9), (e, k)
            assert d[k].ci == pytest.approx((r["ci_low"][e], r["ci_high"][e]), abs=1e-12), (e, k)
            assert d[k].flagged == bool(r["flagged"][e]), (e, k)
            flags += d[k].flagged
    assert 0 < flags < 3 * E  # both outcomes occur


def test_critical_value_is_students_t_with_tasks_minus_one_df():
    from relyscope.scoring.drift import critical_value
    # published two-sided t table: df 9 at 0.05 → 2.262, df 9 at 0.001 → 4.781, df 1 at 0.05 → 12.706
    assert critical_value(0.95, 10) == pytest.approx(2.262, abs=5e-4)
    assert critical_value(0.999, 10) == pytest.approx(4.781, abs=5e-4)
    assert critical_value(0.95, 2) == pytest.approx(12.706, abs=5e-4)
    assert math.isnan(critical_value(0.95, 1))
    with pytest.raises(ValueError):
        critical_value(1.5, 10)


def test_critical_value_is_students_t_with_tasks_minus_one_df():
    from relyscope.scoring.drift import critical_value
    # published two-sided t table: df 9 at 0.05 → 2.262, df 9 at 0.001 → 4.781, df 1 at 0.05 → 12.706
    assert critical_value(0.95, 10) == pytest.approx(2.262, abs=5e-4)
    assert critical_value(0.999, 10) == pytest.approx(4.781, abs=5e-4)
    assert critical_value(0.95, 2) == pytest.approx(12.706, abs=5e-4)
    assert math.isnan(critical_value(0.95, 1))
    with pytest.raises(ValueError):
        critical_value(1.5, 10)
