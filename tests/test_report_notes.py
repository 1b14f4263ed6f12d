"""Report notes for metrics shown as "—", the worst-task drill-down ids and the empty-report hint.

Hand-built trials; every expected value is worked out by hand in the comments.
"""

from __future__ import annotations

from rich.console import Console

from relyscope.cli.render import render_report
from relyscope.exporter.report import build_report
from relyscope.model import Op, Step, Trial
from relyscope.scorers.review import score_all


def _trial(i: int, task: str, outcome: str, conf: float | None, agent: str = "a") -> Trial:
    return Trial(
        trial_id=f"t{i}", trace_id=f"{i + 1:032x}", root_span_id="0" * 16, task_id=task, task_id_source="attribute",
        agent_name=agent, agent_version="1", run_kind="production", outcome=outcome, outcome_source=None,
        outcome_score=None, claimed_success=None, confidence=conf, conversation_id=None, start_ns=0,
        end_ns=1_000_000_000, task_input=None,
        steps=(Step(span_id=f"{i + 1:016x}", parent_span_id="", action="llm", op=Op.LLM, name="llm",
                    start_ns=0, end_ns=1),))


def _groups(trials) -> dict:
    scores, extras = score_all(trials, None, n_boot=0)
    return {g["agent"]: g for g in build_report(scores, extras)["groups"]}


def _text(rep: dict) -> str:
    c = Console(record=True, width=250)
    render_report(rep, c)
    return " ".join(c.export_text().split())


def test_constant_confidence_auroc_is_one_half_by_ties_and_says_so():
    # 2 successes, 2 failures, all q = 0.8: each of the 2·2 (success, failure) pairs ties → ½ each,
    # AUROC = (4 · ½) / 4 = 0.5 (metrics.md §5: ties counted ½; defined, both classes present)
    g = _groups([_trial(0, "x", "success", 0.8), _trial(1, "x", "failure", 0.8),
                 _trial(2, "y", "success", 0.8), _trial(3, "y", "failure", 0.8)])["a"]
    assert g["metrics"]["P_AUROC"]["value"] == 0.5
    assert any("every confidence is 0.8" in n and "metrics.md §5" in n for n in g["notes"])
    assert "confidence_values" not in g


def test_dashes_say_why_safety_predictability_robustness_are_undefined():
    g = _groups([_trial(0, "x", "success", None), _trial(1, "x", "failure", None)])["a"]
    notes = " | ".join(g["notes"])
    assert "S_comp, S_harm, R_Saf undefined: no safety policy applies to agent 'a'" in notes
    assert "RELYSCOPE_POLICY_FILE" in notes
    assert "P_cal, P_AUROC, P_brier, R_Pred undefined: no trial with a known outcome records a confidence" in notes
    assert "R_fault, R_env, R_prompt, R_Rob undefined: no perturbed (shadow) replays" in notes


def test_one_outcome_class_leaves_auroc_undefined_with_the_reason():
    # both successes: P_brier = 1 − mean((0.9−1)², (0.6−1)²) = 1 − (0.01 + 0.16)/2 = 0.915; AUROC undefined
    g = _groups([_trial(0, "x", "success", 0.9), _trial(1, "x", "success", 0.6)])["a"]
    assert abs(g["metrics"]["P_brier"]["value"] - 0.915) < 1e-9
    assert g["metrics"]["P_AUROC"]["value"] is None
    assert any(n.startswith("P_AUROC undefined: every trial with a confidence has the same outcome") for n in g["notes"])


def test_worst_task_lists_its_failing_traces_in_full_and_counts_the_others():
    # task z: 12 trials, trials 0, 4, 8 fail → 3 failing; the table shows the first failing trace id
    # (trial 0: 0…01, 32 hex) and "+2 other failing"
    trials = [_trial(i, "z", "failure" if i % 4 == 0 else "success", None) for i in range(12)]
    g = _groups(trials)["a"]
    (w,) = g["worst_tasks"]
    assert w["trials"] == 12 and w["failing_trials"] == 3
    assert w["trace_ids"] == [f"{1:032x}", f"{5:032x}", f"{9:032x}"]
    out = _text(build_report(*score_all(trials, None, n_boot=0)))
    assert f"{1:032x} (+2 other failing)" in out
    assert "(+10)" not in out and "(+3)" not in out


def test_empty_report_says_when_trials_finalize():
    out = _text({"formula_set": "relyscope-v1", "groups": [], "window": "all",
                 "finalize": {"grace_period_s": 5.0, "score_interval_s": 10.0}})
    assert "no finalized trials yet" in out
    assert "RELYSCOPE_GRACE_PERIOD_S=5 s after their root span ends" in out
    assert "RELYSCOPE_SCORE_INTERVAL_S=10 s" in out and "POST /api/v1/flush" in out


def test_an_empty_report_before_the_first_scoring_cycle_says_so_not_that_no_trial_exists():
    """A fresh-user run: right after a restart on a store with 984 finalized trials the report
    said "no finalized trials yet" and suggested a flush; the sidecar had not scored yet."""
    out = _text({"formula_set": "relyscope-v1", "groups": [], "window": "all",
                 "finalize": {"grace_period_s": 5.0, "score_interval_s": 10.0, "scoring_cycles": 0}})
    assert "no finalized trials yet" not in out and "flush" not in out
    assert "has not finished its first scoring cycle" in out
    out = _text({"formula_set": "relyscope-v1", "groups": [], "window": "all",
                 "finalize": {"grace_period_s": 5.0, "score_interval_s": 10.0, "scoring_cycles": 3}})
    assert "no finalized trials yet" in out


def _replay(i: int, task: str, outcome: str, family: str) -> Trial:
    t = _trial(i, task, outcome, None)
    return Trial(**{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "run_kind": "shadow",
                    "perturbation_family": family, "shadow_of": "p0"})


def test_replays_without_prompt_family_say_why_not_configure_shadow():
    # a shadow group whose replays have nominal, fault and env runs but no prompt run (as when the
    # rule rewriter leaves a short input unchanged and plan_replays drops every rewrite):
    # task x nominal: success, success → Acc_nom = 1; fault: success, failure → Acc_fault = 0.5,
    # R_fault = min(0.5/1, 1) = 0.5; env: success, success → R_env = 1; R_prompt undefined.
    # The old note told the user to "configure shadow replays" — which they had done.
    trials = [_replay(0, "x", "success", "nominal"), _replay(1, "x", "success", "nominal"),
              _replay(2, "x", "success", "fault"), _replay(3, "x", "failure", "fault"),
              _replay(4, "x", "success", "env"), _replay(5, "x", "success", "env")]
    g = _groups(trials)["a"]
    assert g["run_kind"] == "shadow"
    assert abs(g["metrics"]["R_fault"]["value"] - 0.5) < 1e-9
    assert g["metrics"]["R_env"]["value"] == 1.0
    assert g["metrics"]["R_prompt"]["value"] is None
    (note,) = [n for n in g["notes"] if "R_prompt" in n]
    assert note.startswith("R_prompt undefined: these replays have no prompt-perturbed run with a known outcome")
    assert "RELYSCOPE_SHADOW_FAMILIES" in note and "left the input unchanged" in note
    assert "RELYSCOPE_SHADOW_PROMPT_STRENGTH" in note
    assert "configure shadow replays" not in note


def test_production_group_points_at_the_shadow_group_for_robustness():
    # production runs are never perturbed: R_x there is always undefined, even with replays running;
    # the note must say where robustness is reported instead of only "configure shadow replays"
    g = _groups([_trial(0, "x", "success", None), _trial(1, "x", "failure", None)])["a"]
    (note,) = [n for n in g["notes"] if "R_prompt" in n]
    assert "[shadow] group" in note


def test_unknown_replay_outcomes_explain_shadow_grading_not_production_outcomes():
    """A shadow group with 88 of 192 replays unknown said to set relyscope.outcome or POST
    /api/v1/outcomes — advice for production runs. A replay is graded against the production run it
    replays; the note says so. A production group keeps the production advice."""
    from relyscope.scorers.review import HOW_REPLAYS_GET_OUTCOMES, HOW_TO_GIVE_OUTCOMES, group_notes

    def t(i: int, outcome: str, family: str | None) -> Trial:
        return Trial(trial_id=f"t{i}", trace_id=f"{i:032x}", root_span_id="r", task_id=f"task-{i % 2}",
                     task_id_source="attribute", agent_name="a", agent_version="1", run_kind="shadow",
                     outcome=outcome, outcome_source=None, outcome_score=None, claimed_success=None,
                     confidence=None, conversation_id=None, start_ns=0, end_ns=1, steps=(),
                     perturbation_family=family)

    replays = [t(0, "success", "nominal"), t(1, "unknown", "nominal"), t(2, "unknown", "fault")]
    [note] = group_notes(replays)
    assert note.startswith("2 of 3 replays have an unknown outcome") and HOW_REPLAYS_GET_OUTCOMES in note
    assert "POST /api/v1/outcomes" not in note
    prod = [t(0, "success", None), t(1, "unknown", None), t(2, "unknown", None)]
    [note] = group_notes(prod)
    assert note.startswith("2 of 3 trials have an unknown outcome") and HOW_TO_GIVE_OUTCOMES in note
