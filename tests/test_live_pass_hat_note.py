"""The note that pass^k rises with k (the mean covers fewer tasks at larger k, metrics.md §2) is
shown by the live (incremental) scorer's report as by the batch one — one function,
:func:`relyscope.scorers.review.pass_hat_k_notes`, applied where every report is built.

Three trials, worked out by hand: task a once, a failure; task b twice, both successes.
pass^1 = mean(0/1, 2/2) = 0.5 over 2 tasks; pass^2 = C(2,2)/C(2,2) = 1 over task b only (a has
n = 1 < 2). pass^2 > pass^1, although no single task's pass^k ever rises with k.
"""

from __future__ import annotations

import time

import httpx

from relyscope.exporter.report import build_report
from relyscope.model import Op, Step, Trial
from relyscope.scorers.review import score_all
from relyscope.testing import start_sidecar

NOTE = ("pass^2 (1.000) > pass^1 (0.500): pass^2 averages over the 1 tasks with at least 2 known trials, "
        "pass^1 over 2; compare pass^k only over tasks with n ≥ k")
RUNS = [("a", "failure"), ("b", "success"), ("b", "success")]


def _root(i: int, task: str, outcome: str, now_ns: int) -> dict:
    t0 = now_ns - 3 * 10**9 + i * 10**6
    return {"traceId": f"{i + 950:032x}", "spanId": f"{i + 950:016x}", "name": "invoke_agent hat", "kind": 1,
            "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 10**8),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "gen_ai.agent.name", "value": {"stringValue": "hat"}},
                           {"key": "relyscope.task.id", "value": {"stringValue": task}},
                           {"key": "relyscope.outcome", "value": {"stringValue": outcome}}]}


def test_live_report_notes_pass_hat_k_rising(tmp_path):
    sc = start_sidecar(tmp_path)  # incremental scoring: the default
    try:
        now = time.time_ns()
        body = {"resourceSpans": [{"scopeSpans": [{"spans": [_root(i, *r, now) for i, r in enumerate(RUNS)]}]}]}
        assert httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
        sc.flush()
        for window in ("all", "5m"):
            r = sc.get("/api/v1/report", params={"window": window})
            assert r.status_code == 200, r.text
            (g,) = r.json()["groups"]
            assert g["metrics"]["pass^1"]["value"] == 0.5 and g["metrics"]["pass^2"]["value"] == 1.0
            assert g["notes"].count(NOTE) == 1, (window, g["notes"])
    finally:
        sc.kill()


def _trial(i: int, task: str, outcome: str) -> Trial:
    return Trial(
        trial_id=f"t{i}", trace_id=f"{i + 1:032x}", root_span_id="0" * 16, task_id=task, task_id_source="attribute",
        agent_name="hat", agent_version="1", run_kind="production", outcome=outcome, outcome_source=None,
        outcome_score=None, claimed_success=None, confidence=None, conversation_id=None, start_ns=0,
        end_ns=1_000_000_000, task_input=None,
        steps=(Step(span_id=f"{i + 1:016x}", parent_span_id="", action="llm", op=Op.LLM, name="llm",
                    start_ns=0, end_ns=1),))


def test_batch_report_notes_it_once():
    scores, extras = score_all([_trial(i, *r) for i, r in enumerate(RUNS)], None, n_boot=0)
    (g,) = build_report(scores, extras)["groups"]
    assert g["notes"].count(NOTE) == 1, g["notes"]
