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

from relyscope.testing import RELYSCOPE_BIN, start_sidecar


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
    # no sidecar at --api: the directory is in use and nothing vouches for it
    r = _cli("report", "--n-boot", "0", "--api", "http://127.0.0.1:9", "--store", f"chdb://{a}")
    assert r.returncode == 1
    err = " ".join(r.stderr.split())
    assert "in use by another process" in err and "http://127.0.0.1:9 does not answer" in err, err


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
