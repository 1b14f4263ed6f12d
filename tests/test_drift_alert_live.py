"""The drift alert end to end (issue 9): a real Prometheus scrapes a sidecar started here while
one agent's success drops from 0.9 to 0.1 halfway through its traffic; the drift gauge reaches
PromQL with the hand-computed Δ and ``ALERTS`` shows ``RelyscopeDriftDetected`` pending, then
firing, within bounded time. A second agent whose traffic is the same in both halves never
fires.

To keep the test short, the windows are minutes instead of hours (``RELYSCOPE_DRIFT_CURRENT=2m``
against ``RELYSCOPE_DRIFT_REFERENCE=10m``), the first half of the traffic is sent with end times
in the reference window (4–9 minutes ago) and the rule's ``for:`` is cut to 10 s in a copy of the
shipped rules file; the alert's expression is the shipped one, unchanged.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import start_sidecar
from test_prometheus_scrape import _attr, prometheus_binaries, start_prometheus, stop_all

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "alerts" / "relyscope-rules.yml"
ALERT = "RelyscopeDriftDetected"
TASKS = [f"task-{i}" for i in range(10)]
TRIALS_PER_TASK = 10

pytestmark = pytest.mark.slow


def _trial(task: str, ok: bool, end_ns: int) -> list[dict]:
    """Root + one chat span, fixed durations and token counts (so only the outcome differs)."""
    trace, root = secrets.token_hex(16), secrets.token_hex(8)
    ms = 1_000_000
    t0 = end_ns - 30 * ms
    return [
        {"traceId": trace, "spanId": root, "name": "invoke_agent", "kind": 1,
         "startTimeUnixNano": str(t0), "endTimeUnixNano": str(end_ns), "status": {},
         "attributes": [_attr("gen_ai.operation.name", "invoke_agent"), _attr("relyscope.task.id", task),
                        _attr("relyscope.outcome", "success" if ok else "failure")]},
        {"traceId": trace, "spanId": secrets.token_hex(8), "parentSpanId": root, "name": "chat m", "kind": 1,
         "startTimeUnixNano": str(t0 + ms), "endTimeUnixNano": str(t0 + 10 * ms), "status": {},
         "attributes": [_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.usage.input_tokens", 10),
                        _attr("gen_ai.usage.output_tokens", 5)]},
    ]


def _post(otlp_http: str, agent: str, successes_per_task: int, end_ns_of) -> int:
    """Every task gets TRIALS_PER_TASK trials, the first ``successes_per_task`` of them successes."""
    spans = [s for task in TASKS for j in range(TRIALS_PER_TASK)
             for s in _trial(task, j < successes_per_task, end_ns_of(j))]
    body = {"resourceSpans": [{
        "resource": {"attributes": [_attr("service.name", agent), _attr("service.version", "1")]},
        "scopeSpans": [{"scope": {"name": "relyscope-test"}, "spans": spans}]}]}
    r = httpx.post(otlp_http + "/v1/traces", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert not r.json().get("partialSuccess", {}).get("rejectedSpans"), r.text
    return len(spans) // 2


def _rules_with_short_for(dst: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    found = 0
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == ALERT:
                assert rule.get("for"), "the shipped drift alert must have a for: duration"
                rule["for"] = "10s"
                found += 1
    assert found == 1, f"{ALERT} not found exactly once in {RULES}"
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


def test_drift_alert_goes_pending_then_firing_and_stable_traffic_never_fires(tmp_path):
    prometheus_binaries()
    sc = start_sidecar(tmp_path / "sidecar", extra_env={
        "RELYSCOPE_DRIFT_CURRENT": "2m", "RELYSCOPE_DRIFT_REFERENCE": "10m",
        "RELYSCOPE_SCORE_WINDOWS": "2m,10m,all", "RELYSCOPE_N_BOOT": "400"})
    prom = None
    try:
        now = time.time_ns()
        s = 1_000_000_000
        before = lambda j: now - (9 * 60 - 25 * j) * s  # noqa: E731  4 to 9 minutes ago: reference window
        recent = lambda j: now - (60 - 3 * j) * s  # noqa: E731  the last minute: current window
        n = 0
        # First half: both agents succeed 9 times in 10 on every task.
        n += _post(sc.otlp_http, "drifting", 9, before)
        n += _post(sc.otlp_http, "steady", 9, before)
        # Second half: "drifting" drops to 1 in 10; "steady" keeps 9 in 10 (same per-task data).
        n += _post(sc.otlp_http, "drifting", 1, recent)
        n += _post(sc.otlp_http, "steady", 9, recent)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sc.get("/api/v1/spans").json()["trials"] < n:
            time.sleep(0.3)
        assert sc.get("/api/v1/spans").json()["trials"] == n
        sc.flush()

        prom = start_prometheus(tmp_path / "prometheus", [f"127.0.0.1:{sc.api_port}"],
                                rule_files=[_rules_with_short_for(tmp_path / "rules.yml")])
        # Δ of the success rate: every task 0.9 → 0.1, so −0.8 (mean over tasks, equal trials).
        delta = prom.wait_for('relyscope_drift_delta{agent="drifting",metric="success_rate"}', 1, timeout_s=60)
        assert float(delta[0]["value"][1]) == pytest.approx(-0.8, abs=1e-9)
        steady = prom.wait_for('relyscope_drift_delta{agent="steady",metric="success_rate"}', 1, timeout_s=30)
        assert float(steady[0]["value"][1]) == pytest.approx(0.0, abs=1e-9)

        states: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "firing" not in states:
            body = prom.query(f'ALERTS{{alertname="{ALERT}"}}')
            assert body["status"] == "success", body
            for series in body["data"]["result"]:
                labels = series["metric"]
                assert labels["agent"] == "drifting", f"stable traffic fired the drift alert: {labels}"
                if not states or states[-1] != labels["alertstate"]:
                    states.append(labels["alertstate"])
            time.sleep(0.3)
        assert states[:1] == ["pending"] and "firing" in states, (
            f"alert states seen: {states}; prometheus log: {prom.log.read_text()[-2000:]}")
        # ... and over the whole run the steady agent never even went pending.
        ever = prom.query(f'max_over_time(ALERTS{{alertname="{ALERT}",agent="steady"}}[5m])')
        assert ever["status"] == "success" and ever["data"]["result"] == [], ever
        # the dashboard's drift markers (annotation on relyscope_drift_flag): on the drifting
        # agent, one marker per flagged metric, success_rate among them; none on the steady one
        dash = json.loads((ROOT / "grafana" / "dashboards" / "relyscope-reliability.json").read_text())
        [ann] = [a for a in dash["annotations"]["list"] if a["name"] == "Drift flagged"]
        marks = {}
        for agent in ("drifting", "steady"):
            expr = ann["expr"].replace("$agent", agent).replace("$version", "1").replace("$run_kind", "production")
            body = prom.query(expr)
            assert body["status"] == "success", body
            marks[agent] = {r["metric"]["metric"] for r in body["data"]["result"]}
        assert "success_rate" in marks["drifting"] and marks["steady"] == set(), marks
    finally:
        stop_all(prom, sc)
