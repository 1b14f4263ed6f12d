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


def test_empty_report_says_when_trials_finalize():
    out = _text({"formula_set": "relyscope-v1", "groups": [], "window": "all",
                 "finalize": {"grace_period_s": 5.0, "score_interval_s": 10.0}})
    assert "no finalized trials yet" in out
    assert "RELYSCOPE_GRACE_PERIOD_S=5 s after their root span ends" in out
    assert "RELYSCOPE_SCORE_INTERVAL_S=10 s" in out and "POST /api/v1/flush" in out
