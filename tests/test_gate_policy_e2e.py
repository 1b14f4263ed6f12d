"""Request gate policies and what-ifs, end to end: a sidecar with its own gate policy file
(RELYSCOPE_GATE_POLICY_FILE), 24 production tasks of 1.0 (all succeed), canary traffic of a worse
2.0-canary (all fail) and an equal 1.1-canary, and 18 replays of 1.0 for `shadow show` prefixes.

Worked out by hand from the configured policy below (no safety policy, so the hard gates and
S_comp are switched off there): success_rate is 1.0 → 0.0 on 24 shared tasks for 2.0-canary
(Δ = −1, the interval [−1, −1] lies below −0.05 on ≥ 5 tasks: block) and 1.0 → 1.0 for
1.1-canary (Δ = 0, [0, 0] above −0.05 on ≥ min_tasks = 10 tasks: pass); with one run per task
pass^3 and C_out (need 3 per task) and the R_x (no perturbed runs) are not measured, and being
not required they are notes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relyscope.testing import RELYSCOPE_BIN, free_ports, start_sidecar
from tests.test_shadow_e2e import ROOT, Agent, _ports_env, replay_and_wait, run_production

CONFIGURED = """\
min_tasks: 10
block_on_critical: false
block_on_committed_forbidden: false
metrics:
  S_comp: null
"""
# the configured policy's metrics: the defaults without S_comp
CONFIGURED_METRICS = {"success_rate", "pass^3", "C_out", "R_Rob", "R_fault", "R_env", "R_prompt"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gatepol")
    (tmp / "configured.yaml").write_text(CONFIGURED)
    (port,) = free_ports()
    sc = start_sidecar(tmp / "sc", extra_env=_ports_env(
        {"1.0": port}, RELYSCOPE_SHADOW_K="3", RELYSCOPE_SHADOW_FAMILIES='["nominal"]',
        RELYSCOPE_GATE_POLICY_FILE=str(tmp / "configured.yaml")))
    effects = tmp / "effects.log"
    agent = None
    try:
        run_production(sc, effects, tasks=24, runs=1, version="1.0")
        for version, flags in (("2.0-canary", ["--worse"]), ("1.1-canary", [])):
            subprocess.run([sys.executable, "-m", "tests.replay_agents.refund_agent", "prod", "--otlp", sc.otlp_grpc,
                            "--effects", str(tmp / f"{version}.log"), "--version", version, "--tasks", "24",
                            "--runs", "1", "--run-kind", "canary", *flags], cwd=ROOT, check=True, timeout=60)
        sc.flush()
        agent = Agent(sc, effects, "1.0", port)
        prod = sorted(t["trial_id"] for t in sc.trials(run_kind="production"))
        replay_and_wait(sc, prod[:6], timeout_s=120)  # 6 trials × k = 3: 18 replay ids
        yield sc, tmp
    finally:
        if agent is not None:
            agent.stop()
        sc.kill()


def cli(sc, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RELYSCOPE_BIN), *args, "--api", sc.api], capture_output=True, text=True, timeout=300)


def canary(candidate: str) -> list[str]:
    return ["gate", "--baseline", "1.0", "--candidate", candidate, "--mode", "canary"]


def gauge(sc, candidate: str) -> dict[str, float]:
    """verdict → value of relyscope_gate_verdict for 1.0 → candidate (canary), from a scrape."""
    out = {}
    for fam in text_string_to_metric_families(sc.get("/metrics").text):
        for s in fam.samples:
            if s.name == "relyscope_gate_verdict" and s.labels["candidate"] == candidate \
                    and s.labels["mode"] == "canary":
                out[s.labels["verdict"]] = s.value
    return out


def report_gate(sc, candidate: str) -> str | None:
    for g in sc.report().get("gates", []):
        if (g["baseline"], g["candidate"], g["mode"]) == ("1.0", candidate, "canary"):
            return g["verdict"]
    return None


def test_cli_and_api_policy_are_the_same_change_of_the_configured_policy(world):
    """Bug: `gate --policy` sent a fully dumped policy, merged over the defaults: `C_out: null`
    came back (the dumped table lacks C_out, the merge restored it), and S_comp and the hard gates
    the sidecar's own file switched off came back too; the API merged over the defaults as well."""
    sc, tmp = world
    (tmp / "no-cout.yaml").write_text("metrics:\n  C_out: null\n")
    p = cli(sc, *canary("2.0-canary"), "--policy", str(tmp / "no-cout.yaml"), "--format", "json")
    assert p.returncode == 1, (p.stdout, p.stderr)
    from_cli = json.loads(p.stdout)
    r = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "2.0-canary", "mode": "canary",
                                      "policy": {"metrics": {"C_out": None}}})
    assert r.status_code == 200, r.text
    from_api = r.json()
    expected = CONFIGURED_METRICS - {"C_out"}
    assert set(from_cli["deltas"]) == expected and set(from_api["deltas"]) == expected
    for res in (from_cli, from_api):
        assert res["verdict"] == "block"
        # the configured hard-gate switches were kept: no "critical_violation: not measured"
        assert {x["name"]: x["verdict"] for x in res["reasons"]} == {
            "success_rate": "block", "pass^3": "note", "R_Rob": "note", "R_fault": "note", "R_env": "note",
            "R_prompt": "note"}
        assert res["deltas"]["success_rate"]["delta"] == -1.0
    assert from_cli["reasons"] == from_api["reasons"] and from_cli["deltas"] == from_api["deltas"]


def test_a_bad_policy_file_fails_locally_naming_file_and_field(world):
    sc, tmp = world
    bad = tmp / "bad.yaml"
    bad.write_text("metrics:\n  success_rate:\n    max_regression: -0.1\n")
    p = cli(sc, *canary("1.1-canary"), "--policy", str(bad))
    assert p.returncode == 2 and str(bad) in p.stderr and "metrics.success_rate.max_regression" in p.stderr, p.stderr


def test_a_what_if_policy_does_not_replace_the_published_verdict(world):
    """Bug: a run with a looser --policy replaced the published verdict: the gauge (and so
    RelyscopeCandidateBlocked) and the report then showed the what-if's pass."""
    sc, tmp = world
    r = sc.get("/api/v1/gate", params={"baseline": "1.0", "candidate": "2.0-canary", "mode": "canary"})
    assert r.status_code == 200 and r.json()["verdict"] == "block", r.text
    assert gauge(sc, "2.0-canary") == {"pass": 0.0, "block": 1.0, "inconclusive": 0.0, "error": 0.0}

    (tmp / "loose.yaml").write_text("metrics:\n  success_rate: null\n")  # only notes remain: pass
    p = cli(sc, *canary("2.0-canary"), "--policy", str(tmp / "loose.yaml"))
    # the same what-if by the API (old semantics, relative to the defaults, need the rest spelt out)
    loose = {"block_on_critical": False, "block_on_committed_forbidden": False,
             "metrics": {"success_rate": None, "S_comp": None}}
    w = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "2.0-canary", "mode": "canary", "policy": loose})
    assert w.status_code == 200 and w.json()["verdict"] == "pass", w.text

    assert gauge(sc, "2.0-canary") == {"pass": 0.0, "block": 1.0, "inconclusive": 0.0, "error": 0.0}
    assert report_gate(sc, "2.0-canary") == "block"
    assert w.json()["what_if"] is True and w.json()["published"] is False
    assert r.json()["what_if"] is False and r.json()["published"] is True
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "PASS" in p.stdout and "what-if" in p.stdout and "not published" in p.stdout, p.stdout

    # a request policy that changes nothing is the configured policy: published
    r = sc.post("/api/v1/gate", json={"baseline": "1.0", "candidate": "2.0-canary", "mode": "canary",
                                      "policy": {"min_tasks": 10}})
    assert r.json()["verdict"] == "block" and r.json()["what_if"] is False and r.json()["published"] is True


def test_a_pass_says_what_passed_instead_of_an_empty_reasons_table(world):
    """Bug: a PASS with every gated metric measured printed an empty "reasons" table."""
    import io

    from rich.console import Console

    from relyscope.cli.shadow import render_gate

    sc, tmp = world
    others = sorted(CONFIGURED_METRICS - {"success_rate"})
    # spelt out in full, so it means the same relative to the defaults or to the configured policy
    body = {"baseline": "1.0", "candidate": "1.1-canary", "mode": "canary", "policy": {
        "min_tasks": 10, "block_on_critical": False, "block_on_committed_forbidden": False,
        "metrics": {k: None for k in [*others, "S_comp"]}}}
    res = sc.post("/api/v1/gate", json=body).json()
    assert res["verdict"] == "pass" and res["reasons"] == [], res
    buf = io.StringIO()
    render_gate(res, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "every check passed; 1 gated metric within the allowed regression: success_rate" in out, out
    assert "reasons" not in out and "notes" not in out, out

    only = tmp / "only-success.yaml"
    only.write_text("metrics:\n" + "".join(f"  {k}: null\n" for k in others))
    p = cli(sc, *canary("1.1-canary"), "--policy", str(only))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "every check passed; 1 gated metric within the allowed regression: success_rate" in p.stdout, p.stdout
    assert "reasons" not in p.stdout and "notes" not in p.stdout, p.stdout
    # under the configured policy the metrics not measured remain, as notes
    p = cli(sc, *canary("1.1-canary"))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "every check passed; 1 gated metric within the allowed regression: success_rate" in p.stdout, p.stdout
    assert "notes" in p.stdout and "pass^3" in p.stdout and "reasons" not in p.stdout, p.stdout


def test_shadow_show_names_what_a_short_prefix_matched(world):
    sc, _ = world
    ids = sorted(r["replay_id"] for r in sc.get("/api/v1/shadow/replays", params={"limit": 100}).json()["replays"])
    assert len(ids) == 18
    by_first: dict[str, list[str]] = {}
    for i in ids:
        by_first.setdefault(i[0], []).append(i)
    # 18 ids over 16 hex digits: some first digit is shared (pigeonhole)
    prefix, shared = max(by_first.items(), key=lambda kv: len(kv[1]))
    assert len(shared) >= 2
    p = cli(sc, "shadow", "show", prefix)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert f"prefix '{prefix}' is ambiguous" in p.stderr, p.stderr
    listed = shared[:10]
    assert f"matches {len(shared)} replays" in p.stderr if len(shared) <= 10 else "more than 10" in p.stderr
    assert all(i in p.stderr for i in listed), (listed, p.stderr)
    assert "version 1.0" in p.stderr

    none = "zz"  # not a hex digit: no replay id starts with it
    p = cli(sc, "shadow", "show", none)
    assert p.returncode == 1 and "no replay id is or starts with 'zz'" in p.stderr, p.stderr

    p = cli(sc, "shadow", "show", ids[0][:12])  # as `shadow list` prints it
    assert p.returncode == 0 and ids[0] in p.stdout, (p.stdout, p.stderr)
