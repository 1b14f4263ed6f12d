"""The provisioned Grafana dashboard against a live sidecar, a real Prometheus and chDB.

Every PromQL expression of grafana/dashboards/relyscope-reliability.json (panel targets, the
drift-marker annotation and template-variable queries) must reference only metric names found in
a live /metrics scrape of the sidecar, only the labels the sidecar sets (agent/version/run_kind/
metric/k on the reliability gauges), and be accepted by a real Prometheus (template variables
substituted) — and the core panels must return the values worked out by hand for the runs sent.
Every ClickHouse panel's SQL (grafana-clickhouse-datasource) runs in chDB on a store with data,
with the plugin's macros expanded as its backend does (grafana/clickhouse-datasource
pkg/macros/macros.go, the same in 4.3.2 and 4.20.0) and Grafana's variables substituted, and returns the columns and the values
worked out by hand; so does the SQL of the trace link.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import start_sidecar
from test_prometheus_scrape import RUNS, prometheus_binaries, promql_names, send_runs, start_prometheus

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "grafana" / "dashboards" / "relyscope-reliability.json"
SCORE_LABELS = {"agent", "version", "run_kind", "metric", "k", "window"}
OTHER_LABELS = {"kind", "reason", "le", "instance", "job"}  # series labels + Prometheus target labels
VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$agent": "shop-agent", "$version": "3.1",
        "$run_kind": "production", "$metric": "pass^1", "$instance": ".*",
        "$window": "all"}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


PROM = {"type": "prometheus", "uid": "${datasource}"}
CH = {"type": "grafana-clickhouse-datasource", "uid": "${clickhouse}"}


def _targets(d: dict) -> list[tuple[str, dict]]:
    """(panel title, target) of every PromQL query: panel targets and the dashboard's annotations."""
    out = [(p["title"], t) for p in _panels(d) for t in p.get("targets", []) if p["datasource"] == PROM]
    return out + [(a["name"], a) for a in d["annotations"]["list"] if a.get("datasource") == PROM]


def _sql_targets(d: dict) -> list[tuple[str, dict]]:
    return [(p["title"], t) for p in _panels(d) for t in p.get("targets", []) if p["datasource"] == CH]


def _var_selectors(d: dict) -> list[str]:
    """The series selectors inside label_values(<selector>, <label>) of the query variables."""
    out = []
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
            assert m, q
            out.append(m.group(1))
    return out


def _substitute(expr: str) -> str:
    for k in sorted(VARS, key=len, reverse=True):
        expr = expr.replace(k, VARS[k])
    assert "$" not in expr, expr
    return expr


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(metric sample names from a live scrape, Prometheus scraping the sidecar) after RUNS."""
    prometheus_binaries()
    sc = start_sidecar(tmp_path_factory.mktemp("sidecar"))
    prom = None
    try:
        send_runs(sc.otlp_http)
        sc.flush()
        names: set[str] = {"up"}
        for fam in text_string_to_metric_families(sc.get("/metrics").text):
            names |= {s.name for s in fam.samples}
            names |= {"counter": {fam.name + "_total"}, "gauge": {fam.name},
                      "histogram": {fam.name + x for x in ("_bucket", "_sum", "_count")}}.get(fam.type, set())
        prom = start_prometheus(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{sc.api_port}"])
        prom.wait_for('relyscope_score{metric="pass^1", window="all"}', len(RUNS))
        yield names, prom
    finally:
        if prom is not None:
            prom.stop()
        sc.kill()
        for f in (sc.proc.stdout, sc.proc.stderr):
            if f:
                f.close()


def test_dashboard_structure():
    d = _dashboard()
    assert d["uid"] == "relyscope-reliability" and d["title"]
    panels = _panels(d)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0
        if p["type"] != "row":
            assert p["datasource"] in (PROM, CH), p["title"]
            assert p["targets"] and all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "clickhouse", "agent", "version", "run_kind", "window", "metric", "instance"} <= names
    # the window selector: a query variable over the gauges' window label, feeding every score query
    win = next(v for v in d["templating"]["list"] if v["name"] == "window")
    assert win["query"]["query"].endswith(", window)")
    score_exprs = [t["expr"] for _, t in _targets(d) if re.match(r"relyscope_(score|group_trials)", t["expr"])]
    assert score_exprs and all('window="$window"' in e for e in score_exprs)
    # drift markers: an annotation on the drift flag of the selected group
    [ann] = [a for a in d["annotations"]["list"] if a.get("datasource") == PROM]
    assert "relyscope_drift_flag" in ann["expr"] and ann["enable"] and ann["tagKeys"] == "metric"
    # ClickHouse panels: raw SQL of the plugin's v4 editor
    sql = _sql_targets(d)
    assert {t for t, _ in sql} >= {"Worst tasks of $agent $version ($run_kind) in the time range",
                                   "Rollup history: pass^1 per hour",
                                   "Score history of $metric (window $window) from the scores table"}
    assert all(t["editorType"] == "sql" and t["rawSql"] for _, t in sql)
    # the per-metric CI panel repeats over $metric and draws the band between CI low and CI high
    band = next(p for p in panels if p.get("repeat") == "metric")
    assert {t["legendFormat"] for t in band["targets"]} == {"value", "CI low", "CI high"}
    fill = [pr for o in band["fieldConfig"]["overrides"] for pr in o["properties"] if pr["id"] == "custom.fillBelowTo"]
    assert fill == [{"id": "custom.fillBelowTo", "value": "CI low"}]


def test_dashboard_covers_the_reliability_profile_and_ingest_health():
    d = _dashboard()
    text = " ".join(t["expr"] for _, t in _targets(d))
    keys = set()
    for m in re.finditer(r'metric=~?"([^"]+)"', text):
        keys |= set(m.group(1).split("|"))
    assert {"C_out", "C_traj", "C_res", "R_Con", "R_Rob", "R_fault", "R_env", "R_prompt", "P_cal", "P_AUROC",
            "P_brier", "R_Pred", "R", "S_comp", "S_harm", "R_Saf", "pass^1", "$metric"} <= keys
    assert r"pass\\^[0-9]+" in keys and "pass@[0-9]+" in keys  # pass^k and pass@k by k
    used = set().union(*(promql_names(t["expr"])[0] for _, t in _targets(d)))
    assert {"relyscope_score", "relyscope_score_ci_low", "relyscope_score_ci_high", "relyscope_score_tasks",
            "relyscope_group_trials", "relyscope_spans_received_total", "relyscope_spans_accepted_total",
            "relyscope_spans_deduplicated_total", "relyscope_spans_rejected_total", "relyscope_otlp_warnings_total",
            "relyscope_spool_bytes", "relyscope_spool_oldest_age_seconds", "relyscope_spool_pending_records",
            "relyscope_queue_depth", "relyscope_open_traces", "relyscope_trials_finalized_total",
            "relyscope_store_write_errors_total", "relyscope_backpressure_total",
            "relyscope_store_write_seconds_bucket"} <= used


def test_expressions_use_only_live_metric_names_and_labels(live):
    names, _ = live
    d = _dashboard()
    exprs = [t["expr"] for _, t in _targets(d)] + _var_selectors(d)
    assert len(exprs) > 30
    for e in exprs:
        metrics, labels, per_metric = promql_names(e)
        assert metrics and metrics <= names, (e, metrics - names)
        assert labels <= SCORE_LABELS | OTHER_LABELS, (e, labels)
        for m, ls in per_metric.items():
            if m.startswith("relyscope_score"):
                assert ls <= SCORE_LABELS, (e, ls)


def test_expressions_are_valid_promql_for_real_prometheus(live):
    _, prom = live
    d = _dashboard()
    for title, t in _targets(d):
        body = prom.query(_substitute(t["expr"]))
        assert body["status"] == "success", (title, t["expr"], body)
    for sel in _var_selectors(d):
        body = prom.query(_substitute(sel))
        assert body["status"] == "success" and body["data"]["result"], (sel, body)


def test_core_panels_show_the_hand_computed_values(live):
    _, prom = live
    d = _dashboard()
    by_title = {}
    for title, t in _targets(d):
        by_title.setdefault(title, []).append(t)
    # pass^k by k for shop-agent: tasks (c, n) = (2, 3), (0, 2), (2, 2)
    # k=1: (2/3 + 0 + 1)/3 = 5/9; k=2: (1/3 + 0 + 1)/3 = 4/9; k=3: only the 3-trial task, C(2,3)=0 → 0
    [t] = by_title["pass^k by k"][:1]
    res = prom.wait_for(_substitute(t["expr"]), 3)
    assert {s["metric"]["k"]: float(s["value"][1]) for s in res} == pytest.approx({"1": 5 / 9, "2": 4 / 9, "3": 0.0})
    # the repeated CI panel with $metric = pass^1: value 5/9 inside [CI low, CI high]
    band = {t["legendFormat"]: float(prom.wait_for(_substitute(t["expr"]), 1)[0]["value"][1])
            for t in by_title["$metric"]}
    assert band["value"] == pytest.approx(5 / 9)
    assert band["CI low"] <= band["value"] <= band["CI high"]
    # valid trials stat: 3 + 2 + 2
    [t] = by_title["Valid trials"]
    assert float(prom.wait_for(_substitute(t["expr"]), 1)[0]["value"][1]) == 7


def test_grafana_provisioning_matches_dashboard_and_compose():
    ch = yaml.safe_load((ROOT / "grafana" / "provisioning" / "datasources" / "clickhouse.yml").read_text())
    [chs] = ch["datasources"]
    cvar = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "clickhouse")
    assert chs["type"] == cvar["query"] == "grafana-clickhouse-datasource" and cvar["current"]["value"] == chs["uid"]
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    chsrv = compose["services"]["clickhouse"]
    assert chs["jsonData"]["host"] == "clickhouse" and chs["jsonData"]["protocol"] == "http"
    assert str(chs["jsonData"]["port"]) in {str(p).split(":")[-1] for p in chsrv["ports"]}
    env = chsrv["environment"]
    assert (chs["jsonData"]["username"], chs["secureJsonData"]["password"], chs["jsonData"]["defaultDatabase"]) == (
        env["CLICKHOUSE_USER"], env["CLICKHOUSE_PASSWORD"], env["CLICKHOUSE_DB"])
    assert compose["services"]["grafana"]["environment"]["GF_INSTALL_PLUGINS"].split()[0] == chs["type"]
    ds = yaml.safe_load((ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    [src] = ds["datasources"]
    assert src["type"] == "prometheus" and src["url"] == "http://prometheus:9090"
    dvar = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "datasource")
    assert dvar["query"] == "prometheus" and dvar["current"]["value"] == src["uid"]
    prov = yaml.safe_load((ROOT / "grafana" / "provisioning" / "dashboards" / "relyscope.yml").read_text())
    [p] = prov["providers"]
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["../grafana/dashboards"] == p["options"]["path"]
    assert mounts["../grafana/provisioning/datasources"] == "/etc/grafana/provisioning/datasources"


# ---- ClickHouse panels against chDB ---------------------------------------------------------------

H = (int(time.time()) // 3600 - 3) * 3600  # the start of the hour three hours ago
FROM_S, TO_S = int(time.time()) - 86400, int(time.time()) + 60  # the dashboard's time range: last 24 h
INTERVAL_S = 60


def expand_macros(sql: str, *, extra: dict[str, str] | None = None) -> str:
    """``sql`` as the plugin's backend sends it (macros of grafana/clickhouse-datasource
    pkg/macros/macros.go) after Grafana's variable interpolation (VARS; ``:singlequote`` quotes)."""
    f, t = FROM_S, TO_S
    rules = [
        (r"\$__timeFilter_ms\(([^)]+)\)", lambda m: f"{m[1]} >= fromUnixTimestamp64Milli({f * 1000}) AND "
                                                  f"{m[1]} <= fromUnixTimestamp64Milli({t * 1000})"),
        (r"\$__timeFilter\(([^)]+)\)", lambda m: f"{m[1]} >= toDateTime({f}) AND {m[1]} <= toDateTime({t})"),
        (r"\$__timeInterval\(([^)]+)\)", lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL {INTERVAL_S} second)"),
        (r"\$__fromTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({f * 1000})"),
        (r"\$__toTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({t * 1000})"),
        (r"\$__fromTime\b", lambda m: f"toDateTime({f})"),
        (r"\$__toTime\b", lambda m: f"toDateTime({t})"),
        (r"\$__interval_s\b", lambda m: str(INTERVAL_S)),
    ]
    for pat, rep in rules:
        sql = re.sub(pat, rep, sql)
    values = {k.lstrip("$"): v for k, v in VARS.items()} | (extra or {})
    sql = re.sub(r"\$\{(\w[\w.]*):singlequote\}", lambda m: "'" + values[m[1]].replace("'", "\\'") + "'", sql)
    sql = re.sub(r"\$\{(\w[\w.]*)\}", lambda m: values[m[1]], sql)
    sql = re.sub(r"\$(\w+)", lambda m: values[m[1]], sql)
    assert "$" not in sql, sql
    return sql


@pytest.fixture(scope="module")
def ch_store(tmp_path_factory):
    """A store (database relyscope, as the panels name it) with the runs of shop-agent 3.1
    production: task A in hour H (success, failure, failure), tasks B (success, success, unknown)
    and C (failure, failure) in hour H+1; the rollups synced; score rows; the spans of C's last run."""
    import dataclasses
    import random

    from live_traffic import make_trial
    from relyscope.model import CanonicalSpan
    from relyscope.scoring.rollup import Rollup
    from relyscope.store import Store

    st = Store(f"chdb://{tmp_path_factory.mktemp('grafana-ch') / 'data'}", database="relyscope")
    rng = random.Random(3)
    runs = [("A", H + 600, "success"), ("A", H + 1200, "failure"), ("A", H + 1800, "failure"),
            ("B", H + 3600 + 100, "unknown"), ("B", H + 3600 + 600, "success"), ("B", H + 3600 + 1200, "success"),
            ("C", H + 3600 + 1800, "failure"), ("C", H + 3600 + 2400, "failure")]
    trials = []
    for i, (task, end_s, outcome) in enumerate(runs):
        t = make_trial(rng, i, task=task, end_ns=end_s * 10**9, agent="shop-agent", version="3.1")
        trials.append(dataclasses.replace(t, outcome=outcome, status="complete", perturbation_family=None,
                                          tool_errors=0, start_ns=end_s * 10**9 - 10**9))
    st.insert_trials(trials)
    Rollup(st, None).sync()
    st.insert_scores([
        {"formula_set": "relyscope-v1", "agent": "shop-agent", "version": "3.1", "run_kind": "production",
         "metric": m, "value": v, "ci_low": v - 0.1, "ci_high": v + 0.1, "n_tasks": 3, "n_trials": 8,
         "window_start": 0.0, "window_end": at, "n_boot": 100, "params": json.dumps({"ci": 0.95, "window": w}),
         "computed_at": at, "inputs": f"{m}{w}{at}"}
        for m, w, v, at in (("pass^1", "all", 0.5, H + 1000), ("pass^1", "all", 0.6, H + 5000),
                            ("pass^1", "1h", 0.9, H + 5000), ("C_out", "all", 0.7, H + 5000))])
    c_last = trials[-1]
    st.insert_spans([
        CanonicalSpan(trace_id=c_last.trace_id, span_id="a" * 16, parent_span_id="", name="agent.run", kind=1,
                      start_ns=c_last.start_ns, end_ns=c_last.end_ns, attributes={"gen_ai.agent.name": "shop-agent"},
                      resource={"service.name": "shop"}),
        CanonicalSpan(trace_id=c_last.trace_id, span_id="b" * 16, parent_span_id="a" * 16, name="tool.refund",
                      kind=1, start_ns=c_last.start_ns + 1000, end_ns=c_last.start_ns + 2_500_000,
                      resource={"service.name": "shop"})])
    yield st, {t.task_id + str(i): t for i, t in enumerate(trials)}
    st.close()


def _run(st, sql: str) -> tuple[list[str], list[tuple]]:
    res = st._client.query(sql)
    return list(res.column_names), res.result_rows


def test_clickhouse_panels_run_in_chdb_with_macros_substituted(ch_store):
    st, trials = ch_store
    by_title = {title: t for title, t in _sql_targets(_dashboard())}
    cols, rows = _run(st, expand_macros(by_title["Worst tasks of $agent $version ($run_kind) in the time range"]["rawSql"]))
    assert cols == ["task", "trials", "known_outcomes", "successes", "success_rate", "last_failed_trace"]
    # C: 0 of 2; A: 1 of 3; B: 2 of 2 known (3 trials, one unknown), no failed run
    assert [r[:5] for r in rows] == [("C", 2, 2, 0, 0.0), ("A", 3, 3, 1, pytest.approx(1 / 3)), ("B", 3, 2, 2, 1.0)]
    assert [r[5] for r in rows] == [trials["C7"].trace_id, trials["A2"].trace_id, ""]

    cols, rows = _run(st, expand_macros(by_title["Rollup history: pass^1 per hour"]["rawSql"]))
    assert cols == ["time", "pass1", "trials"]
    # hour H: task A 1/3; hour H+1: tasks B 2/2 and C 0/2 → (1 + 0) / 2
    assert [(r[0].timestamp(), r[1], r[2]) for r in rows] == [(H, pytest.approx(1 / 3), 3), (H + 3600, 0.5, 5)]

    cols, rows = _run(st, expand_macros(by_title["Score history of $metric (window $window) from the scores table"]["rawSql"]))
    assert cols == ["time", "metric", "value", "ci_low", "ci_high"]
    assert [(r[0].timestamp(), r[1], r[2]) for r in rows] == [(H + 1000, "pass^1", 0.5), (H + 5000, "pass^1", 0.6)]


def test_worst_task_trace_link_opens_the_trace_of_that_run(ch_store):
    """The data link of the worst-tasks table opens Explore on the ClickHouse data source with a
    trace query; with ``${__value.raw}`` = the linked trace id it returns that trace's spans in
    the columns Grafana's trace view reads."""
    import urllib.parse

    st, trials = ch_store
    panel = next(p for p in _panels(_dashboard()) if p["title"].startswith("Worst tasks"))
    [link] = [pr["value"][0] for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "last_failed_trace"
              for pr in o["properties"] if pr["id"] == "links"]
    url = urllib.parse.urlparse(link["url"])
    assert url.path == "/explore"
    pane = json.loads(urllib.parse.parse_qs(url.query)["panes"][0])["trace"]
    [q] = pane["queries"]  # format 3: the plugin's trace frame (0 time series, 1 table, 2 logs)
    assert pane["datasource"] == "${clickhouse}" and q["datasource"] == CH and q["queryType"] == "traces" and q["format"] == 3
    tid = trials["C7"].trace_id
    cols, rows = _run(st, expand_macros(q["rawSql"], extra={"__value.raw": tid}))
    assert cols == ["traceID", "spanID", "parentSpanID", "serviceName", "operationName", "startTime", "duration",
                    "tags", "serviceTags", "statusCode"]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        (tid, "a" * 16, "", "shop", "agent.run"), (tid, "b" * 16, "a" * 16, "shop", "tool.refund")]
    assert rows[0][5] == trials["C7"].start_ns // 10**6 and rows[1][6] == pytest.approx(2.499)  # ms
    assert {"key": "gen_ai.agent.name", "value": "shop-agent"} in rows[0][7]
    assert [r[9] for r in rows] == [0, 0]  # the trace view's status: 2 = error (as the plugin's own query)
