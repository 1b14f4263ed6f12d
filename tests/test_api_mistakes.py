"""Issue 12: the management API refuses mistakes with a 4xx and a reason, and changes nothing stored.

One sidecar for the module. Four runs of agent ``strict-agent``: task A success, success; task B
failure, and one run (trace 4) whose outcome is unknown — every mistyped outcome post below targets
trace 4, so had it been coerced and stored, trace 4's outcome and the group's scores would change.
"""

from __future__ import annotations

import httpx
import pytest

from relyscope.testing import start_sidecar

TRACE = "{:032x}"
SPAN = "{:016x}"
AGENT = "strict-agent"


def _run(i: int, task: str, outcome: str | None, *, agent: str = AGENT, conversation: str | None = None) -> dict:
    attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
             {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
             {"key": "gen_ai.agent.version", "value": {"stringValue": "1"}},
             {"key": "relyscope.task.id", "value": {"stringValue": task}}]
    if outcome:
        attrs.append({"key": "relyscope.outcome", "value": {"stringValue": outcome}})
    if conversation:
        attrs.append({"key": "gen_ai.conversation.id", "value": {"stringValue": conversation}})
    t0 = 1_760_000_000_000_000_000 + i * 10_000_000_000
    return {"traceId": TRACE.format(i), "spanId": SPAN.format(i), "name": f"invoke_agent {agent}",
            "kind": 1, "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 1_000_000_000),
            "attributes": attrs}


def _send(sc, spans: list[dict]) -> None:
    body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    r = httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30)
    assert r.status_code == 200, r.text
    sc.flush()


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = start_sidecar(tmp_path_factory.mktemp("strict"))
    try:
        _send(s, [_run(1, "A", "success"), _run(2, "A", "success"), _run(3, "B", "failure"),
                  _run(4, "B", None)])
        yield s
    finally:
        s.kill()


def _group(sc, agent: str = AGENT) -> dict:
    return [g for g in sc.report()["groups"] if g["agent"] == agent][0]


def _snapshot(sc) -> tuple:
    """What the mistakes must leave unchanged: trial outcomes, the group's scores, history length."""
    trials = sorted((t["trace_id"], t["outcome"], t["outcome_source"]) for t in sc.trials(agent=AGENT))
    metrics = {k: v["value"] for k, v in _group(sc)["metrics"].items()}
    hist = sc.get("/api/v1/history", params={"metric": "success_rate", "agent": AGENT}).json()["points"]
    return trials, metrics, len(hist)


MISTYPED = [
    ({"trace_id": TRACE.format(4), "success": "yes"}, "success"),
    ({"trace_id": TRACE.format(4), "success": 1}, "success"),
    ({"trace_id": TRACE.format(4), "success": True, "score": "0.9"}, "score"),
    ({"trace_id": TRACE.format(4), "success": True, "verifier": "true"}, "verifier"),
    ({"trace_id": TRACE.format(4), "outcome": "SUCCESS"}, "outcome"),
    ({"trace_id": TRACE.format(4), "success": True, "source": ""}, "source"),
    ({"trace_id": TRACE.format(4), "success": True, "sucess": True}, "sucess"),
    ({"trace_id": "zzz", "success": True}, "trace_id"),
    ({"trace_id": TRACE.format(4)[:-1], "success": True}, "trace_id"),  # 31 hex digits
    ({"trace_id": TRACE.format(4) + "0", "success": True}, "trace_id"),  # 33
    ({"trace_id": "g" + TRACE.format(4)[1:], "success": True}, "trace_id"),
    ({"trace_id": "0" * 32, "success": True}, "all zeros"),
    ({"trace_id": 4, "success": True}, "trace_id"),
]


def test_mistyped_outcome_posts_are_refused_with_the_field_named_and_change_nothing(sc):
    before = _snapshot(sc)
    # the seed, worked by hand: A 2/2, B 0/1 known → pass^1 = (1 + 0)/2
    assert before[1]["pass^1"] == 0.5
    for body, reason in MISTYPED:
        r = sc.post("/api/v1/outcomes", json=body)
        assert r.status_code == 422, (body, r.text)
        assert reason in r.text, (body, r.text)
    assert _snapshot(sc) == before
    # the same post, well typed, is taken: B 1/2 → pass^1 = (1 + 0.5)/2
    r = sc.post("/api/v1/outcomes", json={"trace_id": TRACE.format(4).upper(), "success": True})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "recorded" and r.json()["known"] is True
    assert _group(sc)["metrics"]["pass^1"]["value"] == 0.75


def test_a_post_the_span_verifier_overrides_says_so(sc):
    # trace 1's span carries the application's verified "success": a later non-verifier post loses
    before = _snapshot(sc)
    r = sc.post("/api/v1/outcomes", json={"trace_id": TRACE.format(1), "success": False, "source": "survey"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "overridden_by_verifier"
    assert [(t["trial_id"], t["outcome"]) for t in body["trials"]] == [(f"{TRACE.format(1)}:{SPAN.format(1)}",
                                                                        "success")]
    assert _snapshot(sc)[:2] == before[:2]  # no outcome and no score moved


def test_trials_filter_by_trace_id_and_task_id(sc):
    r = sc.get("/api/v1/trials", params={"trace_id": TRACE.format(3)})
    assert r.status_code == 200, r.text
    assert [t["trace_id"] for t in r.json()["trials"]] == [TRACE.format(3)]
    assert r.json()["total"] == 1 and r.json()["next_cursor"] is None
    r = sc.get("/api/v1/trials", params={"trace_id": TRACE.format(3).upper()})
    assert [t["trace_id"] for t in r.json()["trials"]] == [TRACE.format(3)]
    r = sc.get("/api/v1/trials", params={"trace_id": "ee" * 16})
    assert r.status_code == 200 and r.json() == {"trials": [], "total": 0, "next_cursor": None}
    r = sc.get("/api/v1/trials", params={"task_id": "A", "agent": AGENT})
    assert sorted(t["trace_id"] for t in r.json()["trials"]) == [TRACE.format(1), TRACE.format(2)]
    for bad in ("zzz", "ab" * 15, "ab" * 17):
        r = sc.get("/api/v1/trials", params={"trace_id": bad})
        assert r.status_code == 422 and "trace_id" in r.text, (bad, r.text)


def test_spans_trace_id_is_hex_too(sc):
    r = sc.get("/api/v1/spans", params={"trace_id": "zzz"})
    assert r.status_code == 422 and "trace_id" in r.text
    r = sc.get("/api/v1/spans", params={"trace_id": TRACE.format(2).upper()})
    assert r.status_code == 200 and r.json()["keys"] == [[TRACE.format(2), SPAN.format(2)]]


def test_trials_cursor_paging_visits_each_trial_once(sc):
    seen, cursor, pages = [], None, 0
    while True:
        params = {"agent": AGENT, "limit": 3, **({"cursor": cursor} if cursor else {})}
        r = sc.get("/api/v1/trials", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["total"] == 4 and len(body["trials"]) <= 3
        seen += [t["trace_id"] for t in body["trials"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 2 and seen == [TRACE.format(i) for i in (1, 2, 3, 4)]  # trial ids sort as traces
    # the last: ["trials", "\ud800"], a lone surrogate — a 503 "query failed" with the SQL in it
    for bad in ("not-a-cursor!", "e30", "WyJ0cmlhbHMiLCJcdWQ4MDAiXQ"):
        r = sc.get("/api/v1/trials", params={"cursor": bad})
        assert r.status_code == 422 and "cursor" in r.text, r.text
    r = sc.get("/api/v1/trials", params={"limit": 0})
    assert r.status_code == 422


def test_sessions_cursor_paging(sc):
    _send(sc, [_run(30 + i, "S", "success", agent="sess-agent", conversation=c)
               for i, c in enumerate(["conv-b", "conv-a", "conv-c", "conv-a"])])
    r = sc.get("/api/v1/sessions", params={"agent": "sess-agent", "limit": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [s["conversation_id"] for s in body["sessions"]] == ["conv-a", "conv-b"]
    assert [s["n_trials"] for s in body["sessions"]] == [2, 1] and body["total"] == 3
    r = sc.get("/api/v1/sessions", params={"agent": "sess-agent", "limit": 2, "cursor": body["next_cursor"]})
    assert [s["conversation_id"] for s in r.json()["sessions"]] == ["conv-c"]
    assert r.json()["next_cursor"] is None
    # a trials cursor is not a sessions cursor
    t = sc.get("/api/v1/trials", params={"limit": 1}).json()["next_cursor"]
    assert sc.get("/api/v1/sessions", params={"cursor": t}).status_code == 422
    r = sc.get("/api/v1/sessions", params={"cursor": "WyJzZXNzaW9ucyIsIlx1ZDgwMCJd"})  # ["sessions", "\ud800"]
    assert r.status_code == 422 and "invalid cursor" in r.text, r.text


def test_unknown_history_metric_names_the_valid_ones(sc):
    before = _snapshot(sc)
    for bad in ("succes_rate", "pass^0", "pass^21", ""):
        r = sc.get("/api/v1/history", params={"metric": bad, "agent": AGENT})
        assert r.status_code == 422, (bad, r.text)
        valid = r.json()["detail"]["valid_metrics"]
        assert "success_rate" in valid and "pass^20" in valid and "R_Saf" in valid
    assert _snapshot(sc) == before


def test_a_late_verdict_adds_a_history_point(tmp_path):
    s = start_sidecar(tmp_path)
    try:
        _send(s, [_run(1, "H", "success"), _run(2, "H", "failure"), _run(3, "H", None)])
        pts = s.get("/api/v1/history", params={"metric": "success_rate"}).json()["points"]
        assert [p["value"] for p in pts] == [0.5]  # 1 of 2 known
        s.flush()  # rescoring unchanged inputs adds no point
        assert len(s.get("/api/v1/history", params={"metric": "success_rate"}).json()["points"]) == 1
        r = s.post("/api/v1/outcomes", json={"trace_id": TRACE.format(3), "success": True})
        assert r.status_code == 200 and r.json()["status"] == "recorded"
        pts = s.get("/api/v1/history", params={"metric": "success_rate"}).json()["points"]
        # same window (same trials), new inputs: the earlier point stays, 2 of 3 known is added
        assert [p["value"] for p in pts] == [0.5, pytest.approx(2 / 3)]
    finally:
        s.kill()


def test_openapi_page_documents_the_routes(sc):
    r = sc.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()
    spec = sc.get("/openapi.json").json()
    for path in ("/api/v1/outcomes", "/api/v1/trials", "/api/v1/sessions", "/api/v1/history"):
        assert path in spec["paths"], path
    params = {p["name"] for p in spec["paths"]["/api/v1/trials"]["get"]["parameters"]}
    assert {"trace_id", "task_id", "limit", "cursor"} <= params


OLD_SCORES_DDL = """CREATE TABLE relyscope.scores (
    formula_set LowCardinality(String), agent LowCardinality(String), version LowCardinality(String),
    run_kind LowCardinality(String), metric LowCardinality(String), value Nullable(Float64),
    ci_low Nullable(Float64), ci_high Nullable(Float64), n_tasks UInt32, n_trials UInt32,
    window_start DateTime64(3), window_end DateTime64(3), n_boot UInt32, params String,
    computed_at DateTime64(3)
) ENGINE = ReplacingMergeTree(computed_at)
ORDER BY (formula_set, agent, version, run_kind, metric, window_start, window_end)"""


def test_a_scores_table_of_the_previous_schema_is_migrated(tmp_path):
    """A data directory written before ``inputs`` joined the key opens and keeps both points.
    In a subprocess: chDB lets one process hold one data directory."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import clickhouse_connect
        from relyscope.store import Store
        dsn = "chdb://{tmp_path}/data"
        c = clickhouse_connect.get_client(dsn=dsn)
        c.command("CREATE DATABASE IF NOT EXISTS relyscope")
        c.command({OLD_SCORES_DDL!r})
        c.close()
        s = Store(dsn)
        row = dict(formula_set="f", agent="a", version="1", run_kind="production", metric="success_rate",
                   n_tasks=1, n_trials=2, window_start=0, window_end=1, n_boot=0, params="{{}}", ci_low=None,
                   ci_high=None)
        s.insert_scores([dict(row, value=0.5, computed_at=10, inputs="x")])
        s.insert_scores([dict(row, value=1.0, computed_at=20, inputs="y")])
        s.query("OPTIMIZE TABLE {{db}}.scores FINAL")
        print([p["value"] for p in s.score_history("success_rate")])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[0.5, 1.0]"


def test_json_body_sent_without_json_content_type_is_refused_with_the_header_to_add(sc):
    # `curl -X POST …/api/v1/outcomes -d '{…}'` without -H 'content-type: application/json' sends
    # application/x-www-form-urlencoded; FastAPI then sees a string, not an object, and answered only
    # "Input should be a valid dictionary or object to extract fields from" — nothing said what to change
    before = _snapshot(sc)
    body = '{"trace_id": "%s", "success": true}' % TRACE.format(4)
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}):
        r = sc.post("/api/v1/outcomes", content=body, headers=headers)
        assert r.status_code == 422, r.text
        assert "content-type: application/json" in r.json()["hint"], r.text
        assert r.json()["detail"][0]["loc"] == ["body"]  # FastAPI's own detail is kept as it was
    assert _snapshot(sc) == before
    # a JSON content type with a non-object body is a different mistake: no content-type hint
    r = sc.post("/api/v1/outcomes", content="[1]", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "hint" not in r.json(), r.text


def test_a_body_json_cannot_echo_is_still_a_422_and_no_traceback(sc):
    # bug (h-break): NaN, 1e400 and a lone surrogate made the 422 handler fail to render the input
    # it echoes (ValueError / UnicodeEncodeError): a 500, and a traceback holding the body in the log
    before = _snapshot(sc)
    trace = TRACE.format(4)
    for body, field, echoed in (
            ('{"trace_id": "%s", "success": true, "score": NaN}' % trace, "score", "NaN"),
            ('{"trace_id": "%s", "success": true, "score": 1e400}' % trace, "score", "Infinity"),
            ('{"trace_id": "%s", "success": true, "score": -Infinity}' % trace, "score", "-Infinity"),
            ('{"trace_id": "\\ud800", "success": true}', "trace_id", "\\ud800"),
            ('{"trace_id": "%s", "success": true, "source": "x \\udfff"}' % trace, "source", "x \\udfff")):
        r = sc.post("/api/v1/outcomes", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, (body, r.status_code, r.text)
        err = r.json()["detail"][0]
        assert err["loc"] == ["body", field] and err["input"] == echoed, (body, err)
    assert _snapshot(sc) == before
    assert "Traceback" not in sc.log
