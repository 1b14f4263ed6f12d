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
