"""Issue 5: an outcome posted later to the API re-scores the trial and its group (metrics.md §6)."""

from __future__ import annotations


import httpx

TRACE = "{:032x}"
SPAN = "{:016x}"


def _run(i: int, task: str, outcome: str | None) -> dict:
    attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
             {"key": "gen_ai.agent.name", "value": {"stringValue": "late-agent"}},
             {"key": "gen_ai.agent.version", "value": {"stringValue": "1"}},
             {"key": "relyscope.task.id", "value": {"stringValue": task}}]
    if outcome:
        attrs.append({"key": "relyscope.outcome", "value": {"stringValue": outcome}})
    t0 = 1_760_000_000_000_000_000 + i * 10_000_000_000
    return {"traceId": TRACE.format(i + 1), "spanId": SPAN.format(i + 1), "name": "invoke_agent late-agent",
            "kind": 1, "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 1_000_000_000),
            "attributes": attrs}


def test_late_outcome_changes_success_and_pass_hat_k(sidecar):
    # task A: success, success; task B: failure, unknown (outcome arrives later)
    spans = [_run(0, "A", "success"), _run(1, "A", "success"), _run(2, "B", "failure"), _run(3, "B", None)]
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    r = httpx.post(sidecar.otlp_http + "/v1/traces", json=body, timeout=30)
    assert r.status_code == 200, r.text
    sidecar.flush()
    g = [g for g in sidecar.report()["groups"] if g["agent"] == "late-agent"][0]
    # known outcomes only: A 2/2, B 0/1 → pass^1 = (1 + 0)/2; pass^2 only over tasks with n ≥ 2: A → 1
    assert g["metrics"]["pass^1"]["value"] == 0.5
    assert g["metrics"]["pass^2"]["value"] == 1.0
    assert g["metrics"]["pass^2"]["n_tasks"] == 1

    # the outcome for the 4th run arrives "hours later", keyed by trace id
    r = sidecar.post("/api/v1/outcomes", json={"trace_id": TRACE.format(4), "success": True, "source": "user_feedback"})
    assert r.status_code == 200, r.text
    assert r.json()["known"] is True
    g = [g for g in sidecar.report()["groups"] if g["agent"] == "late-agent"][0]
    # B now 1/2: pass^1 = (1 + 0.5)/2 = 0.75; pass^2 = (1 + 0)/2 = 0.5
    assert g["metrics"]["pass^1"]["value"] == 0.75
    assert g["metrics"]["pass^2"]["value"] == 0.5
    trial = [t for t in sidecar.trials(agent="late-agent") if t["trace_id"] == TRACE.format(4)][0]
    assert trial["outcome"] == "success" and trial["outcome_source"] == "posted:user_feedback"

    # a delayed (non-verifier) outcome never overrides the span's verified one (§6 precedence) ...
    r = sidecar.post("/api/v1/outcomes", json={"trace_id": TRACE.format(1), "success": False, "source": "survey"})
    assert r.status_code == 200
    g = [g for g in sidecar.report()["groups"] if g["agent"] == "late-agent"][0]
    assert g["metrics"]["pass^1"]["value"] == 0.75
    # ... but the application's own verifier posting through the API does (§6 item 1)
    trial_id = [t for t in sidecar.trials(agent="late-agent") if t["trace_id"] == TRACE.format(1)][0]["trial_id"]
    r = sidecar.post("/api/v1/outcomes", json={"trial_id": trial_id, "success": False, "source": "db_state",
                                               "verifier": True})
    assert r.status_code == 200
    g = [g for g in sidecar.report()["groups"] if g["agent"] == "late-agent"][0]
    # A 1/2, B 1/2 → pass^1 = 0.5, pass^2 = 0
    assert g["metrics"]["pass^1"]["value"] == 0.5
    assert g["metrics"]["pass^2"]["value"] == 0.0


def test_outcome_for_an_unseen_trace_is_kept_and_flagged_unknown(sidecar):
    r = sidecar.post("/api/v1/outcomes", json={"trace_id": "ff" * 16, "success": True})
    assert r.status_code == 200 and r.json()["known"] is False
    r = sidecar.post("/api/v1/outcomes", content=b"{" + b" " * (2 << 20) + b"}",
                     headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_outcome_api_rejects_bad_bodies(sidecar):
    for bad in ({"success": True}, {"trace_id": "x", "trial_id": "y", "success": True},
                {"trace_id": "x"}, {"trace_id": "x", "success": True, "score": 2}):
        r = sidecar.post("/api/v1/outcomes", json=bad)
        assert r.status_code == 422, (bad, r.text)


def test_evaluation_events_resolve_unknown_outcomes(sidecar):
    """gen_ai.evaluation.result events decide an outcome the span did not give (§6 item 3)."""
    def ev(label):
        return {"timeUnixNano": "1760000000500000000", "name": "gen_ai.evaluation.result", "attributes": [
            {"key": "gen_ai.evaluation.name", "value": {"stringValue": "task_completion"}},
            {"key": "gen_ai.evaluation.score.label", "value": {"stringValue": label}}]}
    spans = [_run(10, "E", None), _run(11, "E", None), _run(12, "E", "success")]
    for s in spans:
        s["attributes"][1]["value"]["stringValue"] = "eval-agent"
    spans[0]["events"] = [ev("pass")]
    spans[1]["events"] = [ev("fail")]
    spans[2]["events"] = [ev("fail")]  # the application's verified outcome wins over the evaluation
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    assert httpx.post(sidecar.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sidecar.flush()
    trials = {t["trace_id"]: t for t in sidecar.trials(agent="eval-agent")}
    assert [trials[TRACE.format(i)]["outcome"] for i in (11, 12, 13)] == ["success", "failure", "success"]
    assert trials[TRACE.format(11)]["outcome_source"] == "evaluation:task_completion"
    g = [g for g in sidecar.report()["groups"] if g["agent"] == "eval-agent"][0]
    assert abs(g["metrics"]["pass^1"]["value"] - 2 / 3) < 1e-12


def test_history_shows_the_metric_change_after_a_late_outcome(sidecar):
    """Metric over time: each rescoring that changed a group's window is kept in the scores table."""
    spans = [_run(20, "H", "success"), _run(21, "H", None)]
    for s in spans:
        s["attributes"][1]["value"]["stringValue"] = "hist-agent"
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    assert httpx.post(sidecar.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sidecar.flush()
    spans = [_run(22, "H", "failure")]
    spans[0]["attributes"][1]["value"]["stringValue"] = "hist-agent"
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    assert httpx.post(sidecar.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sidecar.flush()
    pts = sidecar.get("/api/v1/history", params={"metric": "success_rate", "agent": "hist-agent"}).json()["points"]
    values = [p["value"] for p in pts]
    # first window: 1 known success of 1 → 1.0; after the third run: 1 of 2 → 0.5 (oldest first)
    assert values[0] == 1.0 and values[-1] == 0.5
    assert all(p["agent"] == "hist-agent" for p in pts)


def test_outcome_api_contradiction_and_uppercase_trace_id(sidecar):
    r = sidecar.post("/api/v1/outcomes", json={"trace_id": "ab" * 16, "success": True, "outcome": "failure"})
    assert r.status_code == 422
    r = sidecar.post("/api/v1/outcomes", json={"trace_id": "AB" * 16, "success": True})
    assert r.status_code == 200 and r.json()["key"] == "ab" * 16


def test_an_outcome_posted_by_trial_id_survives_the_trial_being_rekeyed(sidecar):
    """A nested agent span (its parent, the real root, still to come) is finalized as a trial of
    its own; an outcome posted for the trial id the API listed was lost once the root arrived and
    the trial was re-keyed to it (tombstone for the old id): the run stayed unknown (breaker #2).
    The post now counts for the trial that replaced it."""
    t0 = 1_760_100_000_000_000_000
    tid, agent = TRACE.format(0xabc), "rekey-agent"

    def span(sid, parent, name, start_s, end_s, attrs):
        return {"traceId": tid, "spanId": SPAN.format(sid), "parentSpanId": SPAN.format(parent) if parent else "",
                "name": name, "kind": 1, "startTimeUnixNano": str(t0 + int(start_s * 1e9)),
                "endTimeUnixNano": str(t0 + int(end_s * 1e9)),
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]}

    run = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent, "relyscope.task.id": "t"}

    def send(*spans):
        body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": list(spans)}]}]}
        assert httpx.post(sidecar.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
        sidecar.flush()

    send(span(2, 1, "invoke_agent inner", 0.2, 1.2, run), span(3, 2, "chat m", 0.3, 0.4, {"gen_ai.operation.name": "chat"}))
    (first,) = sidecar.trials(agent=agent)
    # in upper case, as a person may copy it: the derived id is hex, stored lower-case (was
    # recorded for an id no trial has: known false, never counted)
    r = sidecar.post("/api/v1/outcomes", json={"trial_id": first["trial_id"].upper(), "success": False,
                                               "source": "fb"})
    assert r.status_code == 200 and r.json()["known"] is True, r.text
    send(span(1, 0, "invoke_agent outer", 0.0, 2.0, run))  # the real root, late
    (now,) = sidecar.trials(agent=agent)
    assert now["trial_id"] != first["trial_id"]  # re-keyed to the real root
    assert (now["outcome"], now["outcome_source"]) == ("failure", "posted:fb")
    g = [g for g in sidecar.report()["groups"] if g["agent"] == agent][0]
    assert g["outcomes"] == {"success": 0, "failure": 1, "unknown": 0}
    # a post to the old id after the re-key applies to the same trial, and the reply says so (it
    # answered known: false, trials [] — "a typo in an id shows up so")
    r = sidecar.post("/api/v1/outcomes", json={"trial_id": first["trial_id"], "success": True, "source": "fb2"})
    body = r.json()
    assert body["known"] is True and [t["trial_id"] for t in body["trials"]] == [now["trial_id"]], body
    assert body["trials"][0]["outcome"] == "success"
