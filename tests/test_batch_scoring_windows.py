"""RELYSCOPE_INCREMENTAL_SCORING=false: the batch scorer reloads the trials each cycle and scores
one window only — every stored trial, or the last RELYSCOPE_SCORE_WINDOW_S seconds. The API, the
Prometheus export and ``relyscope report --window`` must say that window's numbers under its name,
and refuse (422, naming the setting to change) any other window rather than serve the one window's
numbers under another's name (they used to: the same all-time scores for every ``?window=``).

Four trials of agent ``batch`` (production), values worked out by hand:
ended now (task a, success), 30 min ago (task a, failure), 3 days ago twice (task b, failures).
success_rate: all time 1/4 = 0.25; last hour 1/2 = 0.5 (5m would be 1/1 = 1.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from relyscope.testing import RELYSCOPE_BIN, start_sidecar

MIN, DAY = 60 * 10**9, 86400 * 10**9


def _root(i: int, end_ns: int, task: str, ok: bool) -> dict:
    return {"traceId": f"{i + 900:032x}", "spanId": f"{i + 900:016x}", "name": "invoke_agent batch", "kind": 1,
            "startTimeUnixNano": str(end_ns - 10**9), "endTimeUnixNano": str(end_ns),
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "gen_ai.agent.name", "value": {"stringValue": "batch"}},
                           {"key": "relyscope.task.id", "value": {"stringValue": task}},
                           {"key": "relyscope.outcome", "value": {"stringValue": "success" if ok else "failure"}}]}


def _start(tmp_path, **env):
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_INCREMENTAL_SCORING": "false", **env})
    now = time.time_ns()
    spans = [_root(0, now, "a", True), _root(1, now - 30 * MIN, "a", False),
             _root(2, now - 3 * DAY, "b", False), _root(3, now - 3 * DAY, "b", False)]
    r = httpx.post(sc.otlp_http + "/v1/traces", json={"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]},
                   timeout=30)
    assert r.status_code == 200
    sc.flush()
    return sc


def _success(rep: dict) -> tuple[float, int]:
    (g,) = [g for g in rep["groups"] if g["agent"] == "batch"]
    return g["metrics"]["success_rate"]["value"], g["trials"]


def _gauges(sc) -> dict[str, float]:
    out = {}
    for line in sc.get("/metrics").text.splitlines():
        if line.startswith("relyscope_score{") and 'metric="success_rate"' in line and 'agent="batch"' in line:
            out[line.split('window="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def _cli_report(sc, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env["COLUMNS"] = "250"
    return subprocess.run([str(RELYSCOPE_BIN), "report", "--format", "json", "--api", sc.api, *args],
                          capture_output=True, text=True, timeout=120, env=env)


def _refused(r: httpx.Response, window: str, scored: str) -> str:
    assert r.status_code == 422, r.text
    msg = r.json()["detail"]
    assert f"window {window!r} is not scored" in msg and "RELYSCOPE_INCREMENTAL_SCORING=false" in msg, msg
    assert f"only {scored!r}" in msg and "set RELYSCOPE_INCREMENTAL_SCORING=true" in msg, msg
    return msg


def test_all_time_is_served_as_all_and_other_windows_are_refused(tmp_path):
    sc = _start(tmp_path)
    try:
        rep = sc.get("/api/v1/report").json()
        assert rep["window"] == "all" and _success(rep) == (0.25, 4)
        assert _success(sc.get("/api/v1/report", params={"window": "all"}).json()) == (0.25, 4)
        for w in ("5m", "1h", "24h", "7d"):  # configured (RELYSCOPE_SCORE_WINDOWS) but not computed
            _refused(sc.get("/api/v1/report", params={"window": w}), w, "all")
        bad = sc.get("/api/v1/report", params={"window": "3w"})
        assert bad.status_code == 422 and "unknown window '3w'" in bad.text
        assert _gauges(sc) == pytest.approx({"all": 0.25})  # no gauge of a window not computed
        cli = _cli_report(sc, "--window", "1h")
        assert cli.returncode == 2, cli.stdout
        err = " ".join(cli.stderr.split())
        assert "window '1h' is not scored" in err and "set RELYSCOPE_INCREMENTAL_SCORING=true" in err, err
        cli = _cli_report(sc, "--window", "all")
        assert cli.returncode == 0, cli.stderr
        assert _success(json.loads(cli.stdout)) == (0.25, 4)
    finally:
        sc.kill()


def test_windows_without_all_still_label_the_all_time_scores_all(tmp_path):
    # RELYSCOPE_SCORE_WINDOWS=5m,1h: the batch scorer still scores every stored trial (no
    # RELYSCOPE_SCORE_WINDOW_S), so its numbers are 'all', not '1h' (the last window listed)
    sc = _start(tmp_path, RELYSCOPE_SCORE_WINDOWS="5m,1h")
    try:
        rep = sc.get("/api/v1/report").json()
        assert rep["window"] == "all" and _success(rep) == (0.25, 4)
        _refused(sc.get("/api/v1/report", params={"window": "1h"}), "1h", "all")
        assert _gauges(sc) == pytest.approx({"all": 0.25})
    finally:
        sc.kill()


def test_score_window_s_is_the_one_window_served(tmp_path):
    # RELYSCOPE_SCORE_WINDOW_S=3600: the batch scorer scores the last hour: 1 of 2 trials
    sc = _start(tmp_path, RELYSCOPE_SCORE_WINDOW_S="3600")
    try:
        rep = sc.get("/api/v1/report").json()
        assert rep["window"] == "1h" and _success(rep) == (0.5, 2)
        assert _success(sc.get("/api/v1/report", params={"window": "1h"}).json()) == (0.5, 2)
        msg = _refused(sc.get("/api/v1/report", params={"window": "all"}), "all", "1h")
        assert "RELYSCOPE_SCORE_WINDOW_S" in msg
        _refused(sc.get("/api/v1/report", params={"window": "5m"}), "5m", "1h")
        assert _gauges(sc) == pytest.approx({"1h": 0.5})
    finally:
        sc.kill()
