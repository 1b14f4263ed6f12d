"""Issue 12: the report, /metrics and the CLI tell the truth about missing data.

Pure tests of the report sections (hand-built trials, values worked out by hand), then one sidecar
(stopped before the CLI reads its store directly) for the CLI and /metrics.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from relyscope.model import Step, Op, Trial
from relyscope.scorers.review import review_group, score_reviewed
from relyscope.testing import RELYSCOPE_BIN, start_sidecar


def _trial(i: int, task: str, outcome: str, *, source: str = "attribute", text: str | None = None) -> Trial:
    return Trial(
        trial_id=f"t{i}", trace_id=f"{i:032x}", root_span_id="0" * 16, task_id=task, task_id_source=source,
        agent_name="a", agent_version="1", run_kind="production", outcome=outcome, outcome_source=None,
        outcome_score=None, claimed_success=None, confidence=None, conversation_id=None, start_ns=0,
        end_ns=1_000_000_000, task_input=text,
        steps=(Step(span_id=f"{i:016x}", parent_span_id="", action="llm", op=Op.LLM, name="llm",
                    start_ns=0, end_ns=1),))


def test_worst_tasks_include_a_task_that_always_fails():
    # A fails 3/3 (C_out = (2·0 − 1)² = 1: perfectly consistent, and the worst task);
    # B 1/3 (C_out = (2/3 − 1)² = 1/9); C succeeds 3/3 (not a worst task)
    trials = ([_trial(i, "A", "failure") for i in range(3)] + [_trial(3, "B", "success")]
              + [_trial(i, "B", "failure") for i in (4, 5)] + [_trial(i, "C", "success") for i in (6, 7, 8)])
    worst = review_group(trials).extras["worst_tasks"]
    assert [w["task_id"] for w in worst] == ["A", "B"]
    assert worst[0]["success_rate"] == 0.0 and worst[0]["C_out"] == 1.0
    assert worst[1]["success_rate"] == pytest.approx(1 / 3) and worst[1]["C_out"] == pytest.approx(1 / 9)


def test_a_fingerprinted_worst_task_shows_an_excerpt_of_its_input():
    text = "  Refund   order 1234:\n the parcel arrived damaged and the box was open on arrival, twice "
    worst = review_group([_trial(0, "ab" * 32, "failure", source="fingerprint", text=text),
                          _trial(1, "named", "failure", text="ignored: the id is readable")]).extras["worst_tasks"]
    labels = {w["task_id"]: w["label"] for w in worst}
    # whitespace collapsed, cut to 59 characters + "…"
    assert labels == {"ab" * 32: "Refund order 1234: the parcel arrived damaged and the box w…", "named": None}


def test_unknown_outcomes_are_counted_and_a_group_without_outcomes_says_how_to_give_them():
    rv = review_group([_trial(0, "A", "success"), _trial(1, "A", "unknown"), _trial(2, "B", "failure")])
    assert rv.extras["outcomes"] == {"success": 1, "failure": 1, "unknown": 1}
    assert any("1 of 3 trials have an unknown outcome" in n for n in rv.extras["notes"])
    rv = review_group([_trial(0, "A", "unknown"), _trial(1, "A", "unknown")])
    assert rv.extras["outcomes"] == {"success": 0, "failure": 0, "unknown": 2}
    [note] = rv.extras["notes"]
    assert note.startswith("no outcomes") and "/api/v1/outcomes" in note and "relyscope.outcome" in note


def test_every_trial_its_own_task_is_warned_about():
    trials = [_trial(i, f"fp{i}", "success", source="fingerprint") for i in range(3)]
    notes = review_group(trials).extras["notes"]
    assert any(n.startswith("every trial is its own task (task ids from: fingerprint)") for n in notes)
    # two trials of one task: no warning
    assert not any("own task" in n for n in review_group(trials + [_trial(9, "fp0", "success")]).extras["notes"])


def test_pass_hat_k_rising_with_k_carries_the_reason():
    # A: 1 trial, failure; B: 2 trials, both success.
    # pass^1 = mean(0/1, (2/2)) = 0.5 over 2 tasks; pass^2 over tasks with n ≥ 2 (B only) = 1.0
    # (the note is added where every report is built, batch and live: build_report)
    trials = [_trial(0, "A", "failure"), _trial(1, "B", "success"), _trial(2, "B", "success")]
    gs, rv = score_reviewed(trials, n_boot=0)
    assert gs.metrics["pass^1"].value == 0.5 and gs.metrics["pass^2"].value == 1.0
    [note] = [n for n in _report_notes(gs, rv) if n.startswith("pass^2")]
    assert "1 tasks with at least 2 known trials" in note and "pass^1 over 2" in note
    # no rise, no note: B 2/2 and A 2/2
    gs, rv = score_reviewed(trials[1:] + [_trial(3, "A", "success"), _trial(4, "A", "success")], n_boot=0)
    assert not [n for n in _report_notes(gs, rv) if n.startswith("pass^")]


def _report_notes(gs, rv) -> list[str]:
    from relyscope.exporter.report import build_report

    key = ("a", "1", "production")
    return build_report({key: gs}, {key: rv.extras})["groups"][0].get("notes", [])


# ---- over the wire: one sidecar, then the CLI on its stopped store ------------------------------

TOKEN = "right-token"


def _root(i: int, agent: str, text: str, outcome: str | None) -> dict:
    attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
             {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
             {"key": "gen_ai.input.messages", "value": {"stringValue": json.dumps(
                 [{"role": "user", "parts": [{"type": "text", "content": text}]}])}}]
    if outcome:
        attrs.append({"key": "relyscope.outcome", "value": {"stringValue": outcome}})
    t0 = 1_760_000_000_000_000_000 + i * 10_000_000_000
    return {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": f"invoke_agent {agent}", "kind": 1,
            "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 10**9), "attributes": attrs}


LONG = "Please refund   order 1234 because the parcel arrived damaged and the box was open on arrival"


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A sidecar whose store is ``<dir>/.relyscope/data``; yields (dir, /metrics text, sidecar)
    while running via the ``running`` attribute, and is stopped before the CLI tests read the store."""
    d = tmp_path_factory.mktemp("cwd")
    sc = start_sidecar(d, extra_env={"RELYSCOPE_STORE": f"chdb://{d}/.relyscope/data",
                                     "RELYSCOPE_AUTH_TOKEN": TOKEN})
    try:
        spans = [_root(0, "no-outcome", "hello there", None), _root(1, "no-outcome", "hello there", None),
                 _root(2, "fp-agent", LONG, "failure"), _root(3, "fp-agent", "track my parcel", "success")]
        body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert httpx.post(sc.otlp_http + "/v1/traces", json=body, headers=auth, timeout=30).status_code == 200
        assert sc.post("/api/v1/flush", headers=auth).status_code == 200
        metrics = sc.get("/metrics", headers=auth).text
        wrong = subprocess.run([str(RELYSCOPE_BIN), "report", "--api", sc.api, "--token", "WRONG"],
                               capture_output=True, text=True, timeout=60)
        wrong_history = subprocess.run([str(RELYSCOPE_BIN), "history", "pass^1", "--api", sc.api,
                                        "--token", "WRONG"], capture_output=True, text=True, timeout=60)
        missing = subprocess.run([str(RELYSCOPE_BIN), "report", "--api", sc.api], capture_output=True,
                                 text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                             if k != "RELYSCOPE_AUTH_TOKEN"})
    finally:
        sc.kill()
    return d, metrics, (wrong, wrong_history), missing


def test_metrics_count_trials_by_outcome_including_unknown(stopped):
    _, metrics, _, _ = stopped
    line = 'relyscope_group_outcome_trials{agent="no-outcome",outcome="unknown",run_kind="production",version="unknown"} 2.0'
    assert line in metrics
    assert 'relyscope_group_outcome_trials{agent="fp-agent",outcome="failure",run_kind="production",version="unknown"} 1.0' in metrics


def test_report_says_a_wrong_token_was_refused(stopped):
    _, _, (wrong, wrong_history), missing = stopped
    assert wrong.returncode == 2 and "refused the token" in wrong.stderr, wrong.stderr
    assert wrong_history.returncode == 2 and "refused the token" in wrong_history.stderr, wrong_history.stderr
    assert missing.returncode == 2 and "requires a bearer token" in missing.stderr, missing.stderr


def _cli_report(d, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env["COLUMNS"] = "250"
    return subprocess.run([str(RELYSCOPE_BIN), "report", "--api", "http://127.0.0.1:9", "--n-boot", "0", *args],
                          capture_output=True, text=True, timeout=120, cwd=d, env=env)


def test_report_reads_the_default_store_relative_to_the_current_directory(stopped):
    d = stopped[0]
    r = _cli_report(d, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert f"reading chdb://{d}/.relyscope/data" in r.stderr
    groups = {g["agent"]: g for g in json.loads(r.stdout)["groups"]}
    assert set(groups) == {"no-outcome", "fp-agent"}
    assert groups["no-outcome"]["outcomes"] == {"success": 0, "failure": 0, "unknown": 2}


def test_report_table_shows_the_missing_data_notes_and_an_input_excerpt(stopped):
    r = _cli_report(stopped[0])
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "note: no outcomes: none of the 2 trials has a known outcome" in out
    assert "POST /api/v1/outcomes" in out
    assert "metrics undefined without outcomes not shown" in out
    # fp-agent: two fingerprinted tasks, one trial each → the every-trial-its-own-task warning
    assert "every trial is its own task (task ids from: fingerprint)" in out
    # the failing task is listed by the excerpt of its input (whitespace collapsed, cut at 60), not a hash
    excerpt = " ".join(LONG.split())[:59].rstrip() + "…"
    assert excerpt in out
