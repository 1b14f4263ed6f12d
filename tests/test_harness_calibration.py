"""The shadow harness check, simulated: a faithful sandbox must not be called harness drift more
often than the nominal 5 % whatever the agent's consistency across tasks and however many
production runs each task has, and a broken sandbox must still be caught.

Bug: the expected agreement fed each replayed production run into its own task's success rate,
shrunk toward the pooled rate with an arbitrary prior weight m = 2 — for an agent that succeeds
70 % of the time on every task, with one production run per task, a faithful sandbox failed the
check in about 1 experiment of 5 (the demo saw 43–52 of 72 agreeing vs ≈54.6 "expected").

Model of a replay (metrics.md §6 item 4, relyscope.scorers.replay_outcome): another independent
run of its task, succeeding with the task's p_t. The replay of a production success is graded
success or failure by side-effect equivalence; the replay of a production failure is known (a
failure, source equivalence) only when it fails too — taken to repeat the production failure's
side effects — else unknown. A *broken* sandbox makes each replay succeed with 0.75·p_t and fail
known-ly with 0.75·(1 − p_t): a quarter of the agreements a faithful one gives are lost.

Bounds, worked out from the binomial, not from the code: 300 experiments per cell; a false-error
rate of 5 % gives at most 5 % + 2.33·√(0.05·0.95/300) = 7.9 % (one-sided 99 %), i.e. 23 of 300.
Speeds: Trial objects are built once per (run, outcome) and reused, the gate's own decision rule
(relative_agreement_upper < min_harness_agreement, relyscope.scorers.gate.evaluate_gate) is
applied to the HarnessStats the gate would get (relyscope.shadow.gating.harness_stats).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from relyscope.model import Trial
from relyscope.scorers.gate import GatePolicy
from relyscope.scorers.replay_outcome import EQUIVALENCE_SOURCE
from relyscope.shadow.gating import harness_stats

MIN = GatePolicy().min_harness_agreement  # 0.90, the shipped default

DISTS = {
    "beta(7,3)": lambda r, n: r.beta(7, 3, n),
    "beta(.5,.5)": lambda r, n: r.beta(0.5, 0.5, n),
    "deterministic 0/1": lambda r, n: (r.random(n) < 0.7).astype(float),
    "half 0/1, half beta(2,2)": lambda r, n: np.where(r.random(n) < 0.5, (r.random(n) < 0.8).astype(float),
                                                     r.beta(2, 2, n)),
    "0.7 on every task": lambda r, n: np.full(n, 0.7),
}
# production runs per task (drawn per experiment), replays per production run
DESIGNS = {
    "1 run x 1 replay": (lambda r: [1] * 70, 1),
    "1 run x 3 replays": (lambda r: [1] * 24, 3),   # the demo's shape: 24 tasks, 72 replays
    "3 runs x 1 replay": (lambda r: [3] * 23, 1),
    "1/2/5 runs mixed": (lambda r: list(r.choice([1, 2, 5], 30)), 1),
}


@functools.lru_cache(maxsize=None)
def _trial(task: int, run: int, replay: int, outcome: str) -> Trial:
    """Production run ``run`` of task ``task`` (``replay`` = −1) or its replay number ``replay``."""
    pid = f"p{task}.{run}"
    shadow_of = pid if replay >= 0 else None
    return Trial(trial_id=f"r{task}.{run}.{replay}" if shadow_of else pid, trace_id="a" * 32, root_span_id="b" * 16,
                 task_id=f"t{task}", task_id_source="attribute", agent_name="agent", agent_version="1.0",
                 run_kind="shadow" if shadow_of else "production", outcome=outcome,
                 outcome_source=EQUIVALENCE_SOURCE if shadow_of and outcome != "unknown" else None,
                 outcome_score=None, claimed_success=None, confidence=None, conversation_id=None, start_ns=0,
                 end_ns=1, steps=(), shadow_of=shadow_of, task_input="x")


def experiment(r: np.random.Generator, dist: str, design: str, keep: float = 1.0, counts=None) -> bool:
    """One simulated experiment; True when the gate would report harness drift (error)."""
    counts_of, k = DESIGNS.get(design, (None, 1))
    counts = counts if counts is not None else counts_of(r)
    p = DISTS[dist](r, len(counts)).tolist()
    runs, prods, replays = [], {}, []
    for t, (n, pt) in enumerate(zip(counts, p)):
        ys = (r.random(n) < pt).tolist()
        u = r.random((n, k)).tolist()
        for j, y in enumerate(ys):
            prod = _trial(t, j, -1, "success" if y else "failure")
            runs.append(prod)
            prods[prod.trial_id] = prod
            for i in range(k):
                if y:
                    out = "success" if u[j][i] < keep * pt else "failure"
                else:
                    out = "failure" if u[j][i] < keep * (1 - pt) else "unknown"
                replays.append(_trial(t, j, i, out))
    hs = harness_stats(replays, prods, runs)
    return hs is not None and hs.relative_agreement_upper < MIN


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("dist", list(DISTS))
def test_a_faithful_sandbox_is_harness_drift_at_most_5_percent_of_the_time(dist, design):
    seed = sorted(DISTS).index(dist) * 10 + sorted(DESIGNS).index(design)
    r = np.random.default_rng(seed)
    errors = sum(experiment(r, dist, design) for _ in range(300))
    assert errors <= 23, f"{errors} of 300 faithful-sandbox experiments called harness drift ({dist}, {design})"


def test_a_broken_sandbox_is_caught_when_tasks_ran_many_times_in_production():
    """10 production runs on each of 20 tasks, each replayed once (200 replays), Beta(7, 3) agent:
    with a quarter of the agreements lost the relative agreement is ≈ 0.78 (hand: expected ≈
    200·E[p²] = 200·0.509 successes agreeing + the known failures), and the check flags most
    experiments; with half lost (≈ 0.55) it flags essentially all. Measured (seed 99, 200
    experiments): ≈ 0.6 and 1.0; bounds kept well below so that only a real loss of power fails."""
    r = np.random.default_rng(99)
    quarter = sum(experiment(r, "beta(7,3)", "", keep=0.75, counts=[10] * 20) for _ in range(200)) / 200
    half = sum(experiment(r, "beta(7,3)", "", keep=0.5, counts=[10] * 20) for _ in range(200)) / 200
    assert quarter >= 0.45 and half >= 0.95, (quarter, half)
