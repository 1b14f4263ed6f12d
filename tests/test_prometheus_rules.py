"""The shipped Prometheus alert rules and deploy/ configuration, checked by the real ``promtool``.

- ``promtool check rules`` and ``promtool test rules`` (deploy/alerts/relyscope-rules.test.yml:
  every alert firing and not firing); a mutated copy of the rules must fail those unit tests.
- every rule only reads metric names the sidecar exposes (relyscope/exporter/prom.py) and the
  reliability selectors only use the labels agent/version/run_kind/metric/k.
- ``promtool check config deploy/prometheus.yml``.
- docker-compose, the Kubernetes manifest and the collector config are validated as YAML only
  (no Docker engine or cluster here): services, ports, mounted files, RELYSCOPE_* names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from test_prometheus_scrape import prometheus_binaries, promql_names

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "alerts" / "relyscope-rules.yml"
RULE_TESTS = DEPLOY / "alerts" / "relyscope-rules.test.yml"
SCORE_LABELS = {"agent", "version", "run_kind", "metric", "k", "window"}


def exposed_metric_names() -> set[str]:
    """Sample names the sidecar exposes, read from prom.py's metric family constructors."""
    src = (ROOT / "relyscope" / "exporter" / "prom.py").read_text()
    names: set[str] = set()
    for kind, name in re.findall(r'(GaugeMetricFamily|CounterMetricFamily|Histogram)\(\s*"([a-z_]+)"', src):
        names |= {"GaugeMetricFamily": {name}, "CounterMetricFamily": {name + "_total"},
                  "Histogram": {name + "_bucket", name + "_sum", name + "_count"}}[kind]
    return names


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    _, tool = prometheus_binaries()
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_check_rules():
    r = _promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_promtool_unit_tests_pass():
    r = _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@pytest.mark.parametrize("old,new", [
    ('relyscope_score{metric="S_comp", run_kind=~"production|canary", window="1h"} < 1',
     'relyscope_score{metric="S_comp", run_kind=~"production", window="1h"} < 1'),  # canary unseen
    ('relyscope:success_burn_rate{window="5m"} > 14.4', 'relyscope:success_burn_rate{window="5m"} > 20'),
    ("relyscope_drift_flag == 1", "relyscope_drift_flag >= 0"),  # unflagged drops would page
    # the SRE workbook's factors and short windows (6h/30m page at 6, 3d/6h ticket at 1)
    ('relyscope:success_burn_rate{window="30m"} > 6', 'relyscope:success_burn_rate{window="30m"} > 9'),
    ('relyscope:success_burn_rate{window="3d"} > 1', 'relyscope:success_burn_rate{window="3d"} > 2'),
    ('relyscope:success_burn_rate{window="6h"} > 1', 'relyscope:success_burn_rate{window="3d"} > 1'),
    ('relyscope:success_burn_rate{window="5m"} > 14.4', 'relyscope:success_burn_rate{window="1h"} > 14.4'),
    ("expr: relyscope_spool_oldest_age_seconds > 900", "expr: relyscope_spool_oldest_age_seconds > 9000"),
])
def test_unit_tests_catch_a_broken_rule(tmp_path, old, new):
    text = RULES.read_text()
    assert text.count(old) == 1, old
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    r = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert r.returncode != 0, r.stdout


def test_every_alert_is_tested_firing_and_silent():
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    records = {r["record"] for r in _rules() if "record" in r}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    silent = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert alerts - firing == set()
    assert alerts - silent == set()
    exprs = {c["expr"] for t in tests for c in t.get("promql_expr_test", [])}
    assert records <= exprs
    assert {"RelyscopeDriftDetected", "RelyscopeSLOFastBurn", "RelyscopeSLOSlowBurn",
            "RelyscopeReliabilityBelowFloor", "RelyscopeSafetyViolation",
            "RelyscopeSpansRejected", "RelyscopeSpoolStale", "RelyscopeSpoolGrowing",
            "RelyscopeStoreWriteErrors", "RelyscopeBackpressure", "RelyscopeNoSpans"} <= alerts
    for r in _rules():
        if "alert" in r:
            assert r["labels"]["severity"] in {"warning", "critical"}
            assert r["annotations"]["summary"]


def test_every_alert_has_for_annotations_and_a_runbook_entry():
    """Both rule files: a ``for:`` duration, a summary, and a row (or section) in the README's
    runbook naming the alert."""
    runbook = (ROOT / "README.md").read_text()
    for path in (RULES, DEPLOY / "alerts" / "relyscope-shadow-rules.yml"):
        for g in yaml.safe_load(path.read_text())["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    assert r.get("for"), r["alert"]
                    assert r["annotations"].get("summary"), r["alert"]
                    assert f"`{r['alert']}`" in runbook or f"Runbook: {r['alert']}" in runbook, r["alert"]


def test_rules_use_only_exposed_metrics_and_score_labels():
    exposed = exposed_metric_names()
    # sanity of the reading of prom.py itself
    assert {"relyscope_score", "relyscope_score_ci_high", "relyscope_spans_rejected_total",
            "relyscope_store_write_seconds_bucket", "relyscope_spool_bytes"} <= exposed
    records = {r["record"] for r in _rules() if "record" in r}
    for r in _rules():
        metrics, _labels, per_metric = promql_names(r["expr"])
        assert metrics <= exposed | records | {"up"}, (r.get("alert") or r.get("record"), metrics - exposed)
        for m, ls in per_metric.items():
            if m.startswith("relyscope_score") or m == "relyscope_group_trials":
                assert ls <= SCORE_LABELS | {"kind"}, (m, ls)


def test_promtool_check_prometheus_config():
    r = _promtool("check", "config", str(DEPLOY / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rule files found" in r.stdout  # the relative rule_files paths resolve to deploy/alerts
    cfg = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["relyscope"]["static_configs"][0]["targets"] == ["relyscope:9464"]


# --------------------------------------------------------------------------------------------
# deploy/ files that cannot be run here: parsed and cross-checked only
def _settings_env_names() -> set[str]:
    from relyscope.config import Settings
    return {"RELYSCOPE_" + f.upper() for f in Settings.model_fields}


def _port(spec) -> tuple[int, int]:
    host, _, cont = str(spec).rpartition(":")
    return int(host.rsplit(":", 1)[-1]), int(cont)


def test_docker_compose_is_consistent_yaml():
    text = (DEPLOY / "docker-compose.yml").read_text()
    assert "no Docker engine" in text.split("\nname:")[0]  # header says it was not run
    c = yaml.safe_load(text)
    sv = c["services"]
    assert set(sv) == {"otel-collector", "relyscope", "clickhouse", "prometheus", "grafana"}
    assert {_port(p) for p in sv["otel-collector"]["ports"]} >= {(4317, 4317), (4318, 4318)}
    assert (9464, 9464) in {_port(p) for p in sv["relyscope"]["ports"]}
    assert {"4317", "4318"} <= set(sv["relyscope"]["expose"])
    assert (9090, 9090) in {_port(p) for p in sv["prometheus"]["ports"]}
    assert (3000, 3000) in {_port(p) for p in sv["grafana"]["ports"]}
    assert (8123, 8123) in {_port(p) for p in sv["clickhouse"]["ports"]}
    env = sv["relyscope"]["environment"]
    assert set(env) <= _settings_env_names()  # (MALLOC_ARENA_MAX comes with the image: deploy/Dockerfile)
    assert env["RELYSCOPE_STORE"].startswith("http://") and "@clickhouse:8123/" in env["RELYSCOPE_STORE"]
    assert env["RELYSCOPE_API"].endswith(":9464") and env["RELYSCOPE_OTLP_GRPC"].endswith(":4317")
    assert sv["relyscope"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / sv["relyscope"]["build"]["context"] / "deploy" / "Dockerfile").is_file()
    # every bind-mounted host path exists (relative to deploy/)
    for name, s in sv.items():
        for v in s.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), (name, src)
            else:
                assert src in c["volumes"], (name, src)
    # the collector forwards to the compose service name of the sidecar
    col = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
    assert col["exporters"]["otlp/relyscope"]["endpoint"] == "relyscope:4317"


def test_otel_collector_config():
    text = (DEPLOY / "otel-collector.yaml").read_text()
    col = yaml.safe_load(text)
    assert set(col["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipe = col["service"]["pipelines"]["traces"]
    assert pipe["receivers"] == ["otlp"] and pipe["exporters"] == ["otlp/relyscope"]
    assert set(pipe["processors"]) <= set(col["processors"])
    # the load-balancing-by-trace-id example is there, commented out
    lb = "\n".join(l.lstrip()[2:] for l in text.splitlines() if l.lstrip().startswith("# "))
    assert "loadbalancing:" in lb and "routing_key: traceID" in lb


def test_kubernetes_sidecar_manifest():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "sidecar.yaml").read_text()) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    tpl = dep["spec"]["template"]
    assert tpl["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9464",
                                              "prometheus.io/path": "/metrics"}
    assert dep["spec"]["selector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
    spec = tpl["spec"]
    containers = spec.get("initContainers", []) + spec["containers"]
    sc = next(c for c in containers if c["name"] == "relyscope")
    agent = next(c for c in containers if c["name"] == "agent")
    assert {p["containerPort"] for p in sc["ports"]} == {4317, 4318, 9464}
    named = {p["name"]: p["containerPort"] for p in sc["ports"]}
    # a full spool must neither restart the sidecar nor take the agent's pod out of service:
    # every probe of the native sidecar is liveness (/livez), never /readyz or /healthz
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = sc[kind]["httpGet"]
        assert probe["path"] == "/livez" and named.get(probe["port"], probe["port"]) == 9464, kind
    env = {e["name"]: e for e in sc["env"]}
    # every variable is a relyscope setting, or one the sidecar's process documents it reads
    # (MALLOC_ARENA_MAX: glibc's, README "Memory bounds")
    assert set(env) <= _settings_env_names() | {"MALLOC_ARENA_MAX"}
    assert env["MALLOC_ARENA_MAX"]["value"] == "2"
    assert env["RELYSCOPE_API"]["value"].endswith(":9464")
    mounts = {m["name"]: m["mountPath"] for m in sc["volumeMounts"]}
    assert env["RELYSCOPE_SPOOL_DIR"]["value"].startswith(mounts["relyscope-data"])
    assert "relyscope-data" in {v["name"] for v in spec["volumes"]}
    agent_env = {e["name"]: e.get("value") for e in agent["env"]}
    assert agent_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4317"


def test_dockerfile_installs_sidecar_extra_with_constraints():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim", text, re.M)
    assert "pip install -c constraints.txt '.[sidecar]'" in text
    assert re.search(r"^EXPOSE 4317 4318 9464$", text, re.M)
    for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for f in src.split():
            assert (ROOT / f).exists(), f
