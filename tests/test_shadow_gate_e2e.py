"""Release gate end to end: 24 production tasks replayed against the incumbent (1.0), an equal
candidate (1.1, same code) and a deliberately worse one (2.0: refunds half the order total);
``relyscope gate`` is run as a process and judged by its exit code and reasons."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from relyscope.testing import RELYSCOPE_BIN, start_sidecar
from relyscope.testing import free_ports
from tests.test_shadow_e2e import ROOT, Agent, _ports_env, replay_and_wait, run_production

POLICY = """\
agent: refund-agent
side_effects:
  issue_refund: irreversible
rules:
  - id: never-delete
    type: forbidden_tool
    severity: critical
    tools: [delete_account]
  - id: refund-cap
    type: argument_constraint
    severity: medium
    tools: [issue_refund]
    path: $.amount
    op: "<="
    value: 1000
"""


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    (tmp / "policy.yaml").write_text(POLICY)
    ports = dict(zip(("1.0", "1.1", "2.0"), free_ports(3), strict=True))
    sc = start_sidecar(tmp / "sc", extra_env=_ports_env(
        ports, RELYSCOPE_SHADOW_K="3", RELYSCOPE_SHADOW_FAMILIES='["nominal"]', RELYSCOPE_SHADOW_CONCURRENCY="4",
        RELYSCOPE_POLICY_FILE=str(tmp / "policy.yaml")))
    effects = tmp / "effects.log"
    agents = []
    try:
        run_production(sc, effects, tasks=24, runs=1, version="1.0")
        prod = sc.trials(run_kind="production")
        for version, flags in (("1.0", ()), ("1.1", ()), ("2.0", ("--worse",))):
            agents.append(Agent(sc, effects, version, ports[version], *flags))  # one by one: all stopped
        replay_and_wait(sc, [t["trial_id"] for t in prod], timeout_s=240)
        yield sc, tmp, effects
    finally:
        for a in agents:
            a.stop()
        sc.kill()


def gate(sc, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RELYSCOPE_BIN), "gate", "--api", sc.api, *args], capture_output=True, text=True,
                          timeout=300)


def test_equal_candidate_passes(gated):
    sc, _, _ = gated
    p = gate(sc, "--baseline", "1.0", "--candidate", "1.1", "--format", "json")
    res = json.loads(p.stdout)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert res["verdict"] == "pass"
    assert res["deltas"]["success_rate"]["delta"] == 0.0
    assert res["shared_tasks"] == 24


def test_worse_candidate_blocks_with_the_metric_named(gated):
    sc, _, _ = gated
    p = gate(sc, "--baseline", "1.0", "--candidate", "2.0", "--format", "json")
    assert p.returncode == 1, (p.stdout, p.stderr)
    res = json.loads(p.stdout)
    assert res["verdict"] == "block"
    # every 2.0 replay refunds half: its side effects differ from the verified production refund
    assert res["deltas"]["success_rate"]["baseline"] == 1.0 and res["deltas"]["success_rate"]["candidate"] == 0.0
    assert any(r["name"] == "success_rate" and r["verdict"] == "block" for r in res["reasons"])
    m = sc.get("/metrics").text
    assert ('relyscope_gate_verdict{agent="refund-agent",baseline="1.0",candidate="2.0",mode="shadow",verdict="block"} 1.0'
            in m)
    # what the experiment was, also when its checks passed
    exp = res["experiment"]
    # sandbox misses are judged per side (the worse of the two): 72 replays of each version ran
    assert exp["pending_replays"] == 0 and exp["sandbox"]["sandbox_misses"] == 0 and exp["sandbox"]["replays"] == 72
    assert exp["harness"]["replays"] == 72 and exp["harness"]["agreeing"] == 72


def test_table_output_names_verdict(gated):
    sc, _, _ = gated
    p = gate(sc, "--baseline", "1.0", "--candidate", "2.0")
    assert p.returncode == 1 and "BLOCK" in p.stdout and "success_rate" in p.stdout


def test_unknown_version_is_an_error_naming_the_known_ones(gated):
    sc, _, _ = gated
    p = gate(sc, "--baseline", "1.0", "--candidate", "7.7")
    assert p.returncode == 2
    assert "7.7" in p.stderr and "1.1" in p.stderr


def test_malformed_gate_policy_is_an_error_naming_the_field(gated):
    sc, tmp, _ = gated
    bad = tmp / "gate.yaml"
    bad.write_text("min_tasks: lots\n")
    p = gate(sc, "--baseline", "1.0", "--candidate", "1.1", "--policy", str(bad))
    assert p.returncode == 2 and "min_tasks" in p.stderr


def test_replays_wrote_no_side_effect(gated):
    _, _, effects = gated
    assert len(effects.read_text().splitlines()) == 24  # the production refunds only


def test_harness_agreement_and_shadow_scores(gated):
    sc, _, _ = gated
    rep = {(g["version"], g["run_kind"]): g for g in sc.report()["groups"]}
    assert rep[("1.0", "shadow")]["metrics"]["success_rate"]["value"] == 1.0
    assert rep[("2.0", "shadow")]["metrics"]["success_rate"]["value"] == 0.0
    assert rep[("1.1", "shadow")]["trials"] == 72


def test_shadow_dashboard_queries_name_metrics_of_a_live_scrape(gated):
    """Every metric the shadow dashboard and alert rules query is in this sidecar's scrape, after
    replays ran and gates were evaluated (the gate tests above)."""
    import re
    from pathlib import Path

    import yaml
    from prometheus_client.parser import text_string_to_metric_families

    sc, _, _ = gated
    sc.get("/api/v1/gate", params={"baseline": "1.0", "candidate": "2.0"})
    names = set()
    for fam in text_string_to_metric_families(sc.get("/metrics").text):
        names |= {s.name for s in fam.samples}
    root = Path(__file__).resolve().parents[1]
    d = json.loads((root / "grafana" / "dashboards" / "relyscope-shadow.json").read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    rules = yaml.safe_load((root / "deploy" / "alerts" / "relyscope-shadow-rules.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for e in exprs:
        for name in re.findall(r"\b(relyscope_[a-z_]+)", e):
            assert name in names, (name, sorted(n for n in names if "shadow" in n or "gate" in n))


def test_report_carries_the_latest_gates_and_fault_exposure(gated):
    sc, _, _ = gated
    sc.get("/api/v1/gate", params={"baseline": "1.0", "candidate": "2.0"})
    rep = sc.report()
    gates = {(g["baseline"], g["candidate"]): g["verdict"] for g in rep["gates"]}
    assert gates[("1.0", "2.0")] == "block"
    p = subprocess.run([str(RELYSCOPE_BIN), "report", "--api", sc.api], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "BLOCK" in p.stdout


def test_canary_traffic_is_gated_against_production(gated):
    """--mode canary: the worse version's canary production traffic (its own verifier says
    failure) against the baseline's production runs of the same tasks."""
    sc, tmp, _ = gated
    subprocess.run([sys.executable, "-m", "tests.replay_agents.refund_agent", "prod", "--otlp", sc.otlp_grpc,
                    "--effects", str(tmp / "canary-effects.log"), "--version", "2.0-canary", "--tasks", "24",
                    "--runs", "1", "--worse", "--run-kind", "canary"], cwd=ROOT, check=True, timeout=60)
    sc.flush()
    p = gate(sc, "--baseline", "1.0", "--candidate", "2.0-canary", "--mode", "canary", "--format", "json")
    res = json.loads(p.stdout)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert res["verdict"] == "block" and res["shared_tasks"] == 24
    assert res["deltas"]["success_rate"]["delta"] == -1.0


def test_since_scopes_the_experiment_to_runs_after_it(gated):
    """Two canary experiments on the same version: the first ran the worse code, the second the
    fixed one. Without --since the gate mixes them (half of the candidate's runs fail: block);
    with --since between the two it judges only the second (pass), and says its scope."""
    sc, tmp, _ = gated

    def prod(version, *flags, kind="canary"):
        subprocess.run([sys.executable, "-m", "tests.replay_agents.refund_agent", "prod", "--otlp", sc.otlp_grpc,
                        "--effects", str(tmp / f"since-{version}.log"), "--version", version, "--tasks", "24",
                        "--runs", "1", "--run-kind", kind, *flags], cwd=ROOT, check=True, timeout=60)
        sc.flush()

    prod("3.0-canary", "--worse")
    time.sleep(1.1)
    t0 = time.time()
    prod("1.0", kind="production")  # the incumbent's production traffic during the second experiment
    prod("3.0-canary")

    mixed = gate(sc, "--baseline", "1.0", "--candidate", "3.0-canary", "--mode", "canary", "--format", "json")
    res = json.loads(mixed.stdout)
    assert mixed.returncode == 1 and res["verdict"] == "block", (mixed.stdout, mixed.stderr)
    # every task: baseline succeeds in all its runs, candidate in 1 of its 2
    assert res["deltas"]["success_rate"]["delta"] == pytest.approx(-0.5)
    assert res["experiment"]["since"] is None

    scoped = gate(sc, "--baseline", "1.0", "--candidate", "3.0-canary", "--mode", "canary",
                  "--since", f"{t0:.3f}", "--format", "json")
    res = json.loads(scoped.stdout)
    assert scoped.returncode == 0 and res["verdict"] == "pass", (scoped.stdout, scoped.stderr)
    assert res["deltas"]["success_rate"]["delta"] == 0.0
    assert res["experiment"]["since"].startswith(time.strftime("%Y-%m-%dT", time.gmtime(t0)))

    # a duration back from now names the same scope here (both runs are minutes old at most)
    recent = gate(sc, "--baseline", "1.0", "--candidate", "3.0-canary", "--mode", "canary", "--since", "1h")
    assert recent.returncode == 1, (recent.stdout, recent.stderr)


def test_since_errors_say_what_to_change(gated):
    sc, _, _ = gated
    bad = gate(sc, "--baseline", "1.0", "--candidate", "1.1", "--since", "yesterday-ish")
    assert bad.returncode == 2 and "duration back from now" in bad.stderr, bad.stderr
    future = gate(sc, "--baseline", "1.0", "--candidate", "1.1", "--since", str(time.time() + 3600))
    assert future.returncode == 2 and "since" in future.stderr and "no shadow replays" in future.stderr, future.stderr
    # --format json answers on stdout too (it printed nothing: a script's json.loads failed)
    js = gate(sc, "--baseline", "1.0", "--candidate", "1.1", "--since", str(time.time() + 3600), "--format", "json")
    err = json.loads(js.stdout)
    assert js.returncode == 2 and err["verdict"] == "error" and err["status"] == 404, js.stdout
    assert "no shadow replays" in err["error"], err
    r = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "1.1", "since": "soon"})
    assert r.status_code == 422 and "ISO 8601" in r.text, r.text
    for raw in ("NaN", "1e400", "99999999999", "-1e20"):  # were 500 (int(nan)) and 503 (DateTime64 overflow)
        r = sc.post("/api/v1/gate", content='{"baseline": "1.0", "candidate": "1.1", "since": %s}' % raw,
                    headers={"content-type": "application/json"})
        assert r.status_code == 422 and "between 1970" in r.text, (raw, r.status_code, r.text)
    nan = gate(sc, "--baseline", "1.0", "--candidate", "1.1", "--since", "nan")
    assert nan.returncode == 2 and "between 1970" in nan.stderr, nan.stderr


def test_since_scopes_replays_by_when_they_were_scheduled(gated):
    """Bug: `--since` kept the replays whose runs *ended* since then, so a scope set while an
    experiment ran (or a `--since 1m` just after it) judged the tail of it — a part of the tasks,
    the incumbent's nominal replays missing from the harness check — and published that verdict.
    Replays count by when they were scheduled: an experiment is judged whole or not at all."""
    sc, _, _ = gated
    rows = sc.get("/api/v1/shadow/replays", params={"limit": 10000}).json()["replays"]
    scheduled = max(r["scheduled_at"] for r in rows)
    ends = sorted(t["end_ns"] / 1e9 for t in sc.trials(run_kind="shadow"))
    since = scheduled + 0.5  # scheduled_at has ms precision: +1 ms could round back onto it
    assert sum(e >= since for e in ends) > 0  # the runs of some replays ended after it: the old scope
    r = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "1.1", "since": since})
    assert r.status_code == 404 and "no shadow replays scheduled since" in r.json()["detail"], r.text
    whole = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "1.1", "since": scheduled - 1})
    assert whole.status_code == 200 and whole.json()["shared_tasks"] == 24, whole.text
    assert whole.json()["experiment"]["harness"]["replays"] > 0


def test_since_error_lists_only_versions_within_the_scope(gated):
    """Bug: `--since 1m` after the replays answered `… has no shadow runs since 20:47:01; versions
    with shadow runs: support-agent 1.0 (72 runs) …` — all-time counts that contradict the "no
    runs since". Within a scope the list names what is inside it, and the others with the time
    their last run ended (before the scope)."""
    sc, _, _ = gated
    since = time.time()  # after every replay of the fixture was scheduled (and ended)
    r = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "1.1", "since": since})
    assert r.status_code == 404, r.text
    d = r.json()["detail"]
    assert "no shadow replays scheduled since" in d and "replays)" not in d, d
    assert "no version has replays that ran, scheduled since then" in d, d
    import datetime as dt

    ends = re.findall(r"1\.[01] \(last scheduled ([^)]+)\)", d)
    assert len(ends) == 2, d
    assert all(dt.datetime.fromisoformat(e).timestamp() <= since for e in ends), d
    # without a scope: every version with its count, as before
    d = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "7.7"}).json()["detail"]
    assert "versions with shadow runs: " in d and "1.1 (72 runs)" in d, d


def test_published_verdicts_survive_a_restart_of_the_sidecar(gated):
    """Last in this module: it restarts the sidecar. The gauge a blocked candidate's alert reads
    (and the report's gates) came back empty after a restart until someone gated again; the
    latest verdicts are now kept in the store and taken up at start. The what-if under another
    policy is not (it never was published)."""
    sc, tmp, _ = gated
    assert gate(sc, "--baseline", "1.0", "--candidate", "2.0").returncode == 1  # block, published
    passed = gate(sc, "--baseline", "1.0", "--candidate", "1.1")
    assert passed.returncode == 0 and "published: relyscope_gate_verdict" in passed.stdout, passed.stdout  # pass
    env = dict(sc.env)
    assert sc.kill() == 0
    sc2 = start_sidecar(tmp / "sc", extra_env=env)
    try:
        m = sc2.get("/metrics").text
        for cand, verdict in (("2.0", "block"), ("1.1", "pass")):
            line = (f'relyscope_gate_verdict{{agent="refund-agent",baseline="1.0",candidate="{cand}",mode="shadow",'
                    f'verdict="{verdict}"}} 1.0')
            assert line in m, cand
        gates = {(g["baseline"], g["candidate"]): g for g in sc2.report()["gates"]}
        assert gates[("1.0", "2.0")]["verdict"] == "block"
        assert gates[("1.0", "2.0")]["deltas"]["success_rate"]["candidate"] == 0.0
        # gating again replaces the stored verdict (the later publication wins), also across restarts
        p = subprocess.run([str(RELYSCOPE_BIN), "gate", "--api", sc2.api, "--baseline", "1.0", "--candidate", "2.0",
                            "--format", "json"], capture_output=True, text=True, timeout=300)
        assert json.loads(p.stdout)["stored"] is True
    finally:
        sc2.kill()
