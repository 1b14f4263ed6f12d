"""Sliding windows end to end: a real sidecar scores every group over 5m / 1h / 24h / 7d / all,
exports them with a ``window`` label, serves them at ``/api/v1/report?window=``; offline imports
keep their all-time view in every window. Plus the window-name parser."""

from __future__ import annotations

import time

import httpx
import pytest

from conftest import start_sidecar
from relyscope.scoring.rollup import level_for, window_start
from relyscope.scoring.windows import parse_windows, window_name


def _root(i: int, end_ns: int, run_kind: str, ok: bool | None) -> dict:
    return {"traceId": f"{i + 700:032x}", "spanId": f"{i + 700:016x}", "name": "invoke_agent w", "kind": 1,
            "startTimeUnixNano": str(end_ns - 10**9), "endTimeUnixNano": str(end_ns),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "gen_ai.agent.name", "value": {"stringValue": "win"}},
                           {"key": "relyscope.run.kind", "value": {"stringValue": run_kind}},
                           {"key": "relyscope.task.id", "value": {"stringValue": f"t{i % 2}"}}]
            + ([] if ok is None else [{"key": "relyscope.outcome", "value": {"stringValue": "success" if ok else "failure"}}])}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    sc = start_sidecar(tmp_path_factory.mktemp("windows"))
    now = time.time_ns()
    minute, hour, day = 60 * 10**9, 3600 * 10**9, 86400 * 10**9
    # production: success now; failures 30 min, 3 days and 20 days ago
    spans = [_root(0, now, "production", True), _root(1, now - 30 * minute, "production", False),
             _root(2, now - 3 * day, "production", False), _root(3, now - 20 * day, "production", False),
             _root(4, now - 20 * day, "offline", True), _root(5, now - 2 * hour, "offline", False),
             _root(6, now - 3 * day, "production", None)]  # outcome unknown: in no success metric
    r = httpx.post(sc.otlp_http + "/v1/traces", json={"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]},
                   timeout=30)
    assert r.status_code == 200
    sc.flush()
    yield sc
    sc.kill()


def _gauges(text: str, metric: str, run_kind: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("relyscope_score{") and f'metric="{metric}"' in line and 'agent="win"' in line \
                and f'run_kind="{run_kind}"' in line:
            out[line.split('window="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_gauges_per_window(sidecar):
    text = sidecar.get("/metrics").text
    # 5m: the success only; 1h: + the 30-min failure; 24h same; 7d: + 3-day failure; all: 1 of 4
    assert _gauges(text, "success_rate", "production") == pytest.approx(
        {"5m": 1.0, "1h": 0.5, "24h": 0.5, "7d": 1 / 3, "all": 0.25})
    # offline imports: all-time in every window (1 success of 2)
    assert _gauges(text, "success_rate", "offline") == pytest.approx({w: 0.5 for w in ("5m", "1h", "24h", "7d", "all")})


def test_report_window_parameter(sidecar):
    rep = sidecar.get("/api/v1/report", params={"window": "1h"}).json()
    assert rep["window"] == "1h"
    prod = [g for g in rep["groups"] if g["agent"] == "win" and g["run_kind"] == "production"][0]
    assert prod["trials"] == 2 and prod["metrics"]["success_rate"]["value"] == 0.5
    assert sidecar.get("/api/v1/report").json()["window"] == "all"
    bad = sidecar.get("/api/v1/report", params={"window": "3w"})
    assert bad.status_code == 422 and "5m, 1h, 24h, 7d, all" in bad.text


def test_parse_windows():
    assert parse_windows("5m, 1h,all,5m") == [("5m", 300.0), ("1h", 3600.0), ("all", None)]
    for bad in ("", "5x", "0m", "1h,,all", "-1h"):
        with pytest.raises(ValueError):
            parse_windows(bad)
    assert window_name(3600) == "1h" and window_name(90) == "90s" and window_name(7 * 86400) == "7d"


def test_window_alignment():
    # 5m at 12:07:30 → minute buckets from 12:02:00; 7d → hour buckets; all → 0
    now = 1_700_000_000 + 7 * 60 + 30 - (1_700_000_000 % 3600)
    assert level_for(300) == (1, 60) and level_for(6 * 3600) == (1, 60)
    assert level_for(24 * 3600) == (2, 3600) and level_for(None) == (3, 0)
    assert window_start(now, 300) == now - 330
    assert window_start(now, 7 * 86400) == now - 7 * 86400 - 450
    assert window_start(now, None) == 0


def test_restart_serves_the_same_window_scores_before_new_traffic(sidecar):
    """After a restart the scorer continues from the rollups' stored watermarks: the first cycle
    (before any new span) exports the same per-window values, and a late outcome posted after
    the restart moves only the windows holding its trial."""
    before = sidecar.get("/metrics").text
    want = {rk: _gauges(before, "success_rate", rk) for rk in ("production", "offline")}
    sidecar.kill()
    sc = start_sidecar(sidecar.data_dir)
    try:
        deadline = time.monotonic() + 30
        while True:
            text = sc.get("/metrics").text
            got = {rk: _gauges(text, "success_rate", rk) for rk in ("production", "offline")}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert got == want
        # the 3-day-old trial without outcome (trace 706) gets one late: 7d 1/3 → 2/4, all 1/4 → 2/5
        r = sc.post("/api/v1/outcomes", json={"trace_id": f"{706:032x}", "outcome": "success"})
        assert r.status_code in (200, 201, 202), r.text
        sc.flush()
        got = _gauges(sc.get("/metrics").text, "success_rate", "production")
        assert got == pytest.approx({"5m": 1.0, "1h": 0.5, "24h": 0.5, "7d": 0.5, "all": 0.4})
    finally:
        sc.kill()


def test_drift_gauges_and_report(tmp_path):
    """Last hour vs the 24 h before: 10 tasks that all succeeded yesterday fail now → success
    rate Δ = −1, CI [−1, −1] (every task changed alike), flagged; exported and in the report."""
    now = time.time_ns()
    hour = 3600 * 10**9
    spans = [_root(100 + i, now - 5 * hour - i * 10**9, "production", True) for i in range(20)]
    spans += [_root(200 + i, now - 60 * 10**9 - i * 10**9, "production", False) for i in range(20)]
    for s in spans:
        s["attributes"] = [a for a in s["attributes"] if a["key"] != "relyscope.task.id"] + [
            {"key": "relyscope.task.id", "value": {"stringValue": f"d{int(s['traceId'], 16) % 10}"}},
            {"key": "gen_ai.agent.name", "value": {"stringValue": "drifting"}}]
        s["attributes"] = [a for a in s["attributes"] if not (a["key"] == "gen_ai.agent.name" and
                                                             a["value"]["stringValue"] == "win")]
    # 20 trials in the current hour: below the default RELYSCOPE_DRIFT_MIN_TRIALS (100)
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_DRIFT_MIN_TRIALS": "20"})
    try:
        r = httpx.post(sc.otlp_http + "/v1/traces", json={"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]},
                       timeout=30)
        assert r.status_code == 200
        sc.flush()
        text = sc.get("/metrics").text
        lines = {l.split("{")[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                 if l.startswith("relyscope_drift") and 'agent="drifting"' in l and 'metric="success_rate"' in l}
        assert lines == {"relyscope_drift_delta": -1.0, "relyscope_drift_ci_low": -1.0,
                         "relyscope_drift_ci_high": -1.0, "relyscope_drift_flag": 1.0}
        g = [g for g in sc.report()["groups"] if g["agent"] == "drifting"][0]
        assert g["drift"]["metrics"]["success_rate"] == {"delta": -1.0, "ci": [-1.0, -1.0], "flagged": True}
        assert (g["drift"]["current"], g["drift"]["reference"]) == ("1h", "24h")
    finally:
        sc.kill()
