"""Adversarial inputs to shadow replays, each found breaking the sidecar: a replay attempt cut off
by a crash and re-run (counted twice in the live rollups), replay targets that trickle their reply
past the deadline or answer a huge body, and tool calls the proxy refuses (not counted as sandbox
misses). Real chDB, real loopback HTTP servers, the real stage / rollup / FastAPI app."""

from __future__ import annotations

import collections
import dataclasses
import time
import uuid

import pytest

from relyscope.scoring.rollup import Rollup
from relyscope.store import Store, StoreUnavailable
from relyscope.store.shadow import ShadowLedger
from test_shadow_units import PROD


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("shbreak") / "data")


@pytest.fixture()
def store(chdb_path):
    return Store(f"chdb://{chdb_path}", database="b" + uuid.uuid4().hex[:10])


def counts(items) -> dict:
    return dict(collections.Counter(items))


def _ledger_row(trace_id: str, status: str) -> dict:
    return {"replay_id": "r1", "experiment": "e1", "shadow_of": "p1", "task_id": "task", "agent": "agent",
            "prod_version": "1.0", "target_version": "1.0", "run_kind": "shadow", "family": "nominal",
            "strength": None, "seed": 1, "idx": 0, "input": "refund ORD-1", "status": status,
            "trace_id": trace_id, "scheduled_at": 1_700_000_000.0}


def test_a_replay_attempt_cut_off_and_rerun_counts_once_in_the_rollups(store):
    """One replay (one ledger row). Its first attempt (trace T1) finishes and is rolled up while the
    ledger still says ``running`` (the sidecar writes results after the whole batch); the sidecar
    is killed; the restart re-runs the replay as T2. The shadow group must hold 1 trial, not 2 —
    and when a re-run never sends spans (the target is down now), the superseded T1 must still
    leave the rollups (0 trials: the ledger's current attempt has none)."""
    now = time.time_ns()
    prod = dataclasses.replace(PROD, trial_id="p1", trace_id="1" * 32, end_ns=now)
    store.insert_trials([prod])
    ledger = ShadowLedger(store)

    def replay(trace_id: str):
        return dataclasses.replace(prod, trial_id=f"{trace_id}:b", trace_id=trace_id, run_kind="shadow",
                                   shadow_of="p1", outcome="unknown", end_ns=time.time_ns())

    t1, t2, t3 = "2" * 32, "3" * 32, "4" * 32
    ledger.write_replays([_ledger_row(t1, "running")])
    store.insert_trials([replay(t1)])
    rollup = Rollup(store, None)
    rollup.sync()
    assert rollup.group_sizes()[("agent", "1.0", "shadow")] == 1
    # the restart re-runs it: new trace id in the ledger, then its spans
    ledger.write_replays([_ledger_row(t2, "running")])
    ledger.write_replays([_ledger_row(t2, "completed")])
    store.insert_trials([replay(t2)])
    rollup.sync()
    assert rollup.group_sizes()[("agent", "1.0", "shadow")] == 1
    # another re-run whose target is down: no spans, yet T2 is superseded and must go
    ledger.write_replays([_ledger_row(t3, "error")])
    rollup.sync()
    assert ("agent", "1.0", "shadow") not in rollup.group_sizes()
    assert rollup.group_sizes()[("agent", "1.0", "production")] == 1


class _BadTarget:
    """A loopback replay target misbehaving as ``mode`` says, one connection at a time (bounded:
    every loop ends within ~20 s, and :meth:`stop` ends it)."""

    def __init__(self, mode: str):
        import socket
        import threading

        self.mode = mode
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(4)
        self.srv.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}/relyscope/replay"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import socket

        while not self._stop.is_set():
            try:
                c, _ = self.srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with c:
                try:
                    c.settimeout(5)
                    c.recv(1 << 16)
                    if self.mode == "drip_headers":  # a status line, then one header byte every 0.2 s
                        c.sendall(b"HTTP/1.1 200 OK\r\nx-slow: ")
                        for _ in range(100):
                            if self._stop.wait(0.2):
                                break
                            c.sendall(b"a")
                    elif self.mode == "drip_body":  # a chunked JSON body, one space every 0.2 s
                        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                  b"transfer-encoding: chunked\r\n\r\n")
                        for _ in range(100):
                            if self._stop.wait(0.2):
                                break
                            c.sendall(b"1\r\n \r\n")
                    elif self.mode == "huge":  # 8 MiB of JSON whitespace around nothing
                        n = 8 << 20
                        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                  b"content-length: %d\r\n\r\n" % n)
                        for _ in range(n >> 16):
                            c.sendall(b" " * (1 << 16))
                    elif self.mode == "drop":  # read the request, close without a word
                        pass
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self.srv.close()
        self.thread.join(10)


@pytest.mark.parametrize("mode, status, says", [
    ("drip_headers", "timeout", "within 1 s"),
    ("drip_body", "timeout", "within 1 s"),
    ("huge", "error", "over 1048576 bytes"),
    ("drop", "error", "unreachable"),
])
def test_a_misbehaving_target_ends_the_replay_within_its_deadline(store, mode, status, says):
    """The deadline (``SHADOW_REPLAY_TIMEOUT_S`` = 1 s) bounds the whole exchange: a target that
    trickles its headers or body (each byte well within a per-read timeout) used to hold the
    replay — and the dispatch batch, so every later replay — for as long as it liked (20 s here,
    forever in general); a huge reply used to be read whole into memory. Each now ends as
    ``status`` with the reason, well within 1 s + the sidecar's own overhead."""
    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    store.insert_trials([dataclasses.replace(PROD, trial_id="p1", end_ns=time.time_ns())])
    target = _BadTarget(mode)
    stage = ShadowStage(Settings(shadow_targets={"1.0": target.url}, shadow_k=1, shadow_families=["nominal"],
                                 shadow_replay_timeout_s=1.0), store, proxy_base_url="http://127.0.0.1:9")
    try:
        stage.plan_now(trial_ids=["p1"])
        t0 = time.monotonic()
        assert stage.dispatch() == 1
        took = time.monotonic() - t0
        row, = stage.ledger.replays()
        assert row["status"] == status and says in row["error"], row["error"]
        assert took < 5.0, took
    finally:
        stage.shutdown()
        target.stop()


def test_a_tool_call_the_proxy_refuses_is_a_sandbox_miss_in_the_ledger_too(tmp_path):
    """A candidate whose first tool call carries 2 MiB of arguments: the proxy refuses it (413) and
    the agent gets a SandboxMiss — so its spans say sandbox miss and it is kept out of the agent
    metrics — but the ledger said ``completed`` with ``n_miss`` 0, so the gate's sandbox-miss rate
    (read from the ledger) hid it. Now the refusal is logged in the replay's call log."""
    from test_shadow_e2e import replay_and_wait, run_production, world

    with world(tmp_path, ("1.1",), RELYSCOPE_SHADOW_K="2", RELYSCOPE_SHADOW_FAMILIES='["nominal"]') as w:
        sc, effects = w.sc, w.effects
        run_production(sc, effects, tasks=1, runs=1)
        prod = sc.trials(run_kind="production")
        w.agent("1.1", "--huge-call")
        ids = replay_and_wait(sc, [prod[0]["trial_id"]])
        rows = [sc.get(f"/api/v1/shadow/replays/{i}").json() for i in ids]
        assert [(r["status"], r["n_miss"], r["n_calls"]) for r in rows] == [("sandbox_miss", 1, 3)] * 2
        assert all(r["calls"][0]["match"] == "refused" and "over 1048576 bytes" in r["calls"][0]["refused"]
                   for r in rows)
        for t in sc.trials(run_kind="shadow"):  # the spans agree: one get_order got the sandbox's miss
            assert [s["tool_name"] for s in t["steps"] if s["error"] == "sandbox_miss"] == ["get_order"]
        assert len(effects.read_text().splitlines()) == 1


def test_a_finished_replay_is_in_the_ledger_while_its_batch_still_runs(store):
    """Concurrency 1, three replays in one dispatch batch; the target answers the first at once and
    holds the others until their deadline (3 s). The first replay's result must be in the ledger
    while the others still run — it used to be written with the whole batch, so a kill -9 in
    between lost it (run again, its first attempt's spans thrown away)."""
    import json
    import socket
    import threading

    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        n = 0
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with c:
                c.settimeout(5)
                raw = b""
                while b"\r\n\r\n" not in raw:
                    raw += c.recv(1 << 16)
                head, body = raw.split(b"\r\n\r\n", 1)
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += c.recv(1 << 16)
                n += 1
                if n == 1:
                    reply = json.dumps({"replay_id": json.loads(body)["replay_id"], "status": "completed"}).encode()
                    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                              % (len(reply), reply))
                else:
                    stop.wait(4)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}/relyscope/replay"
    store.insert_trials([dataclasses.replace(PROD, trial_id="p1", end_ns=time.time_ns())])
    stage = ShadowStage(Settings(shadow_targets={"1.0": url}, shadow_k=3, shadow_families=["nominal"],
                                 shadow_concurrency=1, shadow_replay_timeout_s=3.0), store,
                        proxy_base_url="http://127.0.0.1:9")
    done = threading.Thread(target=stage.dispatch, daemon=True)
    try:
        stage.plan_now(trial_ids=["p1"])
        done.start()
        seen = {}
        deadline = time.monotonic() + 2.5  # before the second replay's deadline
        while time.monotonic() < deadline:
            seen = counts(r["status"] for r in stage.ledger.replays())
            if seen.get("completed"):
                break
            time.sleep(0.05)
        assert seen == {"completed": 1, "running": 2}, seen
        done.join(15)
        assert counts(r["status"] for r in stage.ledger.replays()) == {"completed": 1, "timeout": 2}
    finally:
        stop.set()
        done.join(15)
        stage.shutdown()
        srv.close()
        th.join(10)



def test_robustness_of_a_shadow_group_matches_a_hand_computation(store):
    """R_fault / R_env / R_prompt / R_Rob (metrics.md §4) of one shadow group, from the live
    rollups and from the batch profile, against values worked out by hand. Trials per task
    (S success, F failure, ? unknown, M a sandbox miss — kept out of agent metrics):

    ====  =========  =====  ===
    task  nominal    fault  env
    ====  =========  =====  ===
    A     S S F      S F    S
    B     S F        F M ?  —
    C     ?          S      —
    D     F F        F      F
    ====  =========  =====  ===

    R_fault over A, B, D (C has no nominal outcome): Acc_fault = (1 + 0 + 0) / (2 + 1 + 1) = 1/4,
    Acc_nominal = (2 + 1 + 0) / (3 + 2 + 2) = 3/7 → R_fault = (1/4) / (3/7) = 7/12.
    R_env over A, D: Acc_env = 1/2, Acc_nominal = 2/5 → min(5/4, 1) = 1. No prompt replay:
    R_prompt undefined (null, not 0 or 1). R_Rob = mean(7/12, 1) = 19/24."""
    from relyscope.model import Op, Step
    from relyscope.scorers.review import score_reviewed
    from relyscope.scoring.rollup import window_start
    from relyscope.scoring.stats import score_stats

    now = time.time_ns()
    plan = {"A": {"nominal": "SSF", "fault": "SF", "env": "S"}, "B": {"nominal": "SF", "fault": "FM?"},
            "C": {"nominal": "?", "fault": "S"}, "D": {"nominal": "FF", "fault": "F", "env": "F"}}
    miss = Step(span_id="f" * 16, parent_span_id="", action="lookup", op=Op.TOOL, name="execute_tool lookup",
                start_ns=1, end_ns=2, tool_name="lookup", arguments={}, error="sandbox_miss")
    trials = []
    for task, fams in plan.items():
        for fam, outs in fams.items():
            for i, o in enumerate(outs):
                tid = f"{task}{fam}{i}"
                trials.append(dataclasses.replace(
                    PROD, trial_id=tid, trace_id=uuid.uuid5(uuid.NAMESPACE_OID, tid).hex, task_id=task,
                    run_kind="shadow", perturbation_family=fam, end_ns=now - 10**9,
                    outcome={"S": "success", "F": "failure"}.get(o, "unknown"),
                    outcome_source=None if o in "?M" else "db_state",
                    steps=PROD.steps + ((miss,) if o == "M" else ())))
    store.insert_trials(trials)
    rollup = Rollup(store, None)
    rollup.sync()
    live = score_stats(rollup.window_stats(("agent", "1.0", "shadow"), window_start(now / 1e9, None), None),
                       n_boot=50, seed=0, safety_measured=False)
    batch, _ = score_reviewed(store.load_trials(run_kind="shadow"), None, n_boot=50, seed=0)
    for score in (live, batch):
        m = score.metrics
        assert m["R_fault"].value == pytest.approx(7 / 12) and m["R_fault"].n_tasks == 3
        assert m["R_env"].value == pytest.approx(1.0) and m["R_env"].n_tasks == 2
        assert m["R_prompt"].value is None or m["R_prompt"].value != m["R_prompt"].value  # undefined
        assert m["R_Rob"].value == pytest.approx(19 / 24)


def test_a_side_effect_answered_with_an_injected_broken_body_did_not_take_effect():
    """Fault family: the sandbox answers ``issue_refund`` with an injected malformed body (a 200
    whose body is broken: the step has no error, its ``fault_type`` says ``invalid_response``).
    An agent that retries gets the recorded result the second time: it did the refund once, as
    production did → success. It used to count the faulted call as a refund too (2 ≠ 1 →
    failure), while an agent that ignored the broken answer and stopped scored success: R_fault
    rewarded ignoring faults. Now the ignoring agent made no refund that took effect → failure."""
    from relyscope.model import Op, Step
    from relyscope.scorers.replay_outcome import equivalence_outcome

    def refund(i: int, **kw) -> Step:
        return Step(span_id=f"{i:016x}", parent_span_id="", action="issue_refund", op=Op.TOOL,
                    name="execute_tool issue_refund", start_ns=i, end_ns=i + 1, tool_name="issue_refund",
                    arguments={"id": 1, "amount": 30}, side_effect="irreversible", **kw)

    lookup = PROD.steps[:2]
    broken = refund(3, result='{"ok": tr', fault_type="invalid_response")
    retried = dataclasses.replace(PROD, trial_id="r1", run_kind="shadow", shadow_of=PROD.trial_id,
                                  outcome="unknown", perturbation_family="fault",
                                  steps=lookup + (broken, refund(4, result={"ok": True})))
    ignored = dataclasses.replace(retried, trial_id="r2", steps=lookup + (broken,))
    assert equivalence_outcome(retried, PROD) == "success"
    assert equivalence_outcome(ignored, PROD) == "failure"


def test_planning_again_cancels_the_superseded_replays_that_have_not_started(store):
    """Experiment started twice: ``again`` while the first experiment's replays still wait. Those
    would never count (the new experiment supersedes them) yet ran first (dispatch is oldest
    first), holding the re-run back by a whole experiment. They are now cancelled, saying why,
    and the next dispatch runs the new experiment's replays."""
    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    store.insert_trials([dataclasses.replace(PROD, trial_id="p1", end_ns=time.time_ns())])
    stage = ShadowStage(Settings(shadow_targets={"1.0": "http://127.0.0.1:9/replay"}, shadow_k=2,
                                 shadow_families=["nominal"], shadow_replay_timeout_s=1.0), store,
                        proxy_base_url="http://127.0.0.1:9")
    try:
        first = stage.plan_now(trial_ids=["p1"])
        second = stage.plan_now(trial_ids=["p1"], again=True)
        rows = {r["replay_id"]: r for r in stage.ledger.replays()}
        assert {rows[i]["status"] for i in first["replay_ids"]} == {"cancelled"}
        assert all("superseded by experiment" in rows[i]["error"] for i in first["replay_ids"])
        assert {rows[i]["status"] for i in second["replay_ids"]} == {"scheduled"}
        assert stage.dispatch(max_n=2) == 2  # the new experiment's two replays (target down: error)
        rows = {r["replay_id"]: r for r in stage.ledger.replays()}
        assert {rows[i]["status"] for i in second["replay_ids"]} == {"error"}
        assert {rows[i]["status"] for i in first["replay_ids"]} == {"cancelled"}
    finally:
        stage.shutdown()


def test_a_tool_call_after_the_target_answered_is_a_sandbox_miss_of_its_replay(tmp_path):
    """A replay endpoint that answers at once and runs the agent in the background (a real
    pattern: an async job API). The sidecar ends the attempt at the answer, so every tool call the
    agent then makes gets the sandbox's miss — its trial is kept out of the agent metrics — but
    the ledger said ``completed`` with no miss, and the gate's sandbox-miss rate hid it. The late
    call is now logged in the replay's call log and the row becomes ``sandbox_miss``."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from test_shadow_e2e import run_production, world

    late: list[int] = []

    class Early(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            req = json.loads(self.rfile.read(int(self.headers["content-length"])))
            body = json.dumps({"replay_id": req["replay_id"], "status": "completed"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            time.sleep(0.3)  # the "background" agent's first tool call, after the answer
            r = httpx.post(req["tool_proxy"]["url"], json={"name": "get_order", "arguments": {"order_id": "ORD-1000"},
                                                           "side_effect": "read", "index": 0}, timeout=10)
            late.append(r.status_code)

        def log_message(self, *a):
            pass

    with world(tmp_path, ("1.0",), RELYSCOPE_SHADOW_K="1", RELYSCOPE_SHADOW_FAMILIES='["nominal"]') as w:
        sc = w.sc
        run_production(sc, w.effects, tasks=1, runs=1)
        prod = sc.trials(run_kind="production")
        srv = ThreadingHTTPServer(("127.0.0.1", w.ports["1.0"]), Early)
        th = threading.Thread(target=srv.serve_forever, daemon=True)
        th.start()
        try:
            rid, = sc.post("/api/v1/shadow/replays", json={"trial_ids": [prod[0]["trial_id"]]}).json()["replay_ids"]
            deadline = time.monotonic() + 30
            row = {}
            while time.monotonic() < deadline:
                row = sc.get(f"/api/v1/shadow/replays/{rid}").json()
                if late and row["status"] == "sandbox_miss":
                    break
                time.sleep(0.2)
            assert late == [404]
            assert (row["status"], row["n_miss"], row["n_calls"]) == ("sandbox_miss", 1, 1), row
            assert row["calls"][0]["match"] == "refused" and "after its replay had ended" in row["calls"][0]["refused"]
        finally:
            srv.shutdown()
            srv.server_close()
            th.join(10)


def test_two_sidecars_sharing_a_store_do_not_run_each_others_replays(store, tmp_path, monkeypatch):
    """One sidecar per pod, one ClickHouse (architecture.md "Scale"): sidecar B saw sidecar A's
    ``running`` rows as cut off by a crash and ran them again — every replay ran twice, A's
    attempt superseded mid-flight. B now leaves them to A (its rows say which sidecar runs them),
    and takes them over only once they are older than any attempt can last."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    seen: list[str] = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            req = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append(req["replay_id"])
            time.sleep(1.5)
            body = json.dumps({"replay_id": req["replay_id"], "status": "completed"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/relyscope/replay"
    store.insert_trials([dataclasses.replace(PROD, trial_id="p1", end_ns=time.time_ns())])
    settings = Settings(shadow_targets={"1.0": url}, shadow_k=2, shadow_families=["nominal"],
                        shadow_concurrency=2, shadow_replay_timeout_s=5.0)
    a = ShadowStage(settings, store, proxy_base_url="http://127.0.0.1:9", state_path=str(tmp_path / "a.json"))
    b = ShadowStage(settings, store, proxy_base_url="http://127.0.0.1:9", state_path=str(tmp_path / "b.json"))
    runner = threading.Thread(target=a.dispatch, daemon=True)
    try:
        ids = a.plan_now(trial_ids=["p1"])["replay_ids"]
        runner.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(seen) < 2:
            time.sleep(0.02)
        assert sorted(seen) == sorted(ids)  # A runs both
        assert b.dispatch() == 0  # B takes nothing: A is running them
        runner.join(15)
        assert counts(r["status"] for r in a.ledger.replays()) == {"completed": 2}
        assert sorted(seen) == sorted(ids)  # each replay ran once
        # A "dies" with a row running: B takes it over once it is older than deadline + margin
        row = a.ledger.replays(replay_ids=[ids[0]])[0]
        a.ledger.write_replays([{**row, "status": "running", "error": f"running on {a.owner}"}])
        assert b.dispatch() == 0
        monkeypatch.setattr("relyscope.shadow.stage._STALE_MARGIN_S", -10.0)  # as if deadline + margin passed
        assert b.dispatch() == 1
        assert seen.count(ids[0]) == 2
    finally:
        a.shutdown()
        b.shutdown()
        srv.shutdown()
        srv.server_close()
        th.join(10)


def test_a_family_named_twice_is_planned_once(store):
    """``SHADOW_FAMILIES='["nominal", "fault", "fault"]'`` (a sloppy edit): the plan listed every
    fault replay twice — the same ids — so ``start`` announced 2 + 4 replays, its progress bar
    counted to 6 and the scheduled counter doubled, for 4 replays in the ledger."""
    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    store.insert_trials([dataclasses.replace(PROD, trial_id="p1", end_ns=time.time_ns())])
    stage = ShadowStage(Settings(shadow_targets={"1.0": "http://127.0.0.1:9/replay"}, shadow_k=2,
                                 shadow_families=["nominal", "fault", "fault"]), store,
                        proxy_base_url="http://127.0.0.1:9")
    try:
        ids = stage.plan_now(trial_ids=["p1"])["replay_ids"]
        assert len(ids) == len(set(ids)) == 4
        assert dict(stage.counts["scheduled"]) == {"nominal": 2, "fault": 2}
        assert len(stage.ledger.replays()) == 4
    finally:
        stage.shutdown()


def test_decisions_that_could_not_be_stored_do_not_use_up_the_hourly_cap(chdb_path, tmp_path):
    """Rate 1, cap 1 per hour, two finished runs. The store refuses the decisions once (a
    transient error after the replays were planned): the retry next tick decided the first run
    ``over_cap`` — the failed try had already counted it against the cap — although its replays
    were scheduled. Now the cap is taken only once the decisions are stored: the first run is
    ``sampled``, the second ``over_cap``, and each has one decision."""
    import json

    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    fault = tmp_path / "fault"
    store = Store(f"chdb://{chdb_path}", database="b" + uuid.uuid4().hex[:10], fault_file=str(fault))
    now = time.time_ns()
    store.insert_trials([dataclasses.replace(PROD, trial_id="p1", trace_id="1" * 32, end_ns=now - 2 * 10**9),
                         dataclasses.replace(PROD, trial_id="p2", trace_id="2" * 32, end_ns=now - 10**9)])
    stage = ShadowStage(Settings(shadow_targets={"1.0": "http://127.0.0.1:9/replay"}, shadow_k=1,
                                 shadow_families=["nominal"], shadow_rate=1.0, shadow_cap_per_hour=1,
                                 shadow_quiet_s=0), store, proxy_base_url="http://127.0.0.1:9")
    try:
        fault.write_text(json.dumps({"code": 241, "tables": ["shadow_samples"]}))  # MEMORY_LIMIT_EXCEEDED
        with pytest.raises(StoreUnavailable):
            stage.sample(now)
        fault.unlink()
        got = {d.trial_id: d.decision for d in stage.sample(now)}
        assert got == {"p1": "sampled", "p2": "over_cap"}
        assert {r["shadow_of"] for r in stage.ledger.replays()} == {"p1"}
    finally:
        stage.shutdown()


def test_start_by_tasks_replays_one_run_per_task(store):
    """``shadow start --last N`` counts runs: with 5 runs per task, ``--last 10`` picked 2 tasks'
    worth and ×K×families×targets replays each. ``tasks: N`` picks the most recent replayable run
    of each of the N (agent, task) pairs run most recently; an unreplayable most recent run gives
    way to the task's next one."""
    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    now = time.time_ns()
    runs = []  # task a: newest, 3 runs; b: 2 runs, its newest not replayable (no input); c: oldest
    for i, (task, age_s, replayable) in enumerate([("a", 1, True), ("a", 2, True), ("b", 3, False), ("a", 4, True),
                                                   ("b", 5, True), ("c", 6, True)]):
        t = dataclasses.replace(PROD, trial_id=f"{task}{i}", trace_id=f"{i + 1:032x}", task_id=task,
                                end_ns=now - age_s * 10**9)
        runs.append(t if replayable else dataclasses.replace(t, task_input=None, steps=()))
    store.insert_trials(runs)
    stage = ShadowStage(Settings(shadow_targets={"1.0": "http://127.0.0.1:9/replay"}, shadow_k=1,
                                 shadow_families=["nominal"]), store, proxy_base_url="http://127.0.0.1:9")
    try:
        plan = stage.plan_now(tasks=2)
        assert plan["trials"] == ["a0", "b4"]
        assert len(plan["replay_ids"]) == 2
        assert [s["trial_id"] for s in plan["skipped"]] == ["b2"]
        assert stage.plan_now(last=2)["trials"] == ["a0", "a1"]
        assert stage.plan_now(tasks=5)["trials"] == ["a0", "b4", "c5"]  # only three tasks
    finally:
        stage.shutdown()


def test_a_rerun_that_never_reached_the_target_does_not_supersede(store):
    """`shadow start --again` with the target down: every replay of the new experiment ended
    `error`, yet it superseded the earlier, completed experiment — the gate then had no shadow
    runs at all ("has no shadow runs; versions with shadow runs: 1.0.0 (28 runs)"). An experiment
    supersedes only once one of its replays ran or may still run (breaker round 2, #5)."""
    ledger = ShadowLedger(store)
    t1, t2, t3 = "a" * 32, "b" * 32, "c" * 32
    ledger.write_replays([_ledger_row(t1, "completed")])
    ledger.write_replays([{**_ledger_row(t2, "error"), "replay_id": "r2", "experiment": "e2",
                           "scheduled_at": 1_700_000_100.0}])
    assert ledger.replay_traces(["p1"]) == {"p1": {t1}}
    assert ledger.sandbox_stats("1.0") == (1, 0)
    ledger.write_replays([{**_ledger_row(t3, "scheduled"), "replay_id": "r3", "experiment": "e3",
                           "scheduled_at": 1_700_000_200.0}])
    assert ledger.replay_traces(["p1"]) == {"p1": {t3}}  # a re-run under way supersedes


def test_start_looks_past_the_newest_runs_when_they_cannot_be_replayed(store):
    """``--last 1`` / ``--tasks 3`` read the 4n newest runs only: four new runs without recorded
    input hid every older replayable run ("planned 0 replays of 0 trials", exit 0). The pick now
    reads further back until it has enough (breaker round 2, #2); the reply lists the first 20
    skipped runs and counts them all."""
    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage

    now = time.time_ns()
    old = [dataclasses.replace(PROD, trial_id=f"old{i}", trace_id=f"{i + 1:032x}", task_id=f"t{i % 3}",
                               end_ns=now - (100 + i) * 10**9) for i in range(6)]
    new = [dataclasses.replace(PROD, trial_id=f"new{i}", trace_id=f"{i + 100:032x}", task_id=f"n{i}",
                               end_ns=now - i * 10**9, task_input=None, steps=()) for i in range(30)]
    store.insert_trials(old + new)
    stage = ShadowStage(Settings(shadow_targets={"1.0": "http://127.0.0.1:9/replay"}, shadow_k=1,
                                 shadow_families=["nominal"]), store, proxy_base_url="http://127.0.0.1:9")
    try:
        plan = stage.plan_now(last=1)
        assert plan["trials"] == ["old0"]
        assert plan["skipped_total"] == 30 and len(plan["skipped"]) == 20
        assert stage.plan_now(tasks=3)["trials"] == ["old0", "old1", "old2"]
    finally:
        stage.shutdown()
