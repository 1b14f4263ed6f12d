"""Rolling scores: with RELYSCOPE_SCORE_WINDOW_S set, live groups count only trials that ended
within the window; offline imports always count."""

from __future__ import annotations

import time

import httpx

from conftest import start_sidecar


def _root(i: int, end_ns: int, run_kind: str, ok: bool) -> dict:
    return {"traceId": f"{i + 500:032x}", "spanId": f"{i + 500:016x}", "name": "invoke_agent w", "kind": 1,
            "startTimeUnixNano": str(end_ns - 10**9), "endTimeUnixNano": str(end_ns),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "gen_ai.agent.name", "value": {"stringValue": "windowed"}},
                           {"key": "relyscope.run.kind", "value": {"stringValue": run_kind}},
                           {"key": "relyscope.task.id", "value": {"stringValue": "t"}},
                           {"key": "relyscope.outcome", "value": {"stringValue": "success" if ok else "failure"}}]}


def test_window_keeps_recent_live_trials_and_all_offline(tmp_path):
    now = time.time_ns()
    old = now - 3 * 86400 * 10**9  # three days ago
    spans = [_root(0, old, "production", False), _root(1, old, "production", False),
             _root(2, now, "production", True), _root(3, now, "production", True),
             _root(4, old, "offline", False), _root(5, now, "offline", True)]
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_SCORE_WINDOW_S": "3600"})
    try:
        body = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
        assert httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
        sc.flush()
        groups = {g["run_kind"]: g for g in sc.report()["groups"] if g["agent"] == "windowed"}
    finally:
        sc.kill()
    # production: only the 2 recent successes are in the window → success 1.0 over 2 trials
    assert groups["production"]["trials"] == 2
    assert groups["production"]["metrics"]["success_rate"]["value"] == 1.0
    # offline: both, whatever their age → 1 of 2
    assert groups["offline"]["trials"] == 2
    assert groups["offline"]["metrics"]["success_rate"]["value"] == 0.5
