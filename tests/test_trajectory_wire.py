"""Bug cases C01–C04 (trajectory assembly) over real OTLP/HTTP to a real sidecar.

Each case's requests are sent in the given order to ``POST /v1/traces``; the assembled trial is read
back from ``GET /api/v1/trials``. Expected trees come from reading the case files
(/work/shared/data/bugcases/C0[1-4]_*.json): one trace 5b8e…, agent root a1a1… (``invoke_agent
support_bot``), model call b2b2… (gpt-4o, 812 in / 41 out tokens), tool call c3c3…
(``get_order_details`` with ``{"order_id": "#W123"}``), or the variations each case names.
"""

from __future__ import annotations

import json
import time

import httpx

from conftest import DATA

CASES = DATA / "bugcases"
TRACE = "5b8efff798038103d269b633813fc60c"
ROOT, CHAT, TOOL = "a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2", "c3c3c3c3c3c3c3c3"
NS = 1_000_000_000


def _case(name: str) -> dict:
    return json.loads(next(CASES.glob(f"{name}_*.json")).read_text())


def _send(sc, body: dict, headers: dict | None = None) -> None:
    r = httpx.post(f"{sc.otlp_http}/v1/traces", content=json.dumps(body).encode(),
                   headers=headers or {"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text


def _wait(pred, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _stored_keys(sc, trace_id: str) -> set[tuple[str, str]]:
    return {tuple(k) for k in sc.get("/api/v1/spans", params={"trace_id": trace_id}).json()["keys"]}


def _live(trials: list[dict]) -> list[dict]:
    """Trials other than superseded tombstones (re-assembly replaces, never duplicates)."""
    return [t for t in trials if t["status"] != "superseded"]


def _tree(t: dict) -> list[tuple[str, str, int]]:
    return [(s["span_id"], s["action"], s["depth"]) for s in t["steps"]]


def test_c01_child_before_parent_waits_for_root_then_attaches(sidecar):
    case = _case("C01")
    first, second = case["requests"]
    _send(sidecar, first["body"], first["headers"])
    _wait(lambda: _stored_keys(sidecar, TRACE) == {(TRACE, CHAT), (TRACE, TOOL)}, "first batch stored")
    # several grace periods (0.3 s) pass with the children alone: nothing is finalized or scored
    time.sleep(1.0)
    assert sidecar.trials() == []
    assert sidecar.report()["groups"] == []
    _send(sidecar, second["body"], second["headers"])
    # no flush: the grace period after the root finalizes it
    trials = _wait(lambda: sidecar.trials(), "trial finalized after the grace period")
    assert len(trials) == 1
    t = trials[0]
    assert t["status"] == "complete" and t["revision"] == 1  # first finalization is the final one
    assert t["trial_id"] == f"{TRACE}:{ROOT}" and t["root_span_id"] == ROOT
    assert t["agent_name"] == "support_bot" and t["conversation_id"] == "sess-42"
    assert _tree(t) == [(CHAT, "llm", 1), (TOOL, "get_order_details", 1)]
    assert [s["parent_span_id"] for s in t["steps"]] == [ROOT, ROOT]
    assert t["steps"][1]["arguments"] == {"order_id": "#W123"}
    assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == (812, 41, 853)
    assert t["flags"] == [] and t["wall_time_s"] == 9.0
    # session-level view: the trial is listed under its conversation id
    r = sidecar.get("/api/v1/sessions")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [s["conversation_id"] for s in body["sessions"]] == ["sess-42"]
    assert [x["trial_id"] for x in body["sessions"][0]["trials"]] == [f"{TRACE}:{ROOT}"]
    assert body["sessions"][0]["trials"][0]["actions"] == ["llm", "get_order_details"]


def _group(rep: dict, agent: str) -> dict:
    groups = [g for g in rep["groups"] if g["agent"] == agent]
    assert len(groups) == 1, rep
    return groups[0]


def _otlp(spans: list[dict], service: str = "support-agent") -> dict:
    return {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}


def _attr(k: str, v) -> dict:
    key = "boolValue" if isinstance(v, bool) else "intValue" if isinstance(v, int) else "stringValue"
    return {"key": k, "value": {key: str(v) if key == "intValue" else v}}


def test_c02_root_never_arrives_incomplete_virtual_root_excluded_from_pass_hat_k(sidecar):
    case = _case("C02")
    for req in case["requests"]:
        _send(sidecar, req["body"], req["headers"])
    # the same service also ran one complete, successful trial (task t-ok) and one rootless run whose
    # only outcome attribute says failure: if incomplete trials were counted, pass^1 would be 0.5
    ok_trace, bad_trace = "1" * 32, "2" * 32
    _send(sidecar, _otlp([
        {"traceId": ok_trace, "spanId": "1" * 16, "name": "invoke_agent", "kind": 1,
         "startTimeUnixNano": str(1760000100 * NS), "endTimeUnixNano": str(1760000105 * NS),
         "attributes": [_attr("gen_ai.operation.name", "invoke_agent"), _attr("relyscope.task.id", "t-ok"),
                        _attr("relyscope.outcome", "success")]},
        {"traceId": ok_trace, "spanId": "2" * 16, "parentSpanId": "1" * 16, "name": "chat m", "kind": 3,
         "startTimeUnixNano": str(1760000101 * NS), "endTimeUnixNano": str(1760000102 * NS),
         "attributes": [_attr("gen_ai.operation.name", "chat")]},
        {"traceId": bad_trace, "spanId": "3" * 16, "parentSpanId": "4" * 16, "name": "execute_tool x",
         "kind": 1, "startTimeUnixNano": str(1760000200 * NS), "endTimeUnixNano": str(1760000201 * NS),
         "attributes": [_attr("gen_ai.operation.name", "execute_tool"), _attr("gen_ai.tool.name", "x"),
                        _attr("relyscope.outcome", "failure")]},
    ]))
    _wait(lambda: len(_stored_keys(sidecar, TRACE)) == 2, "C02 spans stored")
    _wait(lambda: len(sidecar.trials()) == 1, "the complete trial finalized after its grace period")
    time.sleep(0.6)  # two grace periods: the rootless traces are still open (root timeout 300 s)
    assert [t["trace_id"] for t in sidecar.trials()] == [ok_trace]
    sidecar.flush()  # the operator's flush finalizes open traces
    trials = {t["trace_id"]: t for t in sidecar.trials()}
    assert set(trials) == {TRACE, ok_trace, bad_trace}
    t = trials[TRACE]
    assert t["status"] == "incomplete" and "missing_root" in t["flags"]
    assert t["trial_id"] == f"{TRACE}:virtual" and t["root_span_id"] == ""
    # virtual root spans min(start)..max(end) of the collected spans: 1.0 s .. 3.9 s after 1760000000
    assert (t["start_ns"], t["end_ns"]) == (1760000001 * NS, 1760000003 * NS + 900_000_000)
    assert _tree(t) == [(CHAT, "llm", 1), (TOOL, "get_order_details", 1)]
    assert (t["input_tokens"], t["output_tokens"]) == (812, 41)
    assert trials[bad_trace]["status"] == "incomplete" and trials[bad_trace]["outcome"] == "failure"
    g = _group(sidecar.report(), "support-agent")
    assert g["incomplete_trials"] == 2
    assert g["metrics"]["pass^1"]["value"] == 1.0 and g["metrics"]["pass^1"]["n_tasks"] == 1


def test_c02_root_timeout_finalizes_without_flush(sidecar_factory):
    sc = sidecar_factory(extra_env={"RELYSCOPE_ROOT_TIMEOUT_S": "1.5"})
    for req in _case("C02")["requests"]:
        _send(sc, req["body"], req["headers"])
    trials = _wait(lambda: sc.trials(), "trial finalized by the root timeout")
    assert len(trials) == 1
    t = trials[0]
    assert t["status"] == "incomplete" and "missing_root" in t["flags"]
    assert [s["action"] for s in t["steps"]] == ["llm", "get_order_details"]


def test_c02_then_root_arrives_late_replaces_incomplete_trial(sidecar):
    for req in _case("C02")["requests"]:
        _send(sidecar, req["body"], req["headers"])
    _wait(lambda: len(_stored_keys(sidecar, TRACE)) == 2, "C02 spans stored")
    sidecar.flush()
    assert [t["status"] for t in sidecar.trials()] == ["incomplete"]
    root_req = _case("C01")["requests"][1]  # the same trace's root (a1a1…), arriving after finalization
    _send(sidecar, root_req["body"], root_req["headers"])
    _wait(lambda: len(_stored_keys(sidecar, TRACE)) == 3, "root stored")
    sidecar.flush()
    live = _live(sidecar.trials())
    assert len(live) == 1, live
    t = live[0]
    assert t["status"] == "complete" and t["trial_id"] == f"{TRACE}:{ROOT}" and t["revision"] == 2
    assert _tree(t) == [(CHAT, "llm", 1), (TOOL, "get_order_details", 1)]
    g = _group(sidecar.report(), "support_bot")
    assert g["trials"] == 1


def test_c03_missing_intermediate_span_stays_in_the_trace_flagged(sidecar):
    for req in _case("C03")["requests"]:
        _send(sidecar, req["body"], req["headers"])
    _wait(lambda: len(_stored_keys(sidecar, TRACE)) == 2, "C03 spans stored")
    sidecar.flush()
    trials = sidecar.trials()
    assert len(trials) == 1  # not listed as a separate trace/trial
    t = trials[0]
    assert t["status"] == "complete" and t["root_span_id"] == ROOT and t["trace_id"] == TRACE
    assert _tree(t) == [(TOOL, "search", 1)]
    assert t["steps"][0]["parent_span_id"] == "eeeeeeeeeeeeeeee"  # the gap stays visible
    assert t["steps"][0]["flags"] == ["reattached"] and "reattached" in t["flags"]


def test_c04_root_with_uncollected_parent_is_the_root(sidecar):
    for req in _case("C04")["requests"]:
        _send(sidecar, req["body"], req["headers"])
    # no flush: a root is present, so the grace period finalizes it
    trials = _wait(lambda: sidecar.trials(), "trial finalized after the grace period")
    assert len(trials) == 1
    t = trials[0]
    assert t["status"] == "complete" and t["root_span_id"] == ROOT
    assert t["trial_id"] == f"{TRACE}:{ROOT}" and t["agent_name"] == "support_bot"
    assert _tree(t) == [(CHAT, "llm", 1), (TOOL, "get_order_details", 1)]
    assert t["flags"] == ["remote_parent"]
    assert all(s["flags"] == [] for s in t["steps"])
    sidecar.flush()
    g = _group(sidecar.report(), "support_bot")
    assert (g["trials"], g["incomplete_trials"]) == (1, 0)
