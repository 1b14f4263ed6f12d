"""Scores from per-task sufficient statistics (relyscope.scoring.stats) equal the batch
score_group of the same trials, for every metric, value, interval and count."""

from __future__ import annotations

import math
import random

import pytest

from live_traffic import grading, make_trial
from relyscope.scorers.profile import score_group
from relyscope.scoring.stats import contribution, score_stats, stats_from_contributions


def assert_same(batch, inc, *, rel=1e-9):
    assert (inc.tasks, inc.trials, inc.invalid_trials, inc.incomplete_trials) == (
        batch.tasks, batch.trials, batch.invalid_trials, batch.incomplete_trials)
    assert list(inc.metrics) == list(batch.metrics)
    for key, b in batch.metrics.items():
        i = inc.metrics[key]
        assert (i.n_tasks, i.n_trials) == (b.n_tasks, b.n_trials), key
        if math.isnan(b.value):
            assert math.isnan(i.value), key
        else:
            assert i.value == pytest.approx(b.value, rel=rel, abs=1e-12), key
        if b.ci is None:
            assert i.ci is None, key
        else:
            assert i.ci == pytest.approx(b.ci, rel=rel, abs=1e-12), key


def incremental(trials, sev, invalid, **kw):
    rows = [(t.task_id, contribution(t, severity=sev.get(t.trial_id, 0.0) if sev else 0.0,
                                     invalid=t.trial_id in invalid)) for t in trials]
    return score_stats(stats_from_contributions(rows), safety_measured=sev is not None, **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_metric_equals_batch(seed):
    rng = random.Random(seed)
    trials = [make_trial(rng, i, task=f"t{rng.randint(0, 30):03d}", end_ns=10**18 + i) for i in range(400)]
    sev, invalid = grading(rng, trials)
    # score_group indexes tasks by first appearance; score_stats by sorted task id
    ordered = sorted(trials, key=lambda t: t.task_id)
    batch = score_group(ordered, severities=sev, invalid=invalid, n_boot=200, seed=3, max_k=6)
    assert_same(batch, incremental(trials, sev, invalid, n_boot=200, seed=3, max_k=6))


def test_without_policy_and_empty():
    rng = random.Random(7)
    trials = [make_trial(rng, i, task=f"t{i % 5}", end_ns=10**18) for i in range(40)]
    ordered = sorted(trials, key=lambda t: t.task_id)
    assert_same(score_group(ordered, n_boot=50), incremental(trials, None, set(), n_boot=50))
    empty = score_stats(stats_from_contributions([]), safety_measured=True, n_boot=50)
    assert empty.trials == 0 and math.isnan(empty.metrics["success_rate"].value)


def test_retraction_cancels_exactly():
    """A contribution added then retracted leaves the statistics (and every score) as if the trial
    had never been seen: what a late outcome or a re-finalized trial does to the rollup."""
    rng = random.Random(11)
    trials = [make_trial(rng, i, task=f"t{i % 7}", end_ns=10**18) for i in range(120)]
    rows = [(t.task_id, contribution(t, severity=0.5 if i % 9 == 0 else 0.0)) for i, t in enumerate(trials)]
    extra = [(t.task_id, contribution(t, severity=1.0)) for t in trials[:30]]
    with_retraction = rows + extra + [(task, c.negated()) for task, c in extra]
    a = score_stats(stats_from_contributions(rows), safety_measured=True, n_boot=100)
    b = score_stats(stats_from_contributions(with_retraction), safety_measured=True, n_boot=100)
    assert_same(a, b, rel=1e-12)


def test_c_res_hand_worked():
    """Two trials of one task with wall times 1 s and 3 s, everything else equal: CV(wall) =
    std(ddof=1)/mean = sqrt(2)/2; cost, calls and tokens have CV 0 and tool errors (all 0) are skipped, so
    C_res = exp(-(√2/2)/5)."""
    rng = random.Random(0)
    a = make_trial(rng, 1, task="x", end_ns=10**18)
    import dataclasses
    a = dataclasses.replace(a, start_ns=10**18 - 1_000_000_000, cost_usd=0.01, model_calls=2, tool_calls=1,
                            total_tokens=100, tool_errors=0, status="complete", perturbation_family=None)
    b = dataclasses.replace(a, trial_id="b", start_ns=10**18 - 3_000_000_000)
    s = score_stats(stats_from_contributions([("x", contribution(a)), ("x", contribution(b))]),
                    safety_measured=False, n_boot=0)
    # tool_errors: mean = std = 0 → skipped; five resources remain
    assert s.metrics["C_res"].value == pytest.approx(math.exp(-(math.sqrt(2) / 2) / 5))


def test_identical_bootstrap_columns_are_stored_once_with_the_same_intervals(monkeypatch):
    """The dense bootstrap block keeps each distinct per-task column once (pass@k and pass^k share
    their "defined" column; all-ones and all-zeros columns repeat); the intervals equal those of
    the block with every column kept (the layout before, as the oracle)."""
    import numpy as np

    from relyscope.scorers import profile
    from relyscope.scoring.stats import _prepare

    rng = random.Random(4)
    trials = [make_trial(rng, i, task=f"t{rng.randint(0, 30):03d}", end_ns=10**18 + i) for i in range(400)]
    sev, invalid = grading(rng, trials)
    rows = [(t.task_id, contribution(t, severity=sev[t.trial_id], invalid=t.trial_id in invalid)) for t in trials]
    st = stats_from_contributions(rows)
    block = _prepare(st, True, 6).blocks[0]
    assert np.unique(block, axis=1).shape[1] == block.shape[1]
    dedup = score_stats(st, safety_measured=True, n_boot=300, seed=5, max_k=6)

    def add_all(self, *arrays):
        start = len(self.cols)
        for a in arrays:
            a = np.asarray(a, dtype=np.float64)
            self.cols.extend([a] if a.ndim == 1 else list(a.T))
        return np.arange(start, len(self.cols))

    monkeypatch.setattr(profile._Columns, "add", add_all)
    full_block = _prepare(st, True, 6).blocks[0]
    assert full_block.shape[1] > block.shape[1]
    assert_same(score_stats(st, safety_measured=True, n_boot=300, seed=5, max_k=6), dedup, rel=1e-12)


def _pass_by_hand(c: int, n: int, k: int) -> tuple[float, float]:
    """pass@k = 1 − C(n−c, k)/C(n, k), pass^k = C(c, k)/C(n, k) (metrics.md §2), NaN below k runs."""
    if n < k:
        return math.nan, math.nan
    return 1 - math.comb(n - c, k) / math.comb(n, k), math.comb(c, k) / math.comb(n, k)


def test_pass_rows_remembered_across_calls_equal_the_binomials_also_after_the_table_starts_over(monkeypatch):
    import numpy as np

    from relyscope.scoring import stats as S

    monkeypatch.setattr(S, "_PASS_TABLES", {})
    monkeypatch.setattr(S, "_PASS_MEMO_MAX", 40)  # small: later calls overflow it and start over
    rng = random.Random(5)
    for _ in range(6):  # each call: some pairs seen before, some new, duplicates within the call
        n = np.array([rng.randrange(0, 30) for _ in range(60)], dtype=np.int64)
        c = np.array([rng.randrange(0, int(x) + 1) for x in n], dtype=np.int64)
        got = S._pass_rows(c, n, 4)
        assert got.shape == (60, 8)
        for i in range(60):
            for k in range(1, 5):
                want = _pass_by_hand(int(c[i]), int(n[i]), k)
                assert got[i, k - 1] == pytest.approx(want[0], rel=1e-12, nan_ok=True)
                assert got[i, 4 + k - 1] == pytest.approx(want[1], rel=1e-12, nan_ok=True)
        keys, rows = S._PASS_TABLES[4]
        assert list(keys) == sorted(set(keys.tolist())) and len(keys) <= 40 + 60
    with pytest.raises(ValueError):
        S._pass_rows(np.array([3]), np.array([2]), 2)


def test_means_over_tasks_of_columns_are_the_means_of_their_defined_values():
    import numpy as np

    from relyscope.scoring.stats import _means_over_tasks

    per = np.array([[0.5, np.nan, np.nan], [1.0, 0.25, np.nan], [0.0, 0.75, np.nan]])
    got = _means_over_tasks(per, np.array([2, 3, 5]))
    assert (got[0].value, got[0].n_tasks, got[0].n_trials) == (pytest.approx(0.5), 3, 10)
    assert (got[1].value, got[1].n_tasks, got[1].n_trials) == (pytest.approx(0.5), 2, 8)
    assert math.isnan(got[2].value) and (got[2].n_tasks, got[2].n_trials) == (0, 0)


def test_c_res_from_sums_equals_the_exact_cv_on_both_sides_of_int64():
    """Per-task C_res from (n, Σx, Σx²): exp(−mean CV) with CV = sqrt(var)/|mean| (metrics.md §3),
    worked out in exact fractions, for tool-call counts whose n·Σx² lies just below 2⁶³ (int64
    arithmetic) and just above it (Python ints), and for small counts — one task each."""
    from fractions import Fraction

    import numpy as np

    from relyscope.scoring.stats import SUM_COLUMNS, TaskStats, c_res_per_task

    idx = {name: i for i, (name, _) in enumerate(SUM_COLUMNS)}
    runs = {"beyond": [3_000_000_000, 3_000_000_001, 2_999_999_000],  # 3·Σx² ≈ 8.1e19 > 2⁶³: Python ints
            "within": [1_000_000_000, 1_000_000_003, 999_999_001],  # 3·Σx² ≈ 9.0e18 < 2⁶³ ≈ 9.22e18: int64
            "small": [2, 5, 9, 4]}
    assert 3 * sum(x * x for x in runs["within"]) < 2**63 < 3 * sum(x * x for x in runs["beyond"])
    ids = sorted(runs)
    sums = np.zeros((len(ids), len(SUM_COLUMNS)), dtype=object)
    for i, t in enumerate(ids):
        xs = runs[t]
        sums[i, idx["r3_n"]], sums[i, idx["r3_s"]], sums[i, idx["r3_ss"]] = len(xs), sum(xs), sum(x * x for x in xs)
    got = c_res_per_task(TaskStats(ids, sums))
    for i, t in enumerate(ids):
        xs = [Fraction(x) for x in runs[t]]
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
        assert got[i] == pytest.approx(math.exp(-math.sqrt(var) / float(mean)), rel=1e-12), t
