"""Tests for the release gate (relyscope.scorers.gate; metrics.md §10, issue 8 item 6).

Suites are built from exact per-task success counts, so every point value below is worked out by
hand (a success rate is Σc/Σn, pass^3 = C(c,3)/C(5,3), C_out = (2p−1)²). Intervals are checked
against bounds that hold for *any* task resample: with the same number of trials per task, a
replicate of a paired Δ of means is a weighted mean of the per-task Δ_t, so it lies in
[min Δ_t, max Δ_t].
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from relyscope.model import Trial
from relyscope.scorers.gate import (
    DEFAULT_GATE_POLICY_PATH,
    EXIT_CODES,
    GatePolicy,
    GatePolicyError,
    GateSide,
    HarnessStats,
    MetricBound,
    SandboxStats,
    default_gate_policy,
    evaluate_gate,
    load_gate_policy,
    needs_more_tasks_estimate,
    parse_gate_policy,
)

K = 5


def trial(side: str, task: int, i: int, ok: bool | None, family: str | None = None, status: str = "complete") -> Trial:
    outcome = "unknown" if ok is None else ("success" if ok else "failure")
    tid = f"{side}-{task}-{family or 'nom'}-{i}"
    return Trial(
        trial_id=tid, trace_id=tid, root_span_id="0" * 16, task_id=f"task-{task}", task_id_source="shadow",
        agent_name="support", agent_version=side, run_kind="shadow", outcome=outcome, outcome_source="test",
        outcome_score=None, claimed_success=None, confidence=None, conversation_id=None, start_ns=0, end_ns=1,
        steps=(), status=status, perturbation_family=family,
    )  # fmt: skip


def trials_from_counts(side: str, counts: list[int], k: int = K, family: str | None = None) -> list[Trial]:
    """Task t gets k trials, the first counts[t] of them successful."""
    return [trial(side, t, i, i < c, family) for t, c in enumerate(counts) for i in range(k)]


def side(trials: list[Trial], label: str = "", **kw) -> GateSide:
    """A side with safety measured and clean unless overridden."""
    kw.setdefault("severities", {})
    kw.setdefault("critical", {})
    kw.setdefault("committed_forbidden", {})
    return GateSide(trials, label=label, **kw)


# 30 tasks, heterogeneous difficulty: baseline successes per task cycle 0..5 (mean 2.5/5).
BASE_COUNTS = [t % 6 for t in range(30)]
# Clearly better on every gated metric, task by task: 2, 3, 4 successes become 5. (A merely shifted
# candidate, c → c + 2, is *less* consistent on the tasks it used to fail always: C_out is not
# monotone in the success rate, so it would not be "clearly better" on C_out.)
BETTER_COUNTS = [5 if c >= 2 else c for c in BASE_COUNTS]


def test_default_policy_file_equals_builtin_defaults_and_documents_them() -> None:
    assert default_gate_policy() == GatePolicy()
    p = GatePolicy()
    assert (p.min_tasks, p.min_trials_per_task, p.level, p.n_boot) == (20, 3, 0.95, 2000)
    assert (p.max_sandbox_miss_rate, p.min_harness_agreement, p.max_infra_invalid_rate) == (0.10, 0.90, 0.10)
    assert p.block_on_critical and p.block_on_committed_forbidden
    assert p.metrics["success_rate"].max_regression == 0.05
    assert set(p.metrics) == {"success_rate", "pass^3", "C_out", "R_Rob", "R_fault", "R_env", "R_prompt", "S_comp"}
    text = DEFAULT_GATE_POLICY_PATH.read_text(encoding="utf-8")
    for key in GatePolicy.model_fields:
        assert f"\n{key}:" in text, key  # every field is written out (and commented) in the file


def test_clearly_better_passes_with_hand_computed_deltas() -> None:
    cand = BETTER_COUNTS
    r = evaluate_gate(side(trials_from_counts("b", BASE_COUNTS), "1.0"), side(trials_from_counts("c", cand), "1.1"), GatePolicy())
    assert r.verdict == "pass" and r.exit_code == 0
    assert all(x.verdict == "note" for x in r.reasons)  # only R_Rob: no perturbed replays
    sr = r.deltas["success_rate"]
    assert sr.baseline == pytest.approx(75 / 150) and sr.candidate == pytest.approx(sum(cand) / 150)
    assert sr.delta == pytest.approx((105 - 75) / 150)  # per cycle of 6 tasks: 0+1+5+5+5+5 = 21 vs 15
    d_t = [(c2 - c1) / K for c1, c2 in zip(BASE_COUNTS, cand)]  # per-task Δ in {0, .2, .4, .6}
    assert sr.ci is not None and min(d_t) - 1e-12 <= sr.ci[0] <= sr.delta <= sr.ci[1] <= max(d_t) + 1e-12
    assert (sr.n_tasks, sr.n_trials_baseline, sr.n_trials_candidate) == (30, 150, 150)
    # pass^3 per task C(c,3)/C(5,3): baseline c=0..5 → 0,0,0,.1,.4,1 → 1.5/6; candidate c=0,1,5,5,5,5 → 4/6
    assert r.deltas["pass^3"].delta == pytest.approx(4 / 6 - 1.5 / 6)
    # C_out per task (2p−1)²: baseline 1,.36,.04,.04,.36,1 → 2.8/6; candidate 1,.36,1,1,1,1 → 5.36/6
    assert r.deltas["C_out"].delta == pytest.approx((5.36 - 2.8) / 6)
    assert r.deltas["S_comp"].delta == 0.0 and r.deltas["R_Rob"].verdict == "not_measured"
    assert r.needs_more_tasks is None
    json.dumps(r.to_json(), allow_nan=False)


def test_clearly_worse_blocks_naming_metric_delta_ci_and_sizes() -> None:
    cand = [max(c - 3, 0) for c in BASE_COUNTS]  # 0,0,0,0,1,2 per cycle: 15 of 150
    r = evaluate_gate(side(trials_from_counts("b", BASE_COUNTS)), side(trials_from_counts("c", cand)), GatePolicy())
    assert r.verdict == "block" and r.exit_code == 1
    sr = next(x for x in r.reasons if x.name == "success_rate")
    assert sr.kind == "metric" and sr.verdict == "block"
    assert sr.delta == pytest.approx((15 - 75) / 150)  # −0.4
    # per-task Δ: 0, −.2, −.4, −.6, −.6, −.6 → every replicate in [−0.6, 0]
    assert sr.ci is not None and -0.6 - 1e-12 <= sr.ci[0] <= sr.delta <= sr.ci[1] < -0.05
    assert (sr.n_tasks, sr.n_trials_baseline, sr.n_trials_candidate) == (30, 150, 150)
    assert sr.bound == -0.05
    assert "success_rate" in sr.message and "-0.400" in sr.message and "30 shared tasks" in sr.message


def test_better_but_critical_violation_blocks_on_the_hard_gate() -> None:
    cand_trials = trials_from_counts("c", BETTER_COUNTS)
    bad = cand_trials[7].trial_id
    cand = side(cand_trials, critical={bad: 1}, severities={bad: 1.0})
    r = evaluate_gate(side(trials_from_counts("b", BASE_COUNTS)), cand, GatePolicy())
    assert r.verdict == "block" and r.exit_code == 1
    hard = [x for x in r.reasons if x.verdict == "block"]
    assert [x.name for x in hard] == ["critical_violation"] and hard[0].kind == "hard_gate"
    assert "1 critical safety violations in 1 of 150 candidate trials" in hard[0].message
    assert r.deltas["success_rate"].verdict == "pass"  # the metrics alone would have passed
    # S_comp: candidate 1 violating of 150 nominal trials → Δ = −1/150, above −0.02
    assert r.deltas["S_comp"].delta == pytest.approx(-1 / 150)
    # With the hard gate off nothing blocks, but S_comp cannot pass: the violating task is drawn
    # X ~ Binomial(30, 1/30) times per replicate, P(X >= 3) = 0.077 > 2.5 % > P(X >= 4) = 0.017, so
    # the interval's lower end is Δ at X = 3: −3/150 = −0.02, on the bound → inconclusive.
    r2 = evaluate_gate(side(trials_from_counts("b", BASE_COUNTS)), cand, GatePolicy(block_on_critical=False))
    assert r2.verdict == "inconclusive"
    assert [x.name for x in r2.reasons if x.verdict == "inconclusive"] == ["S_comp"]
    assert -4 / 150 - 1e-12 <= r2.deltas["S_comp"].ci[0] <= -3 / 150 + 1e-12


def test_committed_forbidden_and_infra_invalid_rate_are_hard_gates() -> None:
    base = side(trials_from_counts("b", BASE_COUNTS))
    cand_trials = trials_from_counts("c", BASE_COUNTS)
    r = evaluate_gate(base, side(cand_trials, committed_forbidden={cand_trials[0].trial_id: 2}), GatePolicy())
    assert r.verdict == "block" and r.reasons[0].name == "committed_forbidden" and r.reasons[0].value == 2
    # 16 of 150 invalid = 10.7 % > 10 %: block; the invalid trials also leave the metrics
    invalid = {t.trial_id for t in cand_trials[:16]}
    r = evaluate_gate(base, side(cand_trials, invalid=invalid), GatePolicy())
    inv = [x for x in r.reasons if x.name == "infra_invalid_rate"]
    assert r.verdict == "block" and inv and inv[0].value == pytest.approx(16 / 150)
    assert r.deltas["success_rate"].n_trials_candidate == 150 - 16
    # 15 of 150 = exactly 10 %: not above the bound
    r = evaluate_gate(base, side(cand_trials, invalid={t.trial_id for t in cand_trials[:15]}), GatePolicy())
    assert not [x for x in r.reasons if x.name == "infra_invalid_rate"]


def test_five_tasks_inconclusive_with_needs_more_tasks() -> None:
    # all per-task Δ ≥ 0, so the CI is above the bound: only min_tasks = 20 stops a pass, and the
    # estimate is the floor: 20 − 5 = 15 more tasks.
    base, cand = [1, 2, 3, 4, 2], [2, 3, 3, 5, 3]
    r = evaluate_gate(side(trials_from_counts("b", base)), side(trials_from_counts("c", cand)), GatePolicy())
    assert r.verdict == "inconclusive" and r.exit_code == 3
    sr = next(x for x in r.reasons if x.name == "success_rate")
    assert sr.verdict == "inconclusive" and "fewer than min_tasks = 20" in sr.message and sr.n_tasks == 5
    assert sr.needs_more_tasks == 15 and r.needs_more_tasks >= 15
    assert "needs ≈15 more shared tasks" in sr.message


def test_five_tasks_straddling_estimate_follows_the_formula() -> None:
    base, cand = [3, 3, 3, 3, 3], [5, 1, 4, 2, 3]  # per-task Δ: +.4, −.4, +.2, −.2, 0 → Δ = 0
    r = evaluate_gate(side(trials_from_counts("b", base)), side(trials_from_counts("c", cand)), GatePolicy())
    sr = r.deltas["success_rate"]
    assert sr.delta == pytest.approx(0.0) and sr.verdict == "inconclusive"
    lo, hi = sr.ci
    assert lo < -0.05 < hi
    # independent evaluation of n·(h/g)²: h = Δ − lo, g = Δ + 0.05
    expected = max(math.ceil(5 * ((0.0 - lo) / 0.05) ** 2), 20) - 5
    assert sr.needs_more_tasks == pytest.approx(expected, abs=1)
    assert 20 <= sr.needs_more_tasks <= 2000  # a sane order of magnitude for ±0.25 intervals


def test_needs_more_tasks_estimate_by_hand() -> None:
    # h = 0.10, g = 0.05: 20·(0.1/0.05)² = 80 needed → 60 more
    assert needs_more_tasks_estimate(20, 0.0, (-0.1, 0.1), -0.05) == 60
    # metric defined on 20 of 40 shared tasks: twice as many shared tasks
    assert needs_more_tasks_estimate(20, 0.0, (-0.1, 0.1), -0.05, n_shared=40) == 120
    # estimate below the bound: h = hi − Δ = 0.08, g = 0.04: 10·4 = 40 → 30 more
    assert needs_more_tasks_estimate(10, -0.09, (-0.2, -0.01), -0.05) == 30
    # not straddling, few tasks: the min_tasks floor
    assert needs_more_tasks_estimate(5, 0.2, (0.1, 0.3), -0.05, min_tasks=20) == 15
    assert needs_more_tasks_estimate(10, -0.05, (-0.1, 0.0), -0.05) is None  # Δ exactly on the bound
    assert needs_more_tasks_estimate(0, 0.0, (0.0, 0.0), -0.05) is None


def test_half_the_sandbox_missing_is_an_error_even_if_all_else_passes() -> None:
    base = side(trials_from_counts("b", BASE_COUNTS))
    cand = side(trials_from_counts("c", BETTER_COUNTS))
    r = evaluate_gate(base, cand, GatePolicy(), sandbox=SandboxStats(replays=300, sandbox_misses=150))
    assert r.verdict == "error" and r.exit_code == 2
    assert r.reasons[0].name == "sandbox_miss_rate" and r.reasons[0].value == 0.5 and r.reasons[0].bound == 0.10
    assert "150 of 300" in r.reasons[0].message
    assert r.deltas["success_rate"].verdict == "pass"  # still reported
    ok = evaluate_gate(base, cand, GatePolicy(), sandbox=SandboxStats(replays=300, sandbox_misses=30))  # exactly 10 %
    assert ok.verdict == "pass"
    assert evaluate_gate(base, cand, GatePolicy(), sandbox=SandboxStats(0, 0)).verdict == "pass"  # not measured


def test_harness_drift_is_an_error() -> None:
    base = side(trials_from_counts("b", BASE_COUNTS))
    cand = side(trials_from_counts("c", BASE_COUNTS))
    r = evaluate_gate(base, cand, GatePolicy(), harness=HarnessStats(replays=100, agreeing=80))
    assert r.verdict == "error" and r.reasons[0].name == "harness_agreement" and r.reasons[0].value == 0.8
    assert evaluate_gate(base, cand, GatePolicy(), harness=HarnessStats(100, 90)).verdict == "pass"


def test_error_outranks_block() -> None:
    cand_trials = trials_from_counts("c", [0] * 30)
    r = evaluate_gate(side(trials_from_counts("b", BASE_COUNTS)), side(cand_trials), GatePolicy(), harness=HarnessStats(10, 1))
    assert r.verdict == "error" and {x.verdict for x in r.reasons} >= {"error", "block"}
    assert r.reasons[0].verdict == "error"  # most severe first


def test_no_shared_tasks_or_no_trials_is_an_error() -> None:
    base = side(trials_from_counts("b", BASE_COUNTS))
    other = [
        Trial(**{**{f: getattr(t, f) for f in Trial.__dataclass_fields__}, "task_id": "other-" + t.task_id})
        for t in trials_from_counts("c", BASE_COUNTS)
    ]
    r = evaluate_gate(base, side(other), GatePolicy())
    assert r.verdict == "error" and r.reasons[0].name == "shared_tasks" and r.n_shared_tasks == 0
    r = evaluate_gate(base, side([], label="2.0"), GatePolicy())
    assert r.verdict == "error" and any(x.name == "trials" and "'2.0'" in x.message for x in r.reasons)
    json.dumps(r.to_json(), allow_nan=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_suites_never_block(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.binomial(K, rng.beta(0.64, 0.88, 40)).tolist()
    fault = rng.binomial(K, 0.3, 40).tolist()
    b = trials_from_counts("b", counts) + trials_from_counts("b", fault, family="fault")
    c = trials_from_counts("c", counts) + trials_from_counts("c", fault, family="fault")
    r = evaluate_gate(side(b), side(c), GatePolicy())
    assert r.verdict == "pass"
    for key, d in r.deltas.items():
        if key in ("R_env", "R_prompt"):  # no env / prompt replays in these suites: not measured
            assert math.isnan(d.delta), key
            continue
        assert d.delta == pytest.approx(0.0, abs=1e-12), key
        assert d.ci == pytest.approx((0.0, 0.0), abs=1e-12), key
    # fewer tasks than min_tasks: inconclusive, never block
    r5 = evaluate_gate(side(b[: 5 * K]), side(c[: 5 * K]), GatePolicy())
    assert r5.verdict == "inconclusive"


def test_perturbed_trials_feed_only_robustness() -> None:
    n_t = 25
    b = trials_from_counts("b", [4] * n_t) + trials_from_counts("b", [2] * n_t, family="fault")
    c = trials_from_counts("c", [4] * n_t) + trials_from_counts("c", [4] * n_t, family="fault")
    pol = GatePolicy(metrics={"success_rate": MetricBound(max_regression=0.05), "R_fault": MetricBound(max_regression=0.05),
                              "R_Rob": MetricBound(max_regression=0.05)})  # fmt: skip
    r = evaluate_gate(side(b), side(c), pol)
    # R_fault = min((2/5)/(4/5), 1) = 0.5 baseline, min(1, 1) = 1 candidate
    rf = r.deltas["R_fault"]
    assert (rf.baseline, rf.candidate, rf.delta) == pytest.approx((0.5, 1.0, 0.5))
    assert rf.n_trials_baseline == 2 * n_t * K
    assert r.deltas["R_Rob"].delta == pytest.approx(0.5)  # env/prompt absent: mean over defined = R_fault
    sr = r.deltas["success_rate"]
    assert sr.delta == 0.0 and sr.n_trials_baseline == n_t * K  # the fault replays are not in success_rate
    assert r.verdict == "pass"


def test_not_measured_safety_is_inconclusive_never_a_pass() -> None:
    b = GateSide(trials_from_counts("b", BASE_COUNTS))  # no safety side data at all
    c = GateSide(trials_from_counts("c", BETTER_COUNTS))
    r = evaluate_gate(b, c, GatePolicy())
    assert r.verdict == "inconclusive" and r.needs_more_tasks is None
    names = {x.name for x in r.reasons if x.verdict == "inconclusive"}
    assert names == {"critical_violation", "committed_forbidden", "S_comp"}
    s_comp = next(x for x in r.reasons if x.name == "S_comp")
    assert "metrics.S_comp.required: false" in s_comp.message
    pol = GatePolicy(block_on_critical=False, block_on_committed_forbidden=False,
                     metrics={"success_rate": MetricBound(max_regression=0.05)})  # fmt: skip
    assert evaluate_gate(b, c, pol).verdict == "pass"


def test_lower_is_better_orientation() -> None:
    # an improving success rate (+0.2) gated as if lower were better is a regression of 0.2
    pol = GatePolicy(metrics={"success_rate": MetricBound(max_regression=0.05, higher_is_better=False)})
    cand = BETTER_COUNTS
    r = evaluate_gate(side(trials_from_counts("b", BASE_COUNTS)), side(trials_from_counts("c", cand)), pol)
    assert r.verdict == "block" and r.deltas["success_rate"].delta > 0


def test_min_trials_per_task_restricts_consistency_metrics() -> None:
    # tasks 0-19 have 5 trials on both sides, tasks 20-29 only 2: C_out uses 20 tasks, success_rate 30
    b = trials_from_counts("b", [3] * 20) + [trial("b", t, i, i == 0) for t in range(20, 30) for i in range(2)]
    c = trials_from_counts("c", [3] * 20) + [trial("c", t, i, i == 0) for t in range(20, 30) for i in range(2)]
    r = evaluate_gate(side(b), side(c), GatePolicy())
    assert r.deltas["C_out"].n_tasks == 20 and r.deltas["success_rate"].n_tasks == 30
    assert r.deltas["C_out"].baseline == pytest.approx((2 * 0.6 - 1) ** 2)
    r = evaluate_gate(side(b), side(c), GatePolicy(min_trials_per_task=6))
    assert r.deltas["C_out"].verdict == "not_measured" and r.deltas["pass^3"].verdict == "not_measured"


def test_unknown_outcomes_and_incomplete_trials_are_excluded() -> None:
    b = trials_from_counts("b", [3] * 20)
    c = trials_from_counts("c", [3] * 20) + [trial("c", t, 9, None) for t in range(20)] + [trial("c", t, 8, True, status="incomplete") for t in range(20)]
    r = evaluate_gate(side(b), side(c), GatePolicy())
    sr = r.deltas["success_rate"]
    assert sr.n_trials_candidate == 100 and sr.delta == 0.0
    assert r.deltas["S_comp"].n_trials_candidate == 120  # unknown-outcome trials count for safety


def test_bad_side_data_raises() -> None:
    b = trials_from_counts("b", [3] * 20)
    with pytest.raises(ValueError, match="severity"):
        evaluate_gate(side(b), side(trials_from_counts("c", [3] * 20), severities={"c-0-nom-0": 2.0}), GatePolicy())
    with pytest.raises(ValueError, match="non-negative"):
        evaluate_gate(side(b), side(trials_from_counts("c", [3] * 20), critical={"c-0-nom-0": -1}), GatePolicy())
    with pytest.raises(ValueError):
        SandboxStats(replays=10, sandbox_misses=11)
    with pytest.raises(ValueError):
        HarnessStats(replays=-1, agreeing=0)


def test_strata_resample_within_each_stratum() -> None:
    # Per-task counts depend only on t % 6; with t % 6 as the stratum every stratum is homogeneous,
    # so every stratified replicate reproduces the point Δ: a zero-width interval at 0.2.
    strata = {f"task-{t}": t % 6 for t in range(30)}
    pol = GatePolicy(metrics={"success_rate": MetricBound(max_regression=0.05)})
    b, c = side(trials_from_counts("b", BASE_COUNTS)), side(trials_from_counts("c", BETTER_COUNTS))
    sr = evaluate_gate(b, c, pol, strata=strata).deltas["success_rate"]
    assert sr.ci == pytest.approx((0.2, 0.2), abs=1e-12)
    plain = evaluate_gate(b, c, pol).deltas["success_rate"]
    assert plain.ci[1] - plain.ci[0] > 0.05


def test_exit_codes() -> None:
    assert EXIT_CODES == {"pass": 0, "block": 1, "error": 2, "inconclusive": 3}


# --- policy files ---------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gate.yaml"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("min_tasks: many\n", "min_tasks: Input should be a valid integer (got 'many')"),
        ("min_tasks: 20.5\n", "min_tasks:"),
        ("min_task: 20\n", "min_task: Extra inputs are not permitted"),
        ("metrics:\n  succes_rate: {max_regression: 0.05}\n", "metrics.succes_rate: unknown metric key 'succes_rate'"),
        ("metrics:\n  C_res: {max_regression: 0.05}\n", "metrics.C_res: metric 'C_res' cannot be gated"),
        ("metrics:\n  success_rate: {max_regression: -0.1}\n", "metrics.success_rate.max_regression: Input should be greater than or equal to 0"),
        ("metrics:\n  success_rate: {max_regresion: 0.1}\n", "metrics.success_rate.max_regresion: Extra inputs are not permitted"),
        ("metrics:\n  success_rate: {}\n", "metrics.success_rate.max_regression: Field required"),
        ("level: 1.5\n", "level: Input should be less than 1"),
        ("block_on_critical: maybe\n", "block_on_critical: Input should be a valid boolean"),
        ("max_sandbox_miss_rate: -0.1\n", "max_sandbox_miss_rate: Input should be greater than or equal to 0"),
    ],
)
def test_malformed_policy_names_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(GatePolicyError) as ei:
        load_gate_policy(p)
    msg = str(ei.value)
    assert str(p) in msg and field in msg, msg
    assert isinstance(ei.value, ValueError)


def test_policy_syntax_and_shape_errors(tmp_path: Path) -> None:
    with pytest.raises(GatePolicyError, match="YAML syntax error"):
        load_gate_policy(_write(tmp_path, "metrics: {success_rate: [\n"))
    with pytest.raises(GatePolicyError, match="must be a mapping"):
        load_gate_policy(_write(tmp_path, "- min_tasks\n"))
    with pytest.raises(GatePolicyError, match="<x>"):
        parse_gate_policy({"n_boot": 0}, origin="<x>")


def test_partial_policy_keeps_defaults_and_metrics_replace(tmp_path: Path) -> None:
    assert load_gate_policy(_write(tmp_path, "")) == GatePolicy()
    p = load_gate_policy(_write(tmp_path, "min_tasks: 30\nmetrics:\n  pass^2: {max_regression: 0.1}\n  pass@1: {max_regression: 0.02}\n"))
    assert p.min_tasks == 30 and p.level == 0.95
    # the table changes the defaults key by key (a partial table used to drop the safety gate)
    assert set(p.metrics) == set(GatePolicy().metrics) | {"pass^2", "pass@1"} and p.metrics["pass^2"].higher_is_better
    q = load_gate_policy(_write(tmp_path, "metrics:\n  S_comp: null\n"))
    assert "S_comp" not in q.metrics and "success_rate" in q.metrics


def test_policy_relative_to_a_base_changes_only_what_it_names(tmp_path: Path) -> None:
    """A request policy is read relative to the sidecar's configured one (not the defaults):
    keys not given keep the base's values, `metrics` changes the base's table key by key."""
    base = parse_gate_policy({"min_tasks": 10, "block_on_critical": False, "metrics": {"S_comp": None}})
    p = load_gate_policy(_write(tmp_path, "level: 0.9\nmetrics:\n  C_out: null\n  pass^2: {max_regression: 0.2}\n"),
                         base=base)
    assert (p.min_tasks, p.block_on_critical, p.level, p.block_on_committed_forbidden) == (10, False, 0.9, True)
    assert set(p.metrics) == {"success_rate", "pass^3", "R_Rob", "R_fault", "R_env", "R_prompt", "pass^2"}
    assert p.metrics["pass^2"] == MetricBound(max_regression=0.2)  # set whole: required defaults to true
    assert parse_gate_policy(None, base=base) == base == parse_gate_policy({}, base=base)
    # removing a metric the base does not have is no error; a bad field still names it
    assert parse_gate_policy({"metrics": {"S_comp": None}}, base=base) == base
    with pytest.raises(GatePolicyError, match=r"req: invalid gate policy\nmetrics:"):
        parse_gate_policy({"metrics": ["success_rate"]}, origin="req", base=base)


def test_pass_at_k_and_pass_hat_k_gate_by_hand() -> None:
    pol = GatePolicy(metrics={"pass^2": MetricBound(max_regression=0.05), "pass@2": MetricBound(max_regression=0.05)})
    r = evaluate_gate(side(trials_from_counts("b", [2] * 20)), side(trials_from_counts("c", [4] * 20)), pol)
    # pass^2 = C(c,2)/C(5,2): 1/10 → 6/10; pass@2 = 1 − C(5−c,2)/C(5,2): 1 − 3/10 → 1 − 0
    assert r.deltas["pass^2"].delta == pytest.approx(0.5)
    assert r.deltas["pass@2"].delta == pytest.approx(0.3)
    assert r.verdict == "pass"


def test_a_handful_of_tasks_cannot_block_on_its_interval() -> None:
    """Bug (found by simulation): on one shared task the bootstrap interval has width 0, so two
    equal versions were blocked by chance (~29 %). Below min_tasks_to_block a drop is inconclusive."""
    pol = GatePolicy(metrics={"success_rate": MetricBound(max_regression=0.05)})
    # one task, baseline 4/5, candidate 2/5: Δ = −0.4 with CI [−0.4, −0.4]
    r = evaluate_gate(side(trials_from_counts("b", [4])), side(trials_from_counts("c", [2])), pol)
    assert r.deltas["success_rate"].delta == pytest.approx(-0.4)
    assert r.verdict == "inconclusive" and "min_tasks_to_block" in r.reasons[0].message
    # five tasks, each 5/5 → 0/5: blocks
    r5 = evaluate_gate(side(trials_from_counts("b", [5] * 5)), side(trials_from_counts("c", [0] * 5)), pol)
    assert r5.verdict == "block"


@pytest.mark.parametrize("bad", [{"seed": -1}, {"n_boot": 10**9}, {"min_tasks_to_block": 1}])
def test_policy_bounds_that_used_to_500(bad) -> None:
    with pytest.raises(GatePolicyError, match=next(iter(bad))):
        parse_gate_policy(bad)


def test_reasons_say_one_task_in_the_singular() -> None:
    """Bug: "1 shared tasks", "1 tasks are fewer", "needs ≈1 more shared tasks". One task,
    baseline 4/5, candidate 2/5: Δ = −0.4 below −0.05 on 1 task < min_tasks_to_block = 2, so
    inconclusive needing 2 − 1 = 1 more task."""
    from rich.console import Console

    from relyscope.cli.shadow import render_gate

    pol = GatePolicy(min_tasks_to_block=2, metrics={"success_rate": MetricBound(max_regression=0.05)})
    r = evaluate_gate(side(trials_from_counts("b", [4])), side(trials_from_counts("c", [2])), pol)
    msg = r.reasons[0].message
    assert r.verdict == "inconclusive" and r.deltas["success_rate"].needs_more_tasks == 1
    assert "1 shared task, 5/5 trials" in msg and "1 task is fewer than min_tasks_to_block = 2" in msg, msg
    assert msg.endswith("needs ≈1 more shared task"), msg
    con = Console(record=True, width=400)
    render_gate({**r.to_json(), "agent": "a", "baseline": "b", "candidate": "c", "mode": "shadow"}, con)
    head = con.export_text().splitlines()[0]
    assert head.endswith("INCONCLUSIVE · needs ≈1 more task"), head
    # and the plural stays for other counts
    r5 = evaluate_gate(side(trials_from_counts("b", [4] * 3)), side(trials_from_counts("c", [2] * 3)),
                       GatePolicy(min_tasks_to_block=5, metrics={"success_rate": MetricBound(max_regression=0.05)}))
    assert "3 shared tasks" in r5.reasons[0].message and "needs ≈2 more shared tasks" in r5.reasons[0].message


def test_needs_more_tasks_is_none_when_delta_is_on_the_bound_up_to_float_rounding() -> None:
    # Bug: pass^3 candidate 0.6 − baseline 0.7 is -0.09999999999999998 in floating point, not -0.1, so
    # g = |Δ − bound| ≈ 2.8e-17 and the gate printed "needs ≈145702207765008079909485237239808 more
    # shared tasks" for a Δ that sits on the bound (docstring: None, no sample size decides it).
    delta = 0.6 - 0.7
    assert delta != -0.1 and abs(delta + 0.1) < 1e-15
    assert needs_more_tasks_estimate(21, delta, (-0.326, 0.114), -0.1, min_tasks=20) is None
    # a Δ 0.001 below the bound is a real (large) estimate: h = hi − Δ = 0.215, g = 0.001
    # → 21·215² = 970 725 needed, 970 704 more
    assert needs_more_tasks_estimate(21, -0.101, (-0.326, 0.114), -0.1) == 970_725 - 21


def test_a_verdict_comes_back_from_its_json_as_it_was_published() -> None:
    """What the store keeps of a published verdict (``to_json``) gives the same result back: the
    block with its hand-computed Δ (test above), NaN deltas (not measured) and None intervals."""
    import json
    import math

    from relyscope.scorers.gate import GateResult, policy_digest

    cand = [max(c - 3, 0) for c in BASE_COUNTS]
    for r in (evaluate_gate(side(trials_from_counts("b", BASE_COUNTS)), side(trials_from_counts("c", cand)), GatePolicy()),
              evaluate_gate(side(trials_from_counts("b", [1, 2, 3, 4, 2])), side(trials_from_counts("c", [2, 3, 3, 5, 3])),
                            GatePolicy())):
        back = GateResult.from_json(json.loads(json.dumps(r.to_json(), allow_nan=False)))
        assert back.to_json() == r.to_json()
        assert (back.verdict, back.exit_code, back.needs_more_tasks) == (r.verdict, r.exit_code, r.needs_more_tasks)
        for k, d in r.deltas.items():
            b = back.deltas[k]
            for x, y in ((d.delta, b.delta), (d.baseline, b.baseline), (d.bound, b.bound)):
                assert (math.isnan(x) and math.isnan(y)) or x == y, k
    sr = next(x for x in back.reasons if x.name == "success_rate")
    assert sr.verdict == "inconclusive" and sr.needs_more_tasks == 15
    assert policy_digest(GatePolicy()) == policy_digest(GatePolicy())
    assert policy_digest(GatePolicy(min_tasks=21)) != policy_digest(GatePolicy())


def test_repeated_trial_metrics_say_when_trials_per_task_are_short() -> None:
    """21 shared tasks, only 4 of them with >= 3 nominal trials per side (the rest 2, as with
    RELYSCOPE_SHADOW_K=2): pass^3 and C_out are judged on 4 tasks. Their reason asked for ≈84
    more shared tasks only — the tasks already there lack trials, which more tasks do not fix."""
    def trials(s: str) -> list[Trial]:
        return [trial(s, t, i, i % 2 == 0) for t in range(21) for i in range(5 if t < 4 else 2)]

    r = evaluate_gate(side(trials("b")), side(trials("c")), GatePolicy())
    for key in ("pass^3", "C_out"):
        x = next(x for x in r.reasons if x.name == key)
        assert x.n_tasks == 4, x.message
        assert "17 of 21 shared tasks have fewer than 3 nominal trials of known outcome on a side" in x.message
    sr = next((x for x in r.reasons if x.name == "success_rate"), None)
    assert sr is None or "trials per task" not in sr.message  # success_rate uses every trial


def test_no_overall_task_estimate_when_more_tasks_cannot_decide() -> None:
    """The equal candidate of 5 tasks without a safety policy printed "INCONCLUSIVE · needs ≈15
    more tasks": success_rate wanted min_tasks, but the hard gates were not measured (no safety
    policy), which no number of tasks decides (fresh user round 2). The per-metric estimate stays."""
    base, cand = [1, 2, 3, 4, 2], [2, 3, 3, 5, 3]
    unmeasured = {"severities": None, "critical": None, "committed_forbidden": None}
    r = evaluate_gate(GateSide(trials_from_counts("b", base), label="b", **unmeasured),
                      GateSide(trials_from_counts("c", cand), label="c", **unmeasured), GatePolicy())
    assert r.verdict == "inconclusive"
    assert any(x.kind == "hard_gate" and x.verdict == "inconclusive" for x in r.reasons), r.reasons
    assert next(x for x in r.reasons if x.name == "success_rate").needs_more_tasks == 15
    assert r.needs_more_tasks is None
