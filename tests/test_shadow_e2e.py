"""Shadow replays end to end: a real sidecar process, a real agent process serving the replay
protocol, real OTLP. The agent's refund tool appends to a file — the side effect no replay may
cause."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from relyscope.testing import RELYSCOPE_BIN, free_ports, start_sidecar, wait_for_replays

ROOT = Path(__file__).resolve().parents[1]


class Agent:
    """The refund agent (tests/replay_agents/refund_agent.py) as a replay target process."""

    def __init__(self, sidecar, effects: Path, version: str, port: int, *flags: str):
        self.port = port
        cmd = [sys.executable, "-m", "tests.replay_agents.refund_agent", "serve", "--otlp", sidecar.otlp_grpc,
               "--effects", str(effects), "--version", version, "--port", str(self.port), *flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}/relyscope/replay"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/relyscope/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stderr.read())
        raise RuntimeError("agent target did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def run_production(sidecar, effects: Path, *, tasks: int, runs: int, version: str = "1.0") -> None:
    subprocess.run([sys.executable, "-m", "tests.replay_agents.refund_agent", "prod", "--otlp", sidecar.otlp_grpc,
                    "--effects", str(effects), "--version", version, "--tasks", str(tasks), "--runs", str(runs)],
                   cwd=ROOT, check=True, timeout=60)
    sidecar.flush()


def replay_and_wait(sidecar, trial_ids: list[str], timeout_s: float = 120) -> list[str]:
    r = sidecar.post("/api/v1/shadow/replays", json={"trial_ids": trial_ids})
    assert r.status_code == 200, r.text
    ids = r.json()["replay_ids"]
    wait_for_replays(sidecar, ids, timeout_s)
    sidecar.flush()
    return ids


def _ports_env(targets: dict[str, int], **extra) -> dict:
    env = {"RELYSCOPE_SHADOW_TARGETS": json.dumps({v: f"http://127.0.0.1:{p}/relyscope/replay"
                                                   for v, p in targets.items()}),
           "RELYSCOPE_SHADOW_RATE": "0", "RELYSCOPE_SHADOW_INTERVAL_S": "0.5",
           "RELYSCOPE_SHADOW_FAULT_TIMEOUT_S": "0.05"}
    env.update(extra)
    return env


class World:
    """A sidecar told about one replay target port per version, the effects file, the agents."""

    def __init__(self, sc, effects: Path, ports: dict[str, int]):
        self.sc, self.effects, self.ports, self.agents = sc, effects, ports, []

    def agent(self, version: str, *flags: str) -> Agent:
        a = Agent(self.sc, self.effects, version, self.ports[version], *flags)
        self.agents.append(a)
        return a


@contextlib.contextmanager
def world(tmp_path: Path, versions: tuple[str, ...] = ("1.0",), **env):
    """Start the sidecar (shadow settings ``env``); stop every agent and the sidecar at the end."""
    ports = dict(zip(versions, free_ports(len(versions)), strict=True))
    w = World(start_sidecar(tmp_path, extra_env=_ports_env(ports, **env)), tmp_path / "effects.log", ports)
    try:
        yield w
    finally:
        for a in w.agents:
            a.stop()
        w.sc.kill()


@pytest.fixture(scope="module")
def nominal_env(tmp_path_factory):
    """Production runs of 2 tasks × 2, then nominal replays (K = 3) against the same version."""
    tmp = tmp_path_factory.mktemp("shadow_nominal")
    (port,) = free_ports()
    sc = start_sidecar(tmp, extra_env=_ports_env({"1.0": port}, RELYSCOPE_SHADOW_K="3",
                                                  RELYSCOPE_SHADOW_FAMILIES='["nominal"]'))
    effects = tmp / "effects.log"
    agent = None
    try:
        run_production(sc, effects, tasks=2, runs=2)
        prod = sc.trials(run_kind="production")
        agent = Agent(sc, effects, "1.0", port)
        lines_before = effects.read_text().splitlines()
        ids = replay_and_wait(sc, [t["trial_id"] for t in prod])
        yield {"sc": sc, "prod": prod, "replay_ids": ids, "effects": effects, "lines_before": lines_before}
    finally:
        if agent is not None:
            agent.stop()
        sc.kill()


def test_nominal_replay_reproduces_trajectory_and_outcome(nominal_env):
    sc, prod = nominal_env["sc"], nominal_env["prod"]
    assert len(prod) == 4 and all(t["outcome"] == "success" for t in prod)
    replays = sc.trials(run_kind="shadow")
    assert len(replays) == 4 * 3  # K = 3 nominal replays of each production trial
    by_id = {t["trial_id"]: t for t in prod}
    for r in replays:
        p = by_id[r["shadow_of"]]
        assert r["task_id"] == p["task_id"]
        assert r["actions"] == p["actions"] == ["get_order", "issue_refund"]
        assert r["outcome"] == "success", r
        assert r["outcome_source"] == "side_effect_equivalence"


def test_no_side_effect_escapes_and_intent_is_recorded(nominal_env):
    sc, effects = nominal_env["sc"], nominal_env["effects"]
    # production wrote 4 refund lines; 12 replays wrote none
    assert effects.read_text().splitlines() == nominal_env["lines_before"]
    assert len(nominal_env["lines_before"]) == 4
    rid = nominal_env["replay_ids"][0]
    row = sc.get(f"/api/v1/shadow/replays/{rid}").json()
    assert row["status"] == "completed" and row["n_side_effects"] == 1 and row["n_miss"] == 0
    refund = [c for c in row["calls"] if c["name"] == "issue_refund"]
    assert len(refund) == 1 and refund[0]["side_effecting"] and not refund[0]["executed"]
    assert refund[0]["arguments"]["amount"] in (10.0, 15.0)
    assert refund[0]["match"] == "exact"


def test_shadow_group_scored_with_consistency(nominal_env):
    rep = nominal_env["sc"].report()
    g = next(g for g in rep["groups"] if g["run_kind"] == "shadow")
    assert g["tasks"] == 2 and g["trials"] == 12
    assert g["metrics"]["success_rate"]["value"] == 1.0
    assert g["metrics"]["C_out"]["value"] == 1.0


def test_fault_at_p1_for_one_tool_is_exactly_what_the_agent_sees(tmp_path):
    """p_fault = 1, only http_500, only get_order: every get_order of a fault replay errors with
    http_500 (the agent retries twice, then gives up), nothing else is faulted, no refund happens."""
    with world(tmp_path, ("1.0",),
            RELYSCOPE_SHADOW_K="2",
            RELYSCOPE_SHADOW_FAMILIES='["nominal", "fault"]',
            RELYSCOPE_SHADOW_P_FAULT="1",
            RELYSCOPE_SHADOW_FAULT_MIX='{"http_500": 1.0}',
            RELYSCOPE_SHADOW_FAULT_TOOLS='["get_order"]') as w:
        sc, effects = w.sc, w.effects
        run_production(sc, effects, tasks=1, runs=1)
        prod = sc.trials(run_kind="production")
        w.agent("1.0")
        replay_and_wait(sc, [prod[0]["trial_id"]])
        shadow = sc.trials(run_kind="shadow")
        faulted = [t for t in shadow if t["perturbation_family"] == "fault"]
        nominal = [t for t in shadow if t["perturbation_family"] == "nominal"]
        assert len(faulted) == 2 and len(nominal) == 2
        for t in faulted:
            tools = [s for s in t["steps"] if s["op"] == "tool"]
            assert [s["tool_name"] for s in tools] == ["get_order"] * 3  # 1 try + 2 retries, no refund
            assert all(s["error"] == "http_500" and s["fault_type"] == "http_500" for s in tools)
            assert t["outcome"] == "failure"  # no refund ≠ the verified production refund
        for t in nominal:
            assert all(s.get("fault_type") is None for s in t["steps"])
            assert t["outcome"] == "success"
        rep = next(g for g in sc.report()["groups"] if g["run_kind"] == "shadow")
        assert rep["metrics"]["R_fault"]["value"] == 0.0  # Acc_fault 0 / Acc_nominal 1
        # 2 fault replays × 3 get_order calls, every one faulted (p = 1)
        assert rep["fault_exposure"] == {"tool_calls": 6, "faulted": 6, "rate": 1.0}
        assert len(effects.read_text().splitlines()) == 1


def test_call_without_recording_is_a_sandbox_miss_excluded_and_counted(tmp_path):
    """A candidate that calls a tool production never called gets the sandbox error; the replay is
    marked sandbox_miss, attributed ENVIRONMENT, kept out of R_* and counted."""
    with world(tmp_path, ("1.1",), RELYSCOPE_SHADOW_K="2", RELYSCOPE_SHADOW_FAMILIES='["nominal"]') as w:
        sc, effects = w.sc, w.effects
        run_production(sc, effects, tasks=1, runs=1)
        prod = sc.trials(run_kind="production")
        w.agent("1.1", "--extra-tool")
        ids = replay_and_wait(sc, [prod[0]["trial_id"]])
        rows = [sc.get(f"/api/v1/shadow/replays/{i}").json() for i in ids]
        assert {r["status"] for r in rows} == {"sandbox_miss"} and all(r["n_miss"] == 1 for r in rows)
        shadow = sc.trials(run_kind="shadow")
        assert len(shadow) == 2
        for t in shadow:
            miss = [s for s in t["steps"] if s["error"] == "sandbox_miss"]
            assert [s["tool_name"] for s in miss] == ["get_customer"]
        g = next(g for g in sc.report()["groups"] if g["run_kind"] == "shadow")
        assert g["invalid_trials"] == 2 and g["metrics"]["success_rate"]["value"] is None
        assert g["sandbox_miss_trials"] == 2
        m = sc.get("/metrics").text
        assert 'relyscope_shadow_proxy_calls_total{match="sandbox_miss"} 2.0' in m
        assert len(effects.read_text().splitlines()) == 1


def test_a_side_effect_production_never_made_is_graded_not_excluded(tmp_path):
    """A candidate that also makes a refund production never made (declared irreversible): the
    sandbox acknowledges it (result null), records it and never executes it, and side-effect
    equivalence grades the replay of a verified success a failure. It used to be a sandbox miss:
    the replay left the metrics, so a candidate's wrong side effects were excluded, not counted."""
    with world(tmp_path, ("1.1",), RELYSCOPE_SHADOW_K="2", RELYSCOPE_SHADOW_FAMILIES='["nominal"]') as w:
        sc, effects = w.sc, w.effects
        run_production(sc, effects, tasks=1, runs=1)
        prod = sc.trials(run_kind="production")
        assert prod[0]["outcome"] == "success"
        w.agent("1.1", "--double-refund")
        ids = replay_and_wait(sc, [prod[0]["trial_id"]])
        rows = [sc.get(f"/api/v1/shadow/replays/{i}").json() for i in ids]
        assert {r["status"] for r in rows} == {"completed"} and all(r["n_miss"] == 0 for r in rows)
        shadow = sc.trials(run_kind="shadow")
        assert len(shadow) == 2
        for t in shadow:
            refunds = [s for s in t["steps"] if s["tool_name"] == "issue_refund"]
            assert len(refunds) == 2 and all(s["error"] is None for s in refunds)
            assert t["outcome"] == "failure" and t["outcome_source"] == "side_effect_equivalence"
        g = next(g for g in sc.report()["groups"] if g["run_kind"] == "shadow")
        assert g["invalid_trials"] == 0 and g["metrics"]["success_rate"]["value"] == 0.0
        assert g.get("sandbox_miss_trials", 0) == 0
        assert len(effects.read_text().splitlines()) == 1  # production's refund only: never executed


_SILENT = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
conns = []
t0 = time.monotonic()
while time.monotonic() - t0 < 120:   # bounded: accepts and never answers
    c, _ = s.accept(); conns.append(c)
"""


def _bound_port(proc: subprocess.Popen, pattern: str) -> int:
    """The port a server started on port 0 reports on its first matching stdout line."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited {proc.poll()} before reporting its port")
        if m := re.search(pattern, line):
            return int(m.group(1))
    raise RuntimeError("server did not report its port within 30 s")


def test_bad_targets_get_clear_statuses_and_touch_no_production_data(tmp_path):
    """A target that is down, one that answers garbage (a plain HTTP file server) and one that
    never answers: each replay ends error / error / timeout with the reason; production is intact.

    Every port is held before the sidecar binds its own: the two servers bind port 0 and report it,
    and the down target is a socket bound but not listening (connections to it are refused), so no
    other process can be handed one of them (CI once saw the file server answer on the "down" port)."""
    procs = [subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True),
             subprocess.Popen([sys.executable, "-c", _SILENT], stdout=subprocess.PIPE, text=True)]
    down_sock = socket.socket()
    sc = None
    try:
        down_sock.bind(("127.0.0.1", 0))
        down = down_sock.getsockname()[1]
        garbage = _bound_port(procs[0], r"port (\d+)")
        silent = _bound_port(procs[1], r"^(\d+)$")
        sc = start_sidecar(tmp_path, extra_env=_ports_env(
            {"3.0": down, "4.0": garbage, "5.0": silent}, RELYSCOPE_SHADOW_K="1",
            RELYSCOPE_SHADOW_FAMILIES='["nominal"]', RELYSCOPE_SHADOW_REPLAY_TIMEOUT_S="2",
            RELYSCOPE_SHADOW_CONCURRENCY="3"))
        effects = tmp_path / "effects.log"
        run_production(sc, effects, tasks=1, runs=1)
        prod_before = sc.trials(run_kind="production")
        ids = replay_and_wait(sc, [prod_before[0]["trial_id"]], timeout_s=60)
        rows = {r["target_version"]: r for r in (sc.get(f"/api/v1/shadow/replays/{i}").json() for i in ids)}
        assert rows["3.0"]["status"] == "error" and "unreachable" in rows["3.0"]["error"]
        assert rows["4.0"]["status"] == "error" and "not a replay reply" in rows["4.0"]["error"]
        assert rows["5.0"]["status"] == "timeout" and "within 2 s" in rows["5.0"]["error"]
        assert sc.trials(run_kind="production") == prod_before
        assert sc.trials(run_kind="shadow") == []
        # the CLI: `shadow start` exited 0 ("replays finished: error 2, timeout 1") when no replay
        # ran, and `shadow list --status error` (the runbook's step) showed no reason
        cli = [str(RELYSCOPE_BIN), "shadow"]
        p = subprocess.run([*cli, "start", "--trial", prod_before[0]["trial_id"], "--again", "--timeout", "60",
                            "--api", sc.api], capture_output=True, text=True, timeout=120)
        out = " ".join((p.stdout + p.stderr).split())
        assert p.returncode == 2, out
        assert out.count("1 replay error: target") == 2 and "1 replay timeout: no reply" in out, out
        assert "no replay ran" in out, out
        assert f"127.0.0.1:{down}" in out and "unreachable" in out and "within 2 s" in out, out
        p = subprocess.run([*cli, "list", "--status", "error", "--api", sc.api], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "COLUMNS": "400"})
        out = " ".join(p.stdout.split())
        assert p.returncode == 0 and "unreachable" in out and "not a replay reply" in out, out
    finally:
        down_sock.close()
        for p in procs:
            p.terminate()
            p.wait(10)
        if sc is not None:
            sc.kill()


def test_replay_api_refuses_mistakes(nominal_env):
    sc = nominal_env["sc"]
    assert sc.post("/api/v1/shadow/replays", json={}).status_code == 422
    r = sc.post("/api/v1/shadow/replays", json={"trial_ids": ["nope"]})
    assert r.status_code == 422 and "unknown trial ids" in r.text
    assert sc.post("/api/v1/shadow/replays", json={"last": "3"}).status_code == 422
    r = sc.post("/api/v1/shadow/replays", json={"last": 3, "tasks": 3})
    assert r.status_code == 422 and "exactly one of" in r.text
    assert sc.get("/api/v1/shadow/replays", params={"status": "weird"}).status_code == 422
    assert sc.get("/api/v1/shadow/replays/doesnotexist").status_code == 404
    # the proxy answers only running replay attempts, by their random token
    r = sc.post("/shadow/v1/sessions/doesnotexist/tool-calls", json={"name": "get_order"})
    assert r.status_code == 404 and r.json()["outcome"] == "sandbox_miss"
    assert sc.post("/shadow/v1/sessions/x/tool-calls", content=b"not json").status_code == 400
    deep = b"[" * 100_000 + b"]" * 100_000
    assert sc.post("/shadow/v1/sessions/x/tool-calls", content=deep).status_code in (400, 413)

    def chunks():  # a chunked upload past the cap, no Content-Length
        for _ in range(40):
            yield b" " * 65536

    assert sc.post("/shadow/v1/sessions/x/tool-calls", content=chunks()).status_code == 413
    assert sc.get("/api/v1/shadow/samples", params={"decision": "typo"}).status_code == 422
    # the CLI said so with a KeyError traceback
    p = subprocess.run([str(RELYSCOPE_BIN), "shadow", "samples", "--decision", "typo", "--api", sc.api],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "decision must be one of" in p.stderr and "Traceback" not in p.stderr, p.stderr
    # the proxy URL handed to the agent is not derivable from the replay id
    rid = nominal_env["replay_ids"][0]
    assert sc.post(f"/shadow/v1/replays/{rid}/tool-calls", json={"name": "get_order"}).status_code == 404


def test_automatic_sampling_records_every_decision(tmp_path):
    """rate 1, cap 1 per hour, no quiet period: of two finished production trials one is sampled
    and replayed without anyone asking, the other is over the cap; both decisions are queryable
    and counted."""
    with world(tmp_path, ("1.0",),
            RELYSCOPE_SHADOW_RATE="1",
            RELYSCOPE_SHADOW_CAP_PER_HOUR="1",
            RELYSCOPE_SHADOW_QUIET_S="0",
            RELYSCOPE_SHADOW_K="1",
            RELYSCOPE_SHADOW_FAMILIES='["nominal"]') as w:
        sc, effects = w.sc, w.effects
        w.agent("1.0")
        run_production(sc, effects, tasks=2, runs=1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sc.flush()
            if sc.trials(run_kind="shadow"):
                break
            time.sleep(0.5)
        samples = sc.get("/api/v1/shadow/samples").json()["samples"]
        assert sorted(s["decision"] for s in samples) == ["over_cap", "sampled"]
        assert len(sc.trials(run_kind="shadow")) == 1
        m = sc.get("/metrics").text
        assert 'relyscope_shadow_decisions_total{decision="sampled"} 1.0' in m
        assert 'relyscope_shadow_decisions_total{decision="over_cap"} 1.0' in m
        # pause stops sampling; the state says so, and it outlives a restart (bug: a restarted
        # sidecar resumed sampling, so an operator's pause lasted until the next rollout)
        assert sc.post("/api/v1/shadow/pause").json() == {"paused": True, "persisted": True}
        assert sc.get("/api/v1/shadow").json()["paused"] is True
        sc.kill(signal.SIGKILL)
        w.sc = sc = start_sidecar(tmp_path, extra_env=sc.env)
        assert sc.get("/api/v1/shadow").json()["paused"] is True
        assert sc.post("/api/v1/shadow/resume").json() == {"paused": False, "persisted": True}
        sc.kill()
        w.sc = sc = start_sidecar(tmp_path, extra_env=sc.env)
        assert sc.get("/api/v1/shadow").json()["paused"] is False


def test_no_side_effect_escapes_in_any_family_or_run_kind(tmp_path):
    """nominal, prompt, fault and env replays, run as canary: the refund tool (which appends to the
    effects file) never runs; every replay's refund is recorded with its arguments instead."""
    with world(tmp_path, ("1.0",),
            RELYSCOPE_SHADOW_K="2",
            RELYSCOPE_SHADOW_J="2",
            RELYSCOPE_SHADOW_RUN_KIND="canary",
            RELYSCOPE_SHADOW_P_FAULT="0.5") as w:
        sc, effects = w.sc, w.effects
        run_production(sc, effects, tasks=2, runs=1)
        before = effects.read_text()
        prod = sc.trials(run_kind="production")
        w.agent("1.0")
        ids = replay_and_wait(sc, [t["trial_id"] for t in prod])
        assert len(ids) == 2 * (2 + 2 + 2 + 2)
        assert effects.read_text() == before
        rows = [sc.get(f"/api/v1/shadow/replays/{i}").json() for i in ids]
        assert {r["family"] for r in rows} == {"nominal", "prompt", "fault", "env"}
        assert {r["run_kind"] for r in rows} == {"canary"}
        for r in rows:
            for c in r["calls"]:
                if c["name"] == "issue_refund":
                    assert c["side_effecting"] and not c["executed"] and c["arguments"]["order_id"].startswith("ORD-")
        prompts = {r["input"] for r in rows if r["family"] == "prompt"}
        assert prompts and all("ORD-10" in p for p in prompts)  # rewritten, ids kept
        canary = sc.trials(run_kind="canary")
        assert len(canary) == len(ids) and {t["perturbation_family"] for t in canary} == {"nominal", "prompt", "fault", "env"}


def test_planning_a_trial_again_does_not_rerun_or_double_count(nominal_env):
    """Bug: replaying the same trial again re-ran its finished replays under the same ids and the
    shadow group counted 2K trials."""
    sc, prod = nominal_env["sc"], nominal_env["prod"]
    r = sc.post("/api/v1/shadow/replays", json={"trial_ids": [prod[0]["trial_id"]]})
    assert r.status_code == 200 and r.json()["replay_ids"] == []
    sc.flush()
    assert len(sc.trials(run_kind="shadow")) == 4 * 3


def test_replays_cut_off_by_a_kill_are_rerun_once_and_counted_once(tmp_path):
    """kill -9 while replays run: after the restart the cut-off ones run again with a new trace id
    and every replay counts exactly once (the cut-off attempt's trial is dropped)."""
    import signal

    grpc, http, api = free_ports(3)
    fixed = {"RELYSCOPE_OTLP_GRPC": f"127.0.0.1:{grpc}", "RELYSCOPE_OTLP_HTTP": f"127.0.0.1:{http}",
             "RELYSCOPE_API": f"127.0.0.1:{api}"}  # the agent keeps exporting to the restarted sidecar
    with world(tmp_path, ("1.0",), RELYSCOPE_SHADOW_K="6", RELYSCOPE_SHADOW_FAMILIES='["nominal"]',
               RELYSCOPE_SHADOW_CONCURRENCY="1", **fixed) as w:
        sc, effects = w.sc, w.effects
        run_production(sc, effects, tasks=1, runs=1)
        prod = sc.trials(run_kind="production")
        w.agent("1.0")
        ids = sc.post("/api/v1/shadow/replays", json={"trial_ids": [prod[0]["trial_id"]]}).json()["replay_ids"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # kill once some replays finished, others not yet
            st = sc.post("/api/v1/shadow/status", json={"replay_ids": ids}).json()["by_status"]
            if st.get("completed", 0) >= 1 or st.get("running"):
                break
            time.sleep(0.05)
        sc.kill(signal.SIGKILL)
        sc2 = start_sidecar(tmp_path, extra_env=sc.env)
        w.sc = sc2
        try:
            wait_for_replays(sc2, ids, 120)
            sc2.flush()
            shadow = sc2.trials(run_kind="shadow")
            assert len(shadow) == 6, [t["trace_id"] for t in shadow]
            rows = [sc2.get(f"/api/v1/shadow/replays/{i}").json() for i in ids]
            assert {r["status"] for r in rows} == {"completed"}
            assert {t["trace_id"] for t in shadow} == {r["trace_id"] for r in rows}
            g = next(g for g in sc2.report()["groups"] if g["run_kind"] == "shadow")
            assert g["trials"] == 6
        finally:
            sc2.kill()


def test_a_replayed_trial_can_be_replayed_again_as_a_new_experiment(nominal_env):
    """Bug: re-running a replay after a fix silently did nothing (`planned 0 replays`, no word of
    the replays that already existed), so `gate --since` had no re-run to judge. The reply counts
    the existing replays; `again` plans new ids that supersede the old ones: scored once, not
    twice, and `--since` the re-run judges only it."""
    sc, prod = nominal_env["sc"], nominal_env["prod"]
    tid = prod[1]["trial_id"]
    cli = subprocess.run([str(RELYSCOPE_BIN), "shadow", "start", "--trial", tid,
                          "--no-wait", "--api", sc.api], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "planned 0 replays of 1 trial\n" in cli.stderr, cli.stderr
    assert "3 replays of these trials already exist; use --again" in cli.stderr, cli.stderr
    r = sc.post("/api/v1/shadow/replays", json={"trial_ids": [tid]}).json()
    assert r["replay_ids"] == [] and r["existing"] == 3  # K = 3, one target
    old = {x["replay_id"] for x in sc.get("/api/v1/shadow/replays", params={"shadow_of": tid}).json()["replays"]}
    assert len(old) == 3
    again = sc.post("/api/v1/shadow/replays", json={"trial_ids": [tid], "again": True}).json()
    assert len(again["replay_ids"]) == 3 and again["existing"] == 0 and not set(again["replay_ids"]) & old
    wait_for_replays(sc, again["replay_ids"], 120)
    sc.flush()
    # the 3 first replays of this trial are superseded: counted neither in trials nor in scores
    shadow = sc.trials(run_kind="shadow")
    assert len(shadow) == 4 * 3
    new_traces = {sc.get(f"/api/v1/shadow/replays/{i}").json()["trace_id"] for i in again["replay_ids"]}
    assert {t["trace_id"] for t in shadow if t["shadow_of"] == tid} == new_traces
    g = next(g for g in sc.report()["groups"] if g["run_kind"] == "shadow")
    assert g["trials"] == 4 * 3
    whole = sc.get("/api/v1/gate", params={"baseline": "1.0", "candidate": "1.0"}).json()
    assert whole["experiment"]["sandbox"]["replays"] == 4 * 3
    rerun = sc.get("/api/v1/gate", params={"baseline": "1.0", "candidate": "1.0",
                                          "since": again["scheduled_at"]}).json()
    assert rerun["experiment"]["sandbox"]["replays"] == 3, rerun
    # a later plain start still plans nothing: the first ids exist
    assert sc.post("/api/v1/shadow/replays", json={"trial_ids": [tid]}).json()["existing"] == 3


def test_a_pause_that_cannot_be_saved_says_why_and_the_cli_fails(tmp_path):
    """Bugs: (1) the state file's `{"paused": "false"}` started the sidecar paused (bool("false"));
    (2) a pause that could not be saved answered 200 `persisted: false` with no reason and
    `relyscope shadow pause` exited 0 (the pause silently ends at the next restart); any non-200
    answer also exited 0."""
    (tmp_path / "spool.shadow.json").write_text('{"paused": "false"}')
    (tmp_path / "spool.shadow.json.tmp").mkdir()  # the atomic write's temp file cannot be created
    with world(tmp_path, ("1.0",)) as w:
        sc = w.sc
        assert sc.get("/api/v1/shadow").json()["paused"] is False  # only JSON true pauses
        r = sc.post("/api/v1/shadow/pause")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["paused"] is True and body["persisted"] is False
        assert "spool.shadow.json" in body["reason"], body

        def cli(cmd: str, api: str = sc.api) -> subprocess.CompletedProcess:
            return subprocess.run([str(RELYSCOPE_BIN), "shadow", cmd, "--api", api], capture_output=True,
                                  text=True, timeout=60)

        for cmd in ("pause", "resume"):
            p = cli(cmd)
            out = p.stdout + p.stderr
            assert p.returncode == 1, out
            assert "will not survive a restart" in out and "spool.shadow.json" in out, out
        assert sc.get("/api/v1/shadow").json()["paused"] is False  # the resume took effect in memory
        wrong = cli("pause", sc.api + "/not-the-api")  # 404
        assert wrong.returncode == 2, wrong.stdout + wrong.stderr


def test_start_while_paused_says_so_instead_of_waiting_out_the_timeout(tmp_path):
    """Bug: with dispatch paused (RELYSCOPE_SHADOW_PAUSED=true, or an earlier `shadow pause`),
    `relyscope shadow start` planned the replays and then sat on its progress bar for the whole
    --timeout (default 900 s) before exiting 2 with "replays still open … {'scheduled': N}" — never
    saying that the sidecar was paused or how to resume."""
    with world(tmp_path, ("1.0",), RELYSCOPE_SHADOW_PAUSED="true") as w:
        sc = w.sc
        run_production(sc, w.effects, tasks=1, runs=1)
        (prod,) = sc.trials(run_kind="production")
        t0 = time.monotonic()
        p = subprocess.run([str(RELYSCOPE_BIN), "shadow", "start", "--trial", prod["trial_id"], "--timeout", "30",
                            "--api", sc.api], capture_output=True, text=True, timeout=90)
        took = time.monotonic() - t0
        out = " ".join((p.stdout + p.stderr).split())
        assert p.returncode == 1, out
        assert "paused" in out and "relyscope shadow resume" in out, out
        assert took < 20, (took, out)  # did not wait for the 30 s timeout
        assert sc.get("/api/v1/shadow").json()["replays"].get("scheduled", 0) > 0  # planned, kept for resume


def test_start_with_nothing_replayable_exits_2_saying_why(tmp_path):
    """`shadow start --last 1` over production runs none of which recorded its input printed
    "planned 0 replays of 0 trials" and exited 0, as if it had done something."""
    sc = start_sidecar(tmp_path, extra_env=_ports_env({"1.0": 9}))
    try:
        span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "invoke_agent a",
                "startTimeUnixNano": str(time.time_ns() - 2 * 10**9), "endTimeUnixNano": str(time.time_ns() - 10**9),
                "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                               {"key": "gen_ai.agent.name", "value": {"stringValue": "a"}}]}
        r = httpx.post(sc.otlp_http + "/v1/traces", json={"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]},
                       timeout=30)
        assert r.status_code == 200
        sc.flush()
        p = subprocess.run([str(RELYSCOPE_BIN), "shadow", "start", "--last", "1", "--api", sc.api],
                           capture_output=True, text=True, timeout=120)
        out = " ".join(p.stderr.split())
        assert p.returncode == 2 and "nothing to replay" in out and "skipped" in out, out
    finally:
        sc.kill()
