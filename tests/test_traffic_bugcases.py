"""Bug cases D03–D21 (shared/data/bugcases) and the classes of issue 11 over the wire: real HTTP /
gRPC to real sidecar processes (``relyscope.testing``), asserting the reply, what is stored and
what is scored.

Cases that need no special settings share one module sidecar (``sc``); each case's trace ids are
its own, so they do not interfere. Expected values are worked out by hand from the case files (the
comment beside each number says how), never copied from the sidecar's output.
"""

from __future__ import annotations

import json

import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from prometheus_client.parser import text_string_to_metric_families

from conftest import DATA, start_sidecar

CASES = DATA / "bugcases"
JSON_H = {"Content-Type": "application/json"}


# ---- helpers ------------------------------------------------------------------------------------

def _case(name: str) -> dict:
    return json.loads(next(CASES.glob(f"{name}_*.json")).read_text())


def _spans_of(body: dict) -> list[dict]:
    return [sp for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def _attr(span: dict, key: str):
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


def _post(sc, body, headers=JSON_H, path="/v1/traces") -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{sc.otlp_http}{path}", content=data, headers=headers, timeout=60)


def _ok(r: httpx.Response) -> ExportTraceServiceResponse:
    assert r.status_code == 200, (r.status_code, r.content[:500])
    return json_format.Parse(r.content, ExportTraceServiceResponse())


def _send_case(sc, name: str) -> list[ExportTraceServiceResponse]:
    return [_ok(_post(sc, r["body"], r["headers"])) for r in _case(name)["requests"]]


def _flush(sc, timeout_s: float = 60) -> None:
    r = sc.post("/api/v1/flush", params={"timeout_s": timeout_s})
    assert r.status_code == 200, r.text


def _trials_of(sc, trace_ids) -> list[dict]:
    tids = set(trace_ids)
    return sorted((t for t in sc.trials() if t["trace_id"] in tids), key=lambda t: t["start_ns"])


def _counters(sc) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(sc.get("/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(c: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in c.items() if n == name and want <= set(ls))


def _group(sc, agent: str, run_kind: str = "production") -> dict:
    groups = [g for g in sc.report()["groups"] if g["agent"] == agent and g["run_kind"] == run_kind]
    assert len(groups) == 1, sc.report()["groups"]
    return groups[0]


def _stop(sc) -> None:
    sc.kill()


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    """One sidecar with default settings for every case that needs none."""
    s = start_sidecar(tmp_path_factory.mktemp("traffic"))
    try:
        yield s
    finally:
        _stop(s)


# ---- D18: a batch spanning > 100 days ----------------------------------------------------------

def test_d18_batch_spanning_120_days_is_stored_and_scored(sc):
    case = _case("D18")
    [req] = case["requests"]
    spans = _spans_of(req["body"])
    days = {int(sp["startTimeUnixNano"]) // (86400 * 10**9) for sp in spans}
    assert len(spans) == 240 and len(days) > 100  # the case really spans more than 100 UTC days
    trace_ids = {sp["traceId"] for sp in spans}
    roots = [sp for sp in spans if not sp.get("parentSpanId")]
    tasks = {_attr(sp, "relyscope.task.id") for sp in roots}
    agent = _attr(roots[0], "gen_ai.agent.name")
    assert len(trace_ids) == len(roots) == 120 and len(tasks) == 10

    before = _counters(sc)
    [resp] = _send_case(sc, "D18")
    assert resp.partial_success.rejected_spans == 0
    _flush(sc)
    stored = sc.get("/api/v1/spans", params={"keys": True}).json()["keys"]
    assert len({tuple(k) for k in stored if k[0] in trace_ids}) == 240
    trials = _trials_of(sc, trace_ids)
    assert len(trials) == 120
    assert {t["task_id"] for t in trials} == tasks
    assert {t["run_kind"] for t in trials} == {"offline"}
    g = _group(sc, agent, "offline")
    assert (g["tasks"], g["trials"]) == (10, 120)
    after = _counters(sc)
    assert _sum(after, "relyscope_spans_rejected_total") == _sum(before, "relyscope_spans_rejected_total")
    health = sc.get("/healthz").json()
    assert health["status"] == "ok" and not health["last_error"], health
    quarantine = sc.data_dir / "spool.quarantine"
    assert not quarantine.exists() or not any(quarantine.iterdir())
