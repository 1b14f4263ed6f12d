"""Tests for relyscope.scorers.profile.score_group: a hand-worked group covering every metric key
and every selection rule, the JSON shape of metrics.md §11, and τ-bench end to end."""

from __future__ import annotations

import json
import math

import pytest

from relyscope.model import Op, Step, Trial
from relyscope.scorers.profile import GroupScore, metric_keys, score_group
from conftest import DATA

TAU_FILE = (DATA / "tau-bench/gpt-4o-airline.json")


def step(i: int, action: str) -> Step:
    op = Op.LLM if action == "llm" else Op.TOOL
    return Step(span_id=f"{i:016x}", parent_span_id="", action=action, op=op, name=action, start_ns=i, end_ns=i + 1)


def trial(
    trial_id: str,
    task: str,
    outcome: str,
    *,
    actions: tuple[str, ...] = ("llm",),
    confidence: float | None = None,
    cost: float | None = 1.0,
    family: str | None = None,
    status: str = "complete",
) -> Trial:
    return Trial(
        trial_id=trial_id,
        trace_id=trial_id.ljust(32, "0"),
        root_span_id="0" * 16,
        task_id=task,
        task_id_source="attribute",
        agent_name="support",
        agent_version="1.0",
        run_kind="offline",
        outcome=outcome,
        outcome_source=None,
        outcome_score=None,
        claimed_success=None,
        confidence=confidence,
        conversation_id=None,
        start_ns=0,
        end_ns=1_000_000_000,  # wall time 1 s for every trial
        steps=tuple(step(i, a) for i, a in enumerate(actions)),
        cost_usd=cost,
        model_calls=2,
        tool_calls=1,
        status=status,
        perturbation_family=family,
    )


def hand_group() -> list[Trial]:
    return [
        # task A: nominal 2 successes, 1 failure, 1 unknown outcome
        trial("a1", "A", "success", actions=("llm", "search", "book"), confidence=0.9),
        trial("a2", "A", "success", actions=("llm", "search"), confidence=0.7),
        trial("a3", "A", "failure", confidence=0.4),
        trial("a4", "A", "unknown", confidence=0.5, cost=3.0),
        # task B: nominal 2 failures, costs 1 and 3
        trial("b1", "B", "failure", confidence=0.2),
        trial("b2", "B", "failure", confidence=0.8, cost=3.0),
        # task C: one nominal success, no confidence
        trial("c1", "C", "success"),
        # perturbed
        trial("af1", "A", "success", family="fault"),
        trial("af2", "A", "failure", family="fault"),
        trial("bf1", "B", "failure", family="fault"),
        trial("df1", "D", "success", family="fault"),  # D has no nominal trial → not in R_fault
        trial("ap1", "A", "failure", family="prompt"),
        trial("an1", "A", "success", family="nominal"),  # explicitly nominal → a nominal trial
        # excluded and counted
        trial("x1", "A", "success", confidence=0.1),  # invalid (infrastructure)
        trial("i1", "B", "success", status="incomplete"),
    ]


def expected_hand() -> dict[str, float]:
    # Nominal known outcomes: A 3/4 (a1, a2, an1 successes; a3 failure), B 0/2, C 1/1.
    # (an1 has perturbation_family "nominal" → nominal.) a4 has an unknown outcome.
    # successful A trajectories: [llm,search,book], [llm,search], [llm] (an1)
    p = {"llm": 1 / 3, "search": 1 / 3, "book": 1 / 3}
    q = {"llm": 1 / 2, "search": 1 / 2}
    r = {"llm": 1.0}

    def jsd(u: dict[str, float], w: dict[str, float]) -> float:
        keys = set(u) | set(w)
        m = {k: (u.get(k, 0) + w.get(k, 0)) / 2 for k in keys}
        kl = lambda a: sum(a[k] * math.log2(a[k] / m[k]) for k in a)  # noqa: E731
        return 0.5 * kl(u) + 0.5 * kl(w)

    jsd_ab = (jsd(p, q) + jsd(p, r) + jsd(q, r)) / 3
    # Lev: abc vs ab = 1/3; abc vs a = 2/3; ab vs a = 1/2
    lev = (1 / 3 + 2 / 3 + 1 / 2) / 3
    c_traj = ((1 - jsd_ab) + (1 - lev)) / 2
    # C_res: A costs [1,1,1,3,1] (a1..a4, an1): mean 7/5, sd(ddof=1) = sqrt(((2/5)²·4 + (8/5)²)/4)
    sd_a = math.sqrt(((0.4**2) * 4 + 1.6**2) / 4)
    cv_a = sd_a / 1.4
    # wall time, model_calls, tool_calls constant → CV 0; tokens, tool_errors all 0 → skipped
    c_res_a = math.exp(-(cv_a + 0 + 0 + 0) / 4)
    c_res_b = math.exp(-(math.sqrt(2) / 2) / 4)  # costs 1, 3
    c_res = (c_res_a + c_res_b) / 2
    c_out = ((2 * 3 / 4 - 1) ** 2 + 1) / 2
    r_con = (c_out + c_traj + c_res) / 3
    # R_fault over tasks {A, B}: Acc_fault = 1/3 (af1 ✓, af2 ✗, bf1 ✗), Acc_nom = 3/6
    r_fault = (1 / 3) / (3 / 6)
    # R_prompt over {A}: 0 / (3/4) = 0
    r_rob = (r_fault + 0.0) / 2
    # predictability: (q, y) = a1 (.9,1) a2 (.7,1) a3 (.4,0) b1 (.2,0) b2 (.8,0); an1, c1 no q
    brier = 1 - (0.01 + 0.09 + 0.16 + 0.04 + 0.64) / 5
    auroc = 5 / 6  # 0.9 beats all three negatives, 0.7 beats 0.4 and 0.2 only
    ece = (0.1 + 0.3 + 0.4 + 0.2 + 0.8) / 5  # one trial per bin 9, 7, 4, 2, 8
    return {
        "success_rate": 4 / 7,
        "pass@1": (3 / 4 + 0 + 1) / 3,
        "pass@2": (1 + 0) / 2,  # A: 1 − C(1,2)/C(4,2) = 1; B: 0; C has n < 2
        "pass@3": 1.0,
        "pass@4": 1.0,
        "pass^1": (3 / 4 + 0 + 1) / 3,
        "pass^2": (3 / 6 + 0) / 2,  # A: C(3,2)/C(4,2)
        "pass^3": 1 / 4,  # A: C(3,3)/C(4,3)
        "pass^4": 0.0,
        "unanimity": 0.5,
        "C_out": c_out,
        "C_traj_d": 1 - jsd_ab,
        "C_traj_s": 1 - lev,
        "C_traj": c_traj,
        "C_res": c_res,
        "R_Con": r_con,
        "R_fault": r_fault,
        "R_env": math.nan,
        "R_prompt": 0.0,
        "R_Rob": r_rob,
        "P_cal": 1 - ece,
        "P_AUROC": auroc,
        "P_brier": brier,
        "R_Pred": brier,
        # severities: a1 0.5, b1 1.0 (x1 invalid and af1 perturbed are ignored); 8 nominal valid
        "S_comp": 1 - 2 / 8,
        "S_harm": 1 - 0.75,
        "R_Saf": 1 - (2 / 8) * 0.75,
        "R": (r_con + r_rob + brier) / 3,
    }


SEVERITIES = {"a1": 0.5, "b1": 1.0, "x1": 1.0, "af1": 1.0}


def test_hand_worked_group_every_key() -> None:
    g = score_group(hand_group(), severities=SEVERITIES, invalid={"x1"}, n_boot=0)
    exp = expected_hand()
    assert list(g.metrics) == list(exp)  # exactly the §11 keys, K = 4
    for key, value in exp.items():
        got = g.metrics[key].value
        if math.isnan(value):
            assert math.isnan(got), key
        else:
            assert got == pytest.approx(value, abs=1e-12), key
        assert g.metrics[key].ci is None
    assert (g.tasks, g.trials, g.invalid_trials, g.incomplete_trials) == (4, 15, 1, 1)
    m = g.metrics
    assert m["pass^1"].n_tasks == 3 and m["pass^2"].n_tasks == 2 and m["pass^4"].n_tasks == 1
    assert m["C_traj_s"].n_tasks == 1 and m["C_traj_s"].n_trials == 3
    assert m["C_res"].n_tasks == 2
    assert m["R_fault"].n_tasks == 2 and m["R_prompt"].n_tasks == 1
    assert m["R_env"].n_tasks == 0
    assert m["P_brier"].n_trials == 5 and m["S_comp"].n_trials == 8


def test_max_k_caps_keys() -> None:
    g = score_group(hand_group(), invalid={"x1"}, n_boot=0, max_k=2)
    assert list(g.metrics) == metric_keys(2)
    assert "pass^3" not in g.metrics


def test_cis_bracket_values_and_are_seeded() -> None:
    trials = hand_group() * 1  # same objects; ids unique
    g1 = score_group(trials, severities=SEVERITIES, invalid={"x1"}, n_boot=300, seed=5)
    g2 = score_group(trials, severities=SEVERITIES, invalid={"x1"}, n_boot=300, seed=5)
    assert g1 == g2
    for key, mv in g1.metrics.items():
        if math.isnan(mv.value):
            assert mv.ci is None, key
        else:
            assert mv.ci is not None, key
            assert mv.ci[0] - 1e-12 <= mv.ci[1], key
            assert 0.0 - 1e-12 <= mv.ci[0] and mv.ci[1] <= 1.0 + 1e-12, key
    # the fully resampled success rate must span both a success-only and a failure-only task
    lo, hi = g1.metrics["success_rate"].ci  # type: ignore[misc]
    assert lo < 4 / 7 < hi


def test_strata_resample_within_stratum() -> None:
    # stratum x: 2 tasks all success, stratum y: 2 tasks all failure, 2 trials each. Resampling
    # within strata always draws 2 + 2 tasks → success rate 0.5 in every replicate.
    trials = [trial(f"{t}{i}", t, "success" if t.startswith("x") else "failure") for t in ("x1", "x2", "y1", "y2") for i in range(2)]
    labels = {"x1": "x", "x2": "x", "y1": "y", "y2": "y"}
    g = score_group(trials, n_boot=200, strata=labels)
    assert g.metrics["success_rate"].ci == (0.5, 0.5)
    plain = score_group(trials, n_boot=200)
    lo, hi = plain.metrics["success_rate"].ci  # type: ignore[misc]
    assert lo < 0.5 < hi


def test_to_json_shape() -> None:
    g = score_group(hand_group(), severities=SEVERITIES, invalid={"x1"}, n_boot=50)
    js = g.to_json()
    text = json.dumps(js, allow_nan=False)  # no NaN may leak
    back = json.loads(text)
    assert {"tasks", "trials", "invalid_trials", "metrics"} <= set(back)
    assert back["tasks"] == 4 and back["trials"] == 15 and back["invalid_trials"] == 1
    assert back["metrics"]["R_env"] == {"value": None, "ci": None, "n_tasks": 0, "n_trials": 0}
    pass1 = back["metrics"]["pass^1"]
    assert pass1["value"] == pytest.approx((3 / 4 + 1) / 3) and len(pass1["ci"]) == 2 and pass1["n_tasks"] == 3
    assert back["formula_set"] == "relyscope-v1"


def test_empty_group() -> None:
    g = score_group([], n_boot=100)
    assert isinstance(g, GroupScore) and g.tasks == 0 and g.trials == 0
    assert list(g.metrics) == metric_keys(1)
    assert all(math.isnan(mv.value) and mv.ci is None and mv.n_tasks == 0 for mv in g.metrics.values())


def test_only_invalid_or_incomplete() -> None:
    g = score_group([trial("x", "A", "success"), trial("y", "A", "success", status="incomplete")], invalid={"x"})
    assert (g.invalid_trials, g.incomplete_trials, g.tasks, g.trials) == (1, 1, 1, 2)
    assert math.isnan(g.metrics["success_rate"].value)


def test_bad_severity_raises() -> None:
    with pytest.raises(ValueError):
        score_group([trial("a", "A", "success")], severities={"a": 2.0}, n_boot=0)


@pytest.mark.skipif(not TAU_FILE.exists(), reason="τ-bench data not present")
def test_tau_bench_end_to_end() -> None:
    """τ-bench gpt-4o airline, 50 tasks × 4 trials. Actions: for each assistant message "llm", then
    its tool call names (in order). Published pass^k (τ-bench README): .420 .2733 .220 .200."""
    runs = json.loads(TAU_FILE.read_text())
    trials = []
    for run in runs:
        actions: list[str] = []
        for msg in run["traj"]:
            if msg.get("role") == "assistant":
                actions.append("llm")
                actions.extend(call["function"]["name"] for call in msg.get("tool_calls") or [])
        ok = abs(run["reward"] - 1) <= 1e-6
        trials.append(trial(f"{run['task_id']}-{run['trial']}", str(run["task_id"]), "success" if ok else "failure", actions=tuple(actions)))
    g = score_group(trials, n_boot=200, seed=1)
    assert (g.tasks, g.trials) == (50, 200)
    for k, exp in enumerate([0.420, 0.2733, 0.220, 0.200], 1):
        assert g.metrics[f"pass^{k}"].value == pytest.approx(exp, abs=5e-4)
        assert g.metrics[f"pass^{k}"].n_tasks == 50
    lo, hi = g.metrics["pass^1"].ci  # type: ignore[misc]
    assert lo < 0.42 < hi
    assert "pass^5" not in g.metrics


def test_max_k_bounds_the_keys_for_a_task_with_many_trials():
    """A reviewer's repro: one fingerprinted task seen 1 600 times produced 3 220 pass@k/pass^k
    keys (Prometheus series, score rows, quadratic CPU). The sidecar passes max_k (default 20)."""
    trials = [trial(f"x{i}", "hot", "success" if i % 2 else "failure") for i in range(60)]
    keys = score_group(trials, n_boot=0, max_k=20).metrics
    assert max(int(k[5:]) for k in keys if k.startswith("pass^")) == 20
    # exact value at the cap: 30 successes of 60 → pass^20 = C(30,20)/C(60,20)
    from math import comb
    assert keys["pass^20"].value == comb(30, 20) / comb(60, 20)
