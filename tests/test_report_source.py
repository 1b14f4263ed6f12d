"""``relyscope report --store DIR`` reads that store, never a running sidecar's other one, and the
report says where it came from; ``relyscope score`` on spans with no agent run gives a hint that
fits an offline command (no grace period or flush to wait for).

Real processes: a sidecar (``relyscope serve``) holding store A with agent ``alpha``; store B
written by ``relyscope score --keep-store`` from a file with agent ``beta``; the CLI in its own
process (chDB lets one process open a data directory).
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from relyscope.testing import RELYSCOPE_BIN, http_stub, start_sidecar


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env["COLUMNS"] = "250"
    return env


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RELYSCOPE_BIN), *args], capture_output=True, text=True, timeout=300, env=_env(),
                          cwd=cwd)


def _body(agent: str, tid: int) -> dict:
    span = {"traceId": f"{tid:032x}", "spanId": f"{tid:016x}", "name": f"invoke_agent {agent}", "kind": 1,
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           {"key": "gen_ai.agent.name", "value": {"stringValue": agent}},
                           {"key": "relyscope.task.id", "value": {"stringValue": f"{agent}-task"}},
                           {"key": "relyscope.outcome", "value": {"stringValue": "success"}}]}
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}


def _agents(stdout: str) -> set[str]:
    return {g["agent"] for g in json.loads(stdout)["groups"]}


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
    """(sidecar holding store A with alpha, path of store B with beta)."""
    d = tmp_path_factory.mktemp("src")
    f = d / "beta.otlp.json"
    f.write_text(json.dumps(_body("beta", 2)))
    r = _cli("score", "--format", "json", "--n-boot", "0", "--keep-store", str(d / "b"), str(f))
    assert r.returncode == 0, r.stderr
    sc = start_sidecar(d / "a")
    try:
        assert httpx.post(sc.otlp_http + "/v1/traces", json=_body("alpha", 1), timeout=30).status_code == 200
        sc.flush()
        yield sc, d / "b"
    finally:
        sc.kill()


def test_explicit_store_is_read_even_when_a_sidecar_answers(two_stores):
    sc, b = two_stores
    r = _cli("report", "--format", "json", "--n-boot", "0", "--api", sc.api, "--store", f"chdb://{b}")
    assert r.returncode == 0, r.stderr
    assert _agents(r.stdout) == {"beta"}  # before the fix: {"alpha"}, the sidecar's store
    assert json.loads(r.stdout)["source"] == {"from": "store", "api": None, "store": f"chdb://{b}"}
    table = _cli("report", "--n-boot", "0", "--api", sc.api, "--store", f"chdb://{b}")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0] == f"report from store chdb://{b}"
    assert "beta" in table.stdout and "alpha" not in table.stdout


def test_without_store_the_sidecar_answers_and_the_header_says_so(two_stores):
    sc, _ = two_stores
    r = _cli("report", "--n-boot", "0", "--api", sc.api)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"report from the sidecar at {sc.api}"
    assert "alpha" in r.stdout


def test_store_held_by_the_sidecar_is_read_through_it_and_says_so(two_stores):
    """chDB: the sidecar's own data directory cannot be opened by a second process; the report
    comes from that sidecar once its /healthz names the same directory — and from no other."""
    sc, _ = two_stores
    a = sc.data_dir / "data"
    r = _cli("report", "--format", "json", "--n-boot", "0", "--api", sc.api, "--store", f"chdb://{a}")
    assert r.returncode == 0, r.stderr
    assert _agents(r.stdout) == {"alpha"}
    assert json.loads(r.stdout)["source"] == {"from": "sidecar", "api": sc.api, "store": f"chdb://{a}"}
    assert f"is held by the sidecar at {sc.api}" in " ".join(r.stderr.split())
    assert "DB::Exception" not in r.stderr and "Cannot lock file" not in r.stderr, r.stderr  # chDB's own print
    # no sidecar at --api: the directory is in use and nothing vouches for it
    r = _cli("report", "--n-boot", "0", "--api", "http://127.0.0.1:9", "--store", f"chdb://{a}")
    assert r.returncode == 1
    err = " ".join(r.stderr.split())
    assert "in use by another process" in err and "http://127.0.0.1:9 does not answer" in err, err
    assert "DB::Exception" not in err, err


def test_score_of_spans_without_an_agent_run_gives_an_offline_hint(tmp_path):
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "GET /health", "kind": 2,
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000",
            "attributes": [{"key": "http.request.method", "value": {"stringValue": "GET"}}]}
    f = tmp_path / "http.otlp.json"
    f.write_text(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [span]}]}]}))
    r = _cli("score", "--n-boot", "0", str(f))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    # a live sidecar's hint (wait RELYSCOPE_GRACE_PERIOD_S, POST /api/v1/flush) means nothing here
    assert "GRACE_PERIOD" not in out and "flush" not in out and "no finalized trials yet" not in out, out
    assert "no trials" in out and "none of the 1 stored spans is part of an agent run" in out, out
    assert "nothing is pending" in out


_REPLAYS = r"""
import sys
from relyscope.model import Op, Step, Trial
from relyscope.store import Store

def step(i, name, args, se=None):
    return Step(span_id=f"{i:016x}", parent_span_id="", action=name, op=Op.TOOL, name=f"execute_tool {name}",
                start_ns=i, end_ns=i + 1, tool_name=name, arguments=args, result={"ok": True}, side_effect=se)

def trial(tid, steps, outcome, run_kind="production", shadow_of=None):
    return Trial(trial_id=tid, trace_id=f"{abs(hash(tid)) % 10**30:032x}", root_span_id="b" * 16, task_id="task",
                 task_id_source="attribute", agent_name="agent", agent_version="1.0", run_kind=run_kind,
                 outcome=outcome, outcome_source=None, outcome_score=None, claimed_success=None, confidence=None,
                 conversation_id=None, start_ns=10**18, end_ns=10**18 + 10**9, steps=tuple(steps),
                 shadow_of=shadow_of, task_input="refund ORD-1")

refund = [step(1, "get_order", {"id": 1}, "read"), step(2, "issue_refund", {"id": 1, "amount": 30}, "irreversible")]
other = [step(1, "get_order", {"id": 1}, "read"), step(2, "issue_refund", {"id": 1, "amount": 99}, "irreversible")]
st = Store(sys.argv[1])
st.insert_trials([
    trial("p1", refund, "success"), trial("p2", [step(1, "wire", {"to": "x"})], "success"),
    trial("r1", refund, "unknown", "shadow", "p1"),                     # the same refund: success
    trial("r2", other, "unknown", "shadow", "p1"),                      # another amount: failure
    trial("r3", [step(1, "wire", {"to": "y"})], "unknown", "shadow", "p2"),  # side-effecting by the policy only
])
st.close()
"""


def test_a_stores_report_grades_replays_and_reads_the_policy_as_the_sidecar_does(tmp_path):
    """``report --store`` scored the stored trials with posted outcomes only: every shadow replay
    (outcome unknown in its spans) stayed unknown, so a demo store's shadow groups read "288
    unknown", S_* undefined, and RELYSCOPE_POLICY_FILE (which its own note recommends) changed
    nothing. Replays are now graded by side-effect equivalence with their production runs
    (metrics.md §6 item 4), with the policy's side effects. By hand: r1 repeats p1's refund →
    success; r2 refunds another amount → failure; r3 wires elsewhere than p2, a side effect only
    under the policy (``wire: write``) → failure with it, success without (both signatures empty)."""
    import sys

    dsn = f"chdb://{tmp_path / 'data'}"
    made = subprocess.run([sys.executable, "-c", _REPLAYS, dsn], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    policy = tmp_path / "policy.yaml"
    policy.write_text("agent: agent\nside_effects:\n  wire: write\nrules: []\n")

    def shadow_outcomes(**env) -> dict:
        r = subprocess.run([str(RELYSCOPE_BIN), "report", "--format", "json", "--n-boot", "0",
                            "--api", "http://127.0.0.1:9", "--store", dsn], capture_output=True, text=True,
                           timeout=300, env={**_env(), **env})
        assert r.returncode == 0, r.stderr
        (g,) = [g for g in json.loads(r.stdout)["groups"] if g["run_kind"] == "shadow"]
        return g["outcomes"]

    assert shadow_outcomes() == {"success": 2, "failure": 1, "unknown": 0}
    assert shadow_outcomes(RELYSCOPE_POLICY_FILE=str(policy)) == {"success": 1, "failure": 2, "unknown": 0}


@pytest.mark.parametrize("cmd", [("report", "--n-boot", "0"), ("history", "success_rate")])
def test_api_pointed_at_the_otlp_port_says_so(two_stores, cmd):
    """Bug: ``--api`` given the OTLP/HTTP receiver's address printed only "answered 404" and
    the receiver's body; the message now says that address is not the management API."""
    sc, _ = two_stores
    r = _cli(*cmd, "--api", sc.otlp_http)
    assert r.returncode == 1
    msg = " ".join(r.stderr.split())
    assert "not a relyscope management API" in msg and "RELYSCOPE_API" in msg, r.stderr


@pytest.mark.parametrize("cmd", [("report", "--n-boot", "0"), ("history", "success_rate")])
def test_api_pointed_at_the_grpc_port_says_so(two_stores, cmd):
    """Bug: ``--api`` given the OTLP/gRPC receiver's address (HTTP/2 only) was taken for "no
    sidecar answers", and ``report`` went on to read the local store instead."""
    sc, _ = two_stores
    r = _cli(*cmd, "--api", f"http://127.0.0.1:{sc.grpc_port}")
    msg = " ".join(r.stderr.split())
    assert r.returncode == 1 and "does not answer HTTP/1.1" in msg and "RELYSCOPE_API" in msg, r.stderr
    assert "reading" not in msg and "no sidecar" not in msg


@pytest.mark.parametrize("body, ctype", [(b"<html><body>hello</body></html>", "text/html"),
                                         (b'{"foo": 1}', "application/json"),
                                         (b'[1, 2]', "application/json")])
@pytest.mark.parametrize("cmd", [("report", "--n-boot", "0"), ("history", "success_rate"), ("shadow", "list"),
                                 ("shadow", "samples"), ("shadow", "show", "abc"), ("shadow", "start", "--last", "1"),
                                 ("gate", "--baseline", "v1", "--candidate", "v2")])
def test_api_pointed_at_another_web_server_says_so(cmd, body, ctype):
    """Bug: a web server answering 200 with HTML gave a JSONDecodeError traceback, one answering
    other JSON was taken for a report (TypeError) or printed as an empty one."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815 - shadow start, gate

        def log_message(self, *a):
            pass

    fmt = ("--format", "json") if cmd[0] in ("report", "history", "gate") else ()
    with http_stub(Handler) as port:
        r = _cli(*cmd, *fmt, "--api", f"http://127.0.0.1:{port}")
    msg = " ".join(r.stderr.split())
    # report / history exit 1 (no report), shadow and gate 2 (error: gate's 1 is "block")
    assert r.returncode == (1 if cmd[0] in ("report", "history") else 2), r.stderr
    assert "not a relyscope management API" in msg, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
