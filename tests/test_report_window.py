"""The report of one window says that window's numbers: header counts, notes and sections.

One sidecar; five trials, three ended long ago (October 2025) and two seconds ago, so the 5m
window holds exactly the two recent ones. Values worked out by hand from the list below.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from relyscope.testing import RELYSCOPE_BIN, start_sidecar

OLD = 1_760_000_000_000_000_000  # 2025-10-09: outside every window but "all"
# (task, outcome or None, old?)
RUNS = [("t-old-fail", "failure", True), ("t-old-ok", "success", True), ("t-old-ok", None, True),
        ("t-new", "failure", False), ("t-new", "success", False)]


def _root(i: int, task: str, outcome: str | None, old: bool, now_ns: int) -> dict:
    attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
             {"key": "gen_ai.agent.name", "value": {"stringValue": "win-agent"}},
             {"key": "relyscope.task.id", "value": {"stringValue": task}}]
    if outcome:
        attrs.append({"key": "relyscope.outcome", "value": {"stringValue": outcome}})
    t0 = OLD + i * 10**10 if old else now_ns - 3 * 10**9 + i * 10**6
    return {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "invoke_agent win-agent", "kind": 1,
            "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 10**8), "attributes": attrs}


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    d = tmp_path_factory.mktemp("win")
    s = start_sidecar(d, extra_env={"RELYSCOPE_GRACE_PERIOD_S": "0.3", "RELYSCOPE_SCORE_INTERVAL_S": "1"})
    try:
        now = time.time_ns()
        spans = [_root(i, *r, now) for i, r in enumerate(RUNS)]
        body = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
        assert httpx.post(s.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
        assert s.post("/api/v1/flush").status_code == 200
        yield s
    finally:
        s.kill()


def _group(sc, window: str) -> dict:
    r = sc.get("/api/v1/report", params={"window": window})
    assert r.status_code == 200, r.text
    (g,) = r.json()["groups"]
    return g


def _cli(sc, *args) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env["COLUMNS"] = "250"
    r = subprocess.run([str(RELYSCOPE_BIN), "report", "--api", sc.api, *args], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_5m_window_counts_notes_and_sections_are_of_the_window(sc):
    g = _group(sc, "5m")
    assert g["window"] == "5m" and g["sections_scope"] == "window 5m"
    assert g["trials"] == 2 and g["tasks"] == 1
    assert g["outcomes"] == {"success": 1, "failure": 1, "unknown": 0}
    assert not any("unknown outcome" in n for n in g["notes"])  # the one unknown is old
    assert [w["task_id"] for w in g["worst_tasks"]] == ["t-new"]
    assert g["worst_tasks"][0]["trials"] == 2 and g["worst_tasks"][0]["success_rate"] == 0.5
    assert g["attribution"]["raw_failure_rate"] == 0.5


def test_all_window_keeps_all_time_and_says_so(sc):
    g = _group(sc, "all")
    assert g["window"] == "all" and g["sections_scope"] == "all time"
    assert g["trials"] == 5
    assert g["outcomes"] == {"success": 2, "failure": 2, "unknown": 1}
    assert any("1 of 5 trials have an unknown outcome" in n for n in g["notes"])
    assert [w["task_id"] for w in g["worst_tasks"]] == ["t-old-fail", "t-new"]


def test_table_names_the_window_in_each_title(sc):
    out = " ".join(_cli(sc, "--window", "5m").split())
    assert "win-agent unknown [production, window 5m] — 1 tasks, 2 trials (outcome: 1 success, 1 failure, 0 unknown)" in out
    assert "worst tasks (lowest success rate, lowest C_out, most violations) — window 5m" in out
    out = " ".join(_cli(sc).split())  # the sidecar's primary window: all
    assert "[production, window all] — 3 tasks, 5 trials (outcome: 2 success, 2 failure, 1 unknown)" in out


def test_empty_report_over_the_wire_quotes_the_sidecars_settings(sc):
    rep = sc.get("/api/v1/report", params={"agent": "nobody"}).json()
    fin = rep["finalize"]
    assert rep["groups"] == [] and (fin["grace_period_s"], fin["score_interval_s"]) == (0.3, 1.0)
    assert fin["scoring_cycles"] >= 1  # the fixture's sidecar has scored: an empty report means no trials
    from rich.console import Console

    from relyscope.cli.render import render_report

    c = Console(record=True, width=250)
    render_report(rep, c)
    text = " ".join(c.export_text().split())
    assert "RELYSCOPE_GRACE_PERIOD_S=0.3 s" in text and "RELYSCOPE_SCORE_INTERVAL_S=1 s" in text


def _cli_raw(api, *args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env.update(env_extra or {})
    return subprocess.run([str(RELYSCOPE_BIN), *args], capture_output=True, text=True, timeout=120, env=env)


def test_history_of_an_unknown_metric_is_one_short_line(sc):
    r = _cli_raw(sc.api, "history", "bogus", "--api", sc.api)
    assert r.returncode == 2, r.stderr
    err = " ".join(r.stderr.split())
    assert "unknown metric 'bogus'; valid metric keys include success_rate, pass^1, C_out, P_brier, R" in err
    assert "valid_metrics" not in err and len(err) < 300


def test_a_bad_setting_names_the_environment_variable(tmp_path):
    r = _cli_raw("", "serve", env_extra={"RELYSCOPE_SHADOW_RATE": "2",
                                         "RELYSCOPE_STORE": f"chdb://{tmp_path}/data"})
    assert r.returncode == 2
    err = " ".join(r.stderr.split())
    assert "RELYSCOPE_SHADOW_RATE='2': Input should be less than or equal to 1" in err, err
    assert "shadow_rate:" not in err


def test_an_unconfigured_window_names_the_setting_and_the_configured_windows(sc):
    """``?window=30m`` (a valid window, not one of the default RELYSCOPE_SCORE_WINDOWS
    5m,1h,24h,7d,all): the 422 names the setting to change and lists what is scored; ``60m`` is
    the length of the configured ``1h`` and is pointed at it; the CLI prints the same reason."""
    r = sc.get("/api/v1/report", params={"window": "30m"})
    assert r.status_code == 422, r.text
    msg = r.json()["detail"]
    assert "unknown window '30m'" in msg and "RELYSCOPE_SCORE_WINDOWS" in msg, msg
    assert "(5m, 1h, 24h, 7d, all)" in msg, msg
    assert "RELYSCOPE_SCORE_WINDOWS=5m,1h,24h,7d,all,30m" in msg, msg
    msg = sc.get("/api/v1/report", params={"window": "60m"}).json()["detail"]
    assert "ask for window=1h" in msg, msg
    cli = _cli_raw(sc.api, "report", "--api", sc.api, "--window", "30m")
    assert cli.returncode == 2
    assert "RELYSCOPE_SCORE_WINDOWS=5m,1h,24h,7d,all,30m" in " ".join(cli.stderr.split()), cli.stderr


def test_history_that_a_filter_empties_names_the_filter_and_the_groups_it_would_find(sc):
    # bug (fresh-user trial): the README's `history 'pass^1' --agent support` said only "no stored
    # scores for pass^1" — the agent is support-agent, and filters match exactly
    import json
    import time

    deadline = time.monotonic() + 60
    while True:  # scores are stored by the sidecar's scoring cycle
        r = _cli_raw(sc.api, "history", "pass^1", "--agent", "win-agent", "--api", sc.api, "--format", "json")
        assert r.returncode == 0, r.stderr
        if json.loads(r.stdout)["points"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert json.loads(r.stdout)["points"], "no stored scores within 60 s"
    r = _cli_raw(sc.api, "history", "pass^1", "--agent", "win", "--api", sc.api)
    assert r.returncode == 0, r.stderr
    out = " ".join((r.stdout + r.stderr).split())
    assert "no stored scores for pass^1" in out
    assert "filtered by --agent 'win'" in out and "--agent 'win-agent'" in out, out
