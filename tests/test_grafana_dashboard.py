"""The provisioned Grafana dashboard against a live sidecar and a real Prometheus.

Every PromQL expression of grafana/dashboards/relyscope-reliability.json (panel targets and
template-variable queries) must reference only metric names found in a live /metrics scrape of the
sidecar, only the labels the sidecar sets (agent/version/run_kind/metric/k on the reliability
gauges), and be accepted by a real Prometheus (template variables substituted) — and the core
panels must return the values worked out by hand for the runs sent.
"""

from __future__ import annotations

import json
import re
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


def _targets(d: dict) -> list[tuple[str, dict]]:
    return [(p["title"], t) for p in _panels(d) for t in p.get("targets", [])]


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
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "agent", "version", "run_kind", "metric", "instance"} <= names
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
