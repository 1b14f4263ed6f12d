"""A real Prometheus scrapes a real sidecar: the gauges on /metrics reach PromQL with the values
worked out by hand, the exposition passes ``promtool check metrics`` and the shipped alert rules
load and evaluate without error on live data.

Prometheus is the Debian package ``prometheus`` (``prometheus`` + ``promtool``); when missing it is
installed with apt-get if possible, else the tests are skipped (never in CI, where .ci/run installs
it and a missing binary is a failure). Prometheus runs from its binary on a loopback port with a tmp
config and tmp storage, and is stopped by its PID.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import start_sidecar
from relyscope.testing import free_ports

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "alerts" / "relyscope-rules.yml"

__all__ = ["prometheus_binaries", "PrometheusProc", "start_prometheus", "stop_all", "send_runs", "RUNS", "promql_names"]

_INSTALL_TRIED: list[bool] = []


def prometheus_binaries() -> tuple[str, str]:
    """(prometheus, promtool) paths; installs the Debian package once if missing, else skips.

    In CI (``CI`` set) a missing Prometheus fails instead of skipping.
    """
    def found() -> tuple[str | None, str | None]:
        return shutil.which("prometheus"), shutil.which("promtool")

    prom, tool = found()
    if (prom is None or tool is None) and not _INSTALL_TRIED:
        _INSTALL_TRIED.append(True)
        if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            cmd = ["apt-get", "install", "-y", "-qq", "prometheus"]
            try:
                if subprocess.run(cmd, env=env, capture_output=True, timeout=900).returncode != 0:
                    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
                    subprocess.run(cmd, env=env, capture_output=True, timeout=900)
            except (OSError, subprocess.TimeoutExpired):
                pass
        prom, tool = found()
    if prom is None or tool is None:
        msg = "prometheus/promtool absent and not installable (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return prom, tool


@dataclass
class PrometheusProc:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> dict:
        """GET /api/v1/query; returns the decoded JSON body (``status``, ``data``/``error``)."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30)
        return r.json()

    def wait_for(self, expr: str, n: int, timeout_s: float = 45) -> list[dict]:
        """Poll an instant query until it returns at least ``n`` series (bounded)."""
        deadline = time.monotonic() + timeout_s
        res: list[dict] = []
        while time.monotonic() < deadline:
            body = self.query(expr)
            assert body["status"] == "success", body
            res = body["data"]["result"]
            if len(res) >= n:
                return res
            time.sleep(0.5)
        raise AssertionError(f"{expr!r}: {len(res)} series after {timeout_s}s, wanted {n}; "
                             f"prometheus log tail: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_prometheus(workdir: Path, targets: list[str], *, rule_files: list[Path] = (),
                     timeout_s: float = 45) -> PrometheusProc:
    """Run ``prometheus`` on a free loopback port scraping ``targets`` (host:port) every 1 s."""
    prom, _ = prometheus_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    rules = "".join(f"\n  - {p}" for p in rule_files)
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files:{rules}\n" if rule_files else "")
        + "scrape_configs:\n  - job_name: relyscope\n    metrics_path: /metrics\n"
        + f"    static_configs:\n      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    last = ""
    for _attempt in range(3):  # the free port may be taken between probe and bind: retry
        (port,) = free_ports()
        log = workdir / f"prometheus-{port}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                [prom, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=fh, stderr=subprocess.STDOUT)
        pp = PrometheusProc(proc, port, log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(pp.url + "/-/ready", timeout=2).status_code == 200:
                    return pp
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pp.stop()
        last = log.read_text()[-2000:]
    raise RuntimeError(f"prometheus did not become ready: {last}")


def stop_all(prom: PrometheusProc | None, sc) -> None:
    """Stop the Prometheus (if started), then the sidecar (by their PIDs)."""
    if prom is not None:
        prom.stop()
    sc.kill()


# ---------------------------------------------------------------------------------------------
# Agent runs sent over OTLP/HTTP JSON. (agent, version) → task → outcomes of its trials.
RUNS: dict[tuple[str, str], dict[str, list[bool]]] = {
    ("shop-agent", "3.1"): {"t-a": [True, True, False], "t-b": [False, False], "t-c": [True, True]},
    ("other-agent", "1"): {"t-x": [True, True]},
}
SPANS_PER_TRIAL = 3  # root + chat + execute_tool


def _attr(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _trial_spans(task: str, ok: bool, t0: int) -> list[dict]:
    trace, root = secrets.token_hex(16), secrets.token_hex(8)
    ms = 1_000_000

    def span(span_id, parent, name, start, end, attrs):
        d = {"traceId": trace, "spanId": span_id, "name": name, "kind": 1,
             "startTimeUnixNano": str(t0 + start * ms), "endTimeUnixNano": str(t0 + end * ms),
             "attributes": [_attr(k, v) for k, v in attrs.items()], "status": {}}
        if parent:
            d["parentSpanId"] = parent
        return d

    return [
        span(root, None, "invoke_agent", 0, 30, {
            "gen_ai.operation.name": "invoke_agent", "relyscope.task.id": task,
            "relyscope.outcome": "success" if ok else "failure"}),
        span(secrets.token_hex(8), root, "chat m", 1, 10, {
            "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5}),
        span(secrets.token_hex(8), root, "execute_tool lookup", 11, 20, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}),
    ]


def send_runs(otlp_http: str, runs: dict = RUNS) -> int:
    """POST every trial of ``runs`` as OTLP/JSON to ``{otlp_http}/v1/traces``; returns spans sent."""
    t0 = time.time_ns() - 60 * 1_000_000_000
    sent = 0
    for (agent, version), tasks in runs.items():
        spans = [s for task, outcomes in tasks.items() for ok in outcomes for s in _trial_spans(task, ok, t0)]
        body = {"resourceSpans": [{
            "resource": {"attributes": [_attr("service.name", agent), _attr("service.version", version)]},
            "scopeSpans": [{"scope": {"name": "relyscope-test"}, "spans": spans}]}]}
        r = httpx.post(otlp_http + "/v1/traces", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert not r.json().get("partialSuccess", {}).get("rejectedSpans"), r.text
        sent += len(spans)
    return sent


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A sidecar that has scored RUNS, and a Prometheus (with the shipped rules) scraping it."""
    prometheus_binaries()
    sc = start_sidecar(tmp_path_factory.mktemp("sidecar"))
    prom = None
    try:
        sent = send_runs(sc.otlp_http)
        assert sent == SPANS_PER_TRIAL * sum(len(o) for t in RUNS.values() for o in t.values())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sc.get("/api/v1/spans").json()["trials"] < 9:
            time.sleep(0.2)
        sc.flush()
        prom = start_prometheus(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{sc.api_port}"],
                                rule_files=[RULES])
        yield sc, prom, sent
    finally:
        stop_all(prom, sc)


def _by_agent(series: list[dict]) -> dict[str, float]:
    return {s["metric"]["agent"]: float(s["value"][1]) for s in series}


def test_pass_hat_1_in_prometheus_equals_hand_computation(scraped):
    _, prom, _ = scraped
    assert len(prom.wait_for('relyscope_score{metric="pass^1"}', 10)) == 10  # 2 groups × 5 windows
    res = prom.wait_for('relyscope_score{metric="pass^1", window="all"}', 2)
    # shop-agent: per task p̂ = 2/3, 0/2, 2/2 → pass^1 = (2/3 + 0 + 1) / 3 = 5/9
    # other-agent: 2/2 → 1
    assert len(res) == 2
    assert _by_agent(res) == pytest.approx({"shop-agent": 5 / 9, "other-agent": 1.0}, abs=1e-9)
    labels = {s["metric"]["agent"]: s["metric"] for s in res}
    assert labels["shop-agent"] == {"__name__": "relyscope_score", "agent": "shop-agent", "version": "3.1",
                                    "run_kind": "production", "metric": "pass^1", "k": "1",
                                    "window": "all", "job": "relyscope", "instance": labels["shop-agent"]["instance"]}


def test_other_metrics_and_counters_in_prometheus(scraped):
    _, prom, sent = scraped
    q = '{agent="shop-agent", version="3.1", run_kind="production", window="all"}'
    # pass^2 = mean_t C(c,2)/C(n,2) = (C(2,2)/C(3,2) + 0 + 1) / 3 = (1/3 + 1) / 3 = 4/9
    assert float(prom.wait_for(f'relyscope_score{{metric="pass^2", agent="shop-agent", window="all"}}', 1)[0]["value"][1]) \
        == pytest.approx(4 / 9, abs=1e-9)
    # C_out = mean_t (2p̂−1)² = ((1/3)² + 1 + 1) / 3 = 19/27; no k label (empty → absent)
    c_out = prom.wait_for(f'relyscope_score{{metric="C_out", agent="shop-agent", window="all"}}', 1)[0]
    assert float(c_out["value"][1]) == pytest.approx(19 / 27, abs=1e-9)
    assert "k" not in c_out["metric"]
    # 3 tasks behind pass^1; 7 valid trials
    assert float(prom.wait_for(f'relyscope_score_tasks{{metric="pass^1", agent="shop-agent", window="all"}}', 1)[0]["value"][1]) == 3
    assert float(prom.wait_for('relyscope_group_trials' + q[:-1] + ', kind="valid"}', 1)[0]["value"][1]) == 7
    # every span sent was accepted: 9 trials × 3 spans
    assert sent == 27
    assert float(prom.wait_for("relyscope_spans_accepted_total", 1)[0]["value"][1]) == 27
    assert float(prom.wait_for('up{job="relyscope"}', 1)[0]["value"][1]) == 1


def test_ci_bounds_bracket_the_value(scraped):
    _, prom, _ = scraped
    # a CI is an interval containing the point estimate (pass^1 of shop-agent = 5/9)
    res = prom.wait_for('relyscope_score_ci_low{metric="pass^1", agent="shop-agent", window="all"} <= '
                        'on(agent, version, run_kind, metric, k, window) '
                        'relyscope_score{metric="pass^1", agent="shop-agent", window="all"}', 1)
    assert float(res[0]["value"][1]) <= 5 / 9
    res = prom.wait_for('relyscope_score_ci_high{metric="pass^1", agent="shop-agent", window="all"} >= '
                        'on(agent, version, run_kind, metric, k, window) '
                        'relyscope_score{metric="pass^1", agent="shop-agent", window="all"}', 1)
    assert float(res[0]["value"][1]) >= 5 / 9


def test_shipped_rules_load_and_evaluate_on_live_data(scraped):
    _, prom, _ = scraped
    deadline = time.monotonic() + 30
    while True:
        groups = httpx.get(prom.url + "/api/v1/rules", timeout=30).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r["health"] != "unknown" for r in rules):  # every rule evaluated once
            break
        assert time.monotonic() < deadline, rules
        time.sleep(0.5)
    assert len(rules) == 22  # relyscope-rules.yml: 6 recording rules + 16 alerts
    assert {r["name"]: r["health"] for r in rules if r["health"] != "ok"} == {}
    # the floors recording rule is evaluated by the server: 4 floors, pass^1's is 0.5
    floors = prom.wait_for("relyscope:score_floor", 4)
    assert {s["metric"]["metric"]: float(s["value"][1]) for s in floors} == \
        {"pass^1": 0.5, "C_out": 0.5, "R_Con": 0.6, "R": 0.5}


def test_promtool_check_metrics_lints_clean(scraped):
    sc, _, _ = scraped
    _, promtool = prometheus_binaries()
    text = sc.get("/metrics").text
    assert "relyscope_score{" in text
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# PromQL name extraction (used by the rule and dashboard tests)
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
                 "and", "or", "unless", "inf", "nan"}
_LABEL_LISTS = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)"


def promql_names(expr: str) -> tuple[set[str], set[str], dict[str, set[str]]]:
    """(metric names, label names, {metric: labels in its selectors}) referenced by a PromQL expr.

    A small tokenizer, enough for hand-written rules and dashboards: string literals, range
    durations and ``offset`` are dropped; identifiers followed by ``(`` are functions/aggregations.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\[[^\]]*\]", "", s)
    labels: set[str] = set()
    for m in re.finditer(_LABEL_LISTS, s):
        labels |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    s = re.sub(_LABEL_LISTS, " ", s)
    per_metric: dict[str, set[str]] = {}
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}", s):
        ls = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)))
        labels |= ls
        if m.group(1) and m.group(1) not in _PROMQL_WORDS:
            per_metric.setdefault(m.group(1), set()).update(ls)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", s)
    metrics = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", s):
        if m.group(2) is None and m.group(1).lower() not in _PROMQL_WORDS:
            metrics.add(m.group(1))
    return metrics, labels, per_metric
