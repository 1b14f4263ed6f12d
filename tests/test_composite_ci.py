"""A composite's interval keeps its own definition. R = mean(R_Con, R_Pred) (metrics.md §9) on 3
tasks, one of them without outcomes: a resample made of that task alone (probability 1/27 ≈ 3.7 %
of the replicates, more than the 2.5 % tail) has no R_Pred, and the NaN-aware mean made R = R_Con
of that task there — 1.0 — so R's 95 % interval reached 1.0 though no resample where R is defined
can exceed 0.955 (below). A replicate missing a component of the point estimate is now
undefined and left out, on the batch path and on the live one (score_stats)."""

from __future__ import annotations

import pytest

from relyscope.model import Trial
from relyscope.scorers.profile import score_group


def _trial(task: str, i: int, outcome: str) -> Trial:
    # the no-outcome task: three identical runs (C_res = 1); the others vary in wall time (C_res < 1)
    wall = 1.0 if task == "c" else 1.0 + i
    return Trial(trial_id=f"{task}{i}", trace_id=f"{task}{i}".ljust(32, "0"), root_span_id="r", task_id=task,
                 task_id_source="attribute", agent_name="a", agent_version="1", run_kind="production",
                 outcome=outcome, outcome_source="attribute" if outcome != "unknown" else None,
                 outcome_score=None, claimed_success=None, confidence=0.7, conversation_id=None,
                 start_ns=0, end_ns=int(wall * 1e9), steps=())


TRIALS = [_trial("a", i, o) for i, o in enumerate(("success", "failure", "failure"))] + \
    [_trial("b", i, o) for i, o in enumerate(("success", "failure", "failure"))] + \
    [_trial("c", i, "unknown") for i in range(3)]


def test_r_interval_stays_where_r_is_defined():
    g = score_group(TRIALS, n_boot=2000, seed=0)
    m = g.metrics
    # P_brier by hand: confidence 0.7, 2 successes (0.3² = 0.09) and 4 failures (0.7² = 0.49)
    assert m["R_Pred"].value == pytest.approx(1 - (2 * 0.09 + 4 * 0.49) / 6)
    assert m["R"].value == pytest.approx((m["R_Con"].value + m["R_Pred"].value) / 2)
    # a resample where R_Pred is defined holds a or b: R_Pred ≤ 1 − 0.09 (all successes), R_Con ≤ 1
    assert m["R"].ci is not None and m["R"].ci[1] <= (1 + 0.91) / 2 + 1e-9, m["R"].ci
    assert m["R"].ci[0] <= m["R"].value <= m["R"].ci[1]


def test_live_statistics_path_agrees():
    from relyscope.scoring.stats import contribution, score_stats, stats_from_contributions

    g = score_group(TRIALS, n_boot=500, seed=3)
    rows = [(t.task_id, contribution(t)) for t in TRIALS]
    live = score_stats(stats_from_contributions(rows), safety_measured=False, n_boot=500, seed=3)
    assert live.metrics["R"].ci[1] <= (1 + 0.91) / 2 + 1e-9
    assert live.metrics["R"].ci == pytest.approx(g.metrics["R"].ci)
