"""Backpressure and durability of the sidecar data path, over real OTLP on loopback.

The issue: a bounded in-memory queue in front of a durable spool; a batch is acknowledged only once
it is in the spool; a store outage keeps accepting (into the spool) and drains afterwards; a full
spool answers HTTP 503 + Retry-After / gRPC RESOURCE_EXHAUSTED, never a silent drop; the spool is
replayed on start; ``kill -9`` at any moment loses no acknowledged span and duplicates none in the
scores.

Expected values are worked out from what each test itself sent: every span key it sent, which
requests were acknowledged, and the documented trial id ``{trace_id}:{root span_id}``
(conventions.md §2). A store outage is produced with ``RELYSCOPE_FAULT_STORE_DOWN_FILE`` (there is
no ClickHouse server here, only embedded chDB). Every wait is a bounded poll; nothing asserts on
timing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from conftest import SidecarProc, start_sidecar

T0 = 1_700_000_000_000_000_000  # ns
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# ---- building OTLP requests ---------------------------------------------------------------------
def make_trace(trace_id: str, *, task: str, n_children: int = 4) -> list[dict]:
    """One agent run: an ``invoke_agent`` root and ``n_children`` children alternating chat
    (10 input / 5 output tokens each) and execute_tool ``lookup``. Span ids derive from the trace id."""
    root = trace_id[-8:] + "00000001"
    base = T0 + int(trace_id[-8:], 16) * 10_000_000
    spans = [{"trace": trace_id, "span": root, "parent": "", "name": "invoke_agent dur-agent",
              "start": base, "end": base + 9_000_000,
              "attrs": {"gen_ai.operation.name": "invoke_agent", "relyscope.task.id": task,
                        "relyscope.outcome": "success"}}]
    for i in range(n_children):
        sid = f"{trace_id[-8:]}{i + 2:08x}"
        start = base + (i + 1) * 1_000_000
        if i % 2 == 0:
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10,
                     "gen_ai.usage.output_tokens": 5}
            name = "chat m"
        else:
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
            name = "execute_tool lookup"
        spans.append({"trace": trace_id, "span": sid, "parent": root, "name": name,
                      "start": start, "end": start + 500_000, "attrs": attrs})
    return spans


def trace_id_of(*parts: int) -> str:
    """A valid (non-zero) 32-hex trace id from small integers."""
    return "".join(f"{p:08x}" for p in (0x5EED0000 + parts[0], *parts[1:])).rjust(32, "1")[-32:]


def _any_value_json(v):
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": str(v)}


def otlp_json(spans: list[dict], service: str = "dur-agent") -> bytes:
    """OTLP/JSON ExportTraceServiceRequest (hex ids, as the OTLP spec says)."""
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}},
                                    {"key": "service.version", "value": {"stringValue": "1.0"}}]},
        "scopeSpans": [{"scope": {"name": "durability-test"}, "spans": [{
            "traceId": s["trace"], "spanId": s["span"], "parentSpanId": s["parent"], "name": s["name"],
            "kind": 1, "startTimeUnixNano": str(s["start"]), "endTimeUnixNano": str(s["end"]),
            "attributes": [{"key": k, "value": _any_value_json(v)} for k, v in s["attrs"].items()],
        } for s in spans]}],
    }]}).encode()


def otlp_proto(spans: list[dict], service: str = "dur-agent") -> bytes:
    """OTLP/protobuf ExportTraceServiceRequest with the same content as :func:`otlp_json`."""
    def kv(k, v):
        if isinstance(v, bool):
            av = common_pb2.AnyValue(bool_value=v)
        elif isinstance(v, int):
            av = common_pb2.AnyValue(int_value=v)
        else:
            av = common_pb2.AnyValue(string_value=str(v))
        return common_pb2.KeyValue(key=k, value=av)

    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([kv("service.name", service), kv("service.version", "1.0")])
    ss = rs.scope_spans.add()
    ss.scope.name = "durability-test"
    for s in spans:
        ss.spans.append(trace_pb2.Span(
            trace_id=bytes.fromhex(s["trace"]), span_id=bytes.fromhex(s["span"]),
            parent_span_id=bytes.fromhex(s["parent"]) if s["parent"] else b"", name=s["name"],
            kind=1, start_time_unix_nano=s["start"], end_time_unix_nano=s["end"],
            attributes=[kv(k, v) for k, v in s["attrs"].items()]))
    return req.SerializeToString()


def keys_of(spans: list[dict]) -> set[tuple[str, str]]:
    return {(s["trace"], s["span"]) for s in spans}


def post_json(sc: SidecarProc, spans: list[dict], client: httpx.Client | None = None,
              timeout: float = 20) -> httpx.Response:
    c = client or httpx
    return c.post(sc.otlp_http + "/v1/traces", content=otlp_json(spans),
                  headers={"content-type": "application/json"}, timeout=timeout)


# ---- reading the sidecar ----------------------------------------------------------------------
def metric(sc: SidecarProc, name: str, labels: str | None = None) -> float:
    """The one sample of ``name`` on /metrics; ``labels``: of the sample whose label set is
    exactly that text (``'reason="backlog"'``)."""
    text = sc.get("/metrics").text
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.split("{")[0].split(" ")[0] == name
            and (labels is None or line.startswith(f"{name}{{{labels}}} "))]
    assert len(vals) == 1, f"{name} {labels or ''} not exported once"
    return vals[0]


def stored_keys(sc: SidecarProc) -> set[tuple[str, str]]:
    r = sc.get("/api/v1/spans", params={"keys": "true"})
    assert r.status_code == 200, r.text
    return {tuple(k) for k in r.json()["keys"]}


def wait_until(pred, timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def flush(sc: SidecarProc, timeout_s: float = 60) -> None:
    r = sc.post("/api/v1/flush", params={"timeout_s": timeout_s})
    assert r.status_code == 200, r.text


def check_trials(sc: SidecarProc, traces: dict[str, list[dict]]) -> list[dict]:
    """The trials table holds exactly one complete trial per trace in ``traces``, with the
    documented id ``{trace}:{root}``, 2 model calls (20 input tokens) and 2 tool calls; the report
    counts the same trials."""
    trials = sc.trials(limit=100000)
    ids = [t["trial_id"] for t in trials]
    assert len(ids) == len(set(ids)), "duplicate trial ids"
    want = {f"{tid}:{spans[0]['span']}" for tid, spans in traces.items()}
    assert set(ids) == want
    for t in trials:
        n_children = len(traces[t["trace_id"]]) - 1
        assert t["status"] == "complete"
        assert t["span_count"] == n_children + 1
        assert t["model_calls"] == (n_children + 1) // 2
        assert t["tool_calls"] == n_children // 2
        assert t["input_tokens"] == 10 * ((n_children + 1) // 2)
    groups = [g for g in sc.report()["groups"] if g["agent"] == "dur-agent"]
    assert sum(g["trials"] for g in groups) == len(want)
    return trials


def _close(sc: SidecarProc) -> None:
    for f in (sc.proc.stdout, sc.proc.stderr):
        if f:
            f.close()


@pytest.fixture
def sidecars():
    """Sidecars started by a test; any still running at the end is SIGKILLed (data is tmp)."""
    started: list[SidecarProc] = []
    yield started
    for sc in started:
        if sc.proc.poll() is None:
            sc.kill(signal.SIGKILL)
        _close(sc)


def _start(sidecars: list, data_dir: Path, **env) -> SidecarProc:
    sc = start_sidecar(data_dir, extra_env={k: str(v) for k, v in env.items()})
    sidecars.append(sc)
    return sc


def _stop_term(sc: SidecarProc) -> int | None:
    """SIGTERM; the sidecar must drain and exit 0 (conftest escalates to SIGKILL after 20 s)."""
    return sc.kill(signal.SIGTERM)


# ---- 1. store outage mid-stream -----------------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 2])  # 2: records decoded ahead are taken again after the rewind
def test_store_outage_mid_stream_keeps_acknowledging_and_drains_after(tmp_path, sidecars, workers):
    down = tmp_path / "down"
    # a long grace period: trials are finalized only by the flushes below, so the flush during
    # the outage finds every span stored and only the trials left to write
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down, RELYSCOPE_GRACE_PERIOD_S=120,
                RELYSCOPE_DECODE_WORKERS=workers)
    traces: dict[str, list[dict]] = {}
    before = [trace_id_of(1, i) for i in range(4)]
    for tid in before:
        traces[tid] = make_trace(tid, task=f"t{len(traces) % 3}")
        assert post_json(sc, traces[tid]).status_code == 200
    sent = set().union(*(keys_of(s) for s in traces.values()))
    wait_until(lambda: stored_keys(sc) == sent, what="spans stored before the outage")

    down.touch()
    # an operator flush during the outage cannot store the trials: it times out (504) ...
    r = httpx.post(sc.api + "/api/v1/flush", params={"timeout_s": 1}, timeout=15)
    assert r.status_code == 504, r.text
    # ... and ingestion must not stall behind it: every request is still acknowledged
    for i in range(8):
        tid = trace_id_of(1, 100 + i)
        traces[tid] = make_trace(tid, task=f"t{len(traces) % 3}")
        r = post_json(sc, traces[tid], timeout=15)
        assert r.status_code == 200, r.text
    wait_until(lambda: metric(sc, "relyscope_store_write_errors_total") > 0, what="store write errors")
    assert metric(sc, "relyscope_spool_pending_records") > 0
    assert metric(sc, "relyscope_spool_bytes") > 0
    sent = set().union(*(keys_of(s) for s in traces.values()))
    assert stored_keys(sc) < sent  # the outage is real: the later spans are not in the store

    down.unlink()
    flush(sc)
    assert stored_keys(sc) == sent
    check_trials(sc, traces)
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="spool committed")
    assert _stop_term(sc) == 0


# ---- 2. SIGKILL under load ------------------------------------------------------------------------
class Sender:
    """Posts requests (each: 2 whole agent runs of 5 spans) from two threads — one over OTLP/HTTP
    (JSON), one over OTLP/gRPC (protobuf) — until told to stop or the sidecar goes away; records
    which requests were acknowledged (HTTP 200 / gRPC OK)."""

    def __init__(self, sc: SidecarProc, requests: list[list[dict]]):
        self.sc, self.requests = sc, requests
        self.acked: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._http, daemon=True),
                        threading.Thread(target=self._grpc, daemon=True)]

    def _ack(self, i: int) -> None:
        with self.lock:
            self.acked.add(i)

    def _http(self) -> None:
        with httpx.Client() as client:
            for i in range(0, len(self.requests), 2):
                if self.stop.is_set():
                    return
                try:
                    r = post_json(self.sc, self.requests[i], client=client, timeout=10)
                except httpx.HTTPError:
                    return  # the sidecar was killed
                if r.status_code == 200:
                    self._ack(i)

    def _grpc(self) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.sc.grpc_port}") as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for i in range(1, len(self.requests), 2):
                if self.stop.is_set():
                    return
                try:
                    export(otlp_proto(self.requests[i]), timeout=10)
                except grpc.RpcError:
                    return  # the sidecar was killed
                self._ack(i)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def _decode_children(sc: SidecarProc) -> list[int]:
    """Pids of the sidecar's child processes (its decode workers and multiprocessing's resource
    tracker), whichever of its threads started them."""
    out: list[int] = []
    for task in Path(f"/proc/{sc.proc.pid}/task").iterdir():
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _gone(pid: int) -> bool:
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


# 2 decode processes: records are decoded ahead out of the worker thread and taken back in
# spool order; a kill -9 at any moment must still lose no acknowledged span and duplicate none
@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_under_load_loses_no_acknowledged_span_and_duplicates_no_trial(tmp_path, sidecars, workers):
    rng = random.Random(20240607 + workers)
    env = {"RELYSCOPE_DECODE_WORKERS": workers}
    sc = _start(sidecars, tmp_path, **env)
    sent_traces: dict[str, list[dict]] = {}
    acked_keys: set[tuple[str, str]] = set()
    for rnd in range(3):
        requests = []
        for i in range(200):  # more than the sender can post before the kill (it must die mid-stream)
            spans = []
            for j in range(2):
                tid = trace_id_of(2, rnd, i, j)
                sent_traces[tid] = make_trace(tid, task=f"t{(i + j) % 5}")
                spans += sent_traces[tid]
            requests.append(spans)
        kill_after = rng.randint(8, 40)  # acknowledged requests before the SIGKILL
        with Sender(sc, requests) as sender:
            deadline = time.monotonic() + 30  # poll finely: the kill must come soon after kill_after acks
            while len(sender.acked) < kill_after and any(t.is_alive() for t in sender.threads):
                assert time.monotonic() < deadline, "requests acknowledged"
                time.sleep(0.005)
            children = _decode_children(sc)
            sc.kill(signal.SIGKILL)
        assert sc.proc.returncode == -signal.SIGKILL
        if workers > 1:  # the decode processes (and multiprocessing's resource tracker) die with it
            assert len(children) >= 2, children  # the tracker and at least one decode process
            wait_until(lambda: all(_gone(p) for p in children), 15, "decode workers exited")
        assert kill_after <= len(sender.acked) < len(requests)  # killed mid-stream
        for i in sender.acked:
            acked_keys |= keys_of(requests[i])
        sc = _start(sidecars, tmp_path, **env)  # same data dir and spool dir
        flush(sc)
        stored = stored_keys(sc)
        missing = acked_keys - stored
        assert not missing, f"round {rnd}: {len(missing)} acknowledged spans lost"
        sent_keys = set().union(*(keys_of(s) for s in sent_traces.values()))
        assert stored <= sent_keys
        counts = sc.get("/api/v1/spans").json()
        assert counts["spans"] == len(stored)
        # a request is spooled as a whole: every stored trace is stored with all its spans
        stored_traces = {t for t, _ in stored}
        assert stored == set().union(*(keys_of(sent_traces[t]) for t in stored_traces))
        check_trials(sc, {t: sent_traces[t] for t in stored_traces})
    assert _stop_term(sc) == 0


# ---- 3. spool full --------------------------------------------------------------------------------
def test_full_spool_answers_503_retry_after_and_resource_exhausted_then_recovers(tmp_path, sidecars):
    down = tmp_path / "down"
    down.touch()  # nothing drains: every accepted request stays in the spool
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down,
                RELYSCOPE_SPOOL_MAX_BYTES=1 << 16)  # the smallest spool the settings allow
    traces: dict[str, list[dict]] = {}
    full = None
    for i in range(200):  # 64 KiB / ~2.3 KB per request: full well before 200
        tid = trace_id_of(3, i)
        spans = make_trace(tid, task=f"t{i % 3}")
        r = post_json(sc, spans)
        if r.status_code != 200:
            full = r
            break
        traces[tid] = spans
    assert full is not None, "the spool never filled"
    assert full.status_code == 503
    assert int(full.headers["retry-after"]) > 0
    st = full.json()  # google.rpc.Status in the request's encoding (JSON here)
    assert st["code"] == 14 and st["message"]  # UNAVAILABLE: retryable
    assert len(traces) >= 5
    # the same answer for an OTLP/protobuf request, with a protobuf google.rpc.Status body
    extra = make_trace(trace_id_of(3, 999), task="t0")
    r = httpx.post(sc.otlp_http + "/v1/traces", content=otlp_proto(extra),
                   headers={"content-type": "application/x-protobuf"}, timeout=20)
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
    pst = status_pb2.Status.FromString(r.content)
    assert pst.code == 14 and pst.message
    # gRPC: RESOURCE_EXHAUSTED with a RetryInfo detail
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as ei:
            export(otlp_proto(extra), timeout=20)
    assert ei.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(ei.value.trailing_metadata() or ())["grpc-status-details-bin"]
    gst = status_pb2.Status.FromString(details)
    ri = error_details_pb2.RetryInfo()
    assert gst.details[0].Unpack(ri) and ri.retry_delay.seconds > 0
    # each refusal counted under its reason: the spool was full, not the budget or a backlog bound
    assert metric(sc, "relyscope_backpressure_total", 'reason="spool_full"') >= 3
    assert metric(sc, "relyscope_backpressure_total", 'reason="inflight_budget"') == 0
    assert metric(sc, "relyscope_backpressure_total", 'reason="backlog"') == 0

    down.unlink()  # the store is back: the spool drains, space is freed, requests are accepted again
    late = trace_id_of(3, 1000)
    late_spans = make_trace(late, task="t1")

    def accepted() -> bool:
        return post_json(sc, late_spans).status_code == 200

    wait_until(accepted, what="spool space freed")
    traces[late] = late_spans
    flush(sc)
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in traces.values()))
    check_trials(sc, traces)
    assert _stop_term(sc) == 0


# ---- 4. restart replay ----------------------------------------------------------------------------
def test_sigterm_during_outage_then_restart_replays_spans_and_trials(tmp_path, sidecars):
    down = tmp_path / "down"
    env = {"RELYSCOPE_FAULT_STORE_DOWN_FILE": down, "RELYSCOPE_GRACE_PERIOD_S": 120}
    sc = _start(sidecars, tmp_path, **env)
    t1 = trace_id_of(4, 1)
    traces = {t1: make_trace(t1, task="t0")}
    assert post_json(sc, traces[t1]).status_code == 200
    wait_until(lambda: stored_keys(sc) == keys_of(traces[t1]), what="first trace's spans stored")
    down.touch()
    # the flush finalizes the first trace, but its trial cannot be written (504): at the SIGTERM
    # below its spool record is committed (its spans are stored: an unstored trial must not pin
    # the spool, issue 10) and its trace id is in the spool's open-trace state instead, so the
    # restarted sidecar reloads it from the store and writes the trial
    r = httpx.post(sc.api + "/api/v1/flush", params={"timeout_s": 1}, timeout=15)
    assert r.status_code == 504, r.text
    wait_until(lambda: metric(sc, "relyscope_store_write_errors_total") > 0, what="failed trial write")
    for i in range(2, 5):  # acknowledged while the store is down
        tid = trace_id_of(4, i)
        traces[tid] = make_trace(tid, task=f"t{i % 2}", n_children=2 * i)
        assert post_json(sc, traces[tid]).status_code == 200
    assert metric(sc, "relyscope_spool_pending_records") >= 3
    assert _stop_term(sc) == 0  # a clean stop with the store still down
    down.unlink()
    sc = _start(sidecars, tmp_path, **env)
    flush(sc)
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in traces.values()))
    check_trials(sc, traces)
    assert _stop_term(sc) == 0


# ---- 5. a trace partly replayed after a crash -----------------------------------------------------
def test_late_span_then_sigkill_replays_whole_trace_without_duplicate_trial(tmp_path, sidecars):
    env = {"RELYSCOPE_GRACE_PERIOD_S": 120}  # trials finalize only on the flushes below
    sc = _start(sidecars, tmp_path, **env)
    tid = trace_id_of(5, 1)
    spans = make_trace(tid, task="t0", n_children=4)
    first, late = spans[:4], spans[4:]  # root, chat, tool, chat ... then a late tool span
    assert post_json(sc, first).status_code == 200
    flush(sc)
    check_trials(sc, {tid: first})
    # the trace's first record is committed (its trial is stored): the spool no longer holds it
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="first record committed")
    assert post_json(sc, late).status_code == 200
    wait_until(lambda: stored_keys(sc) == keys_of(spans), what="late span stored")
    sc.kill(signal.SIGKILL)
    sc = _start(sidecars, tmp_path, **env)
    flush(sc)
    # only the late span is replayed; the trial must still be the whole run, once
    check_trials(sc, {tid: spans})
    assert _stop_term(sc) == 0


def test_scores_are_back_after_a_restart_without_new_spans(sidecar_factory):
    """A restarted sidecar scores what its store holds: the report and /metrics are not blank
    until new spans arrive (found by a fresh-user trial: dashboards went empty on every restart)."""
    import httpx as _httpx

    sc = sidecar_factory()
    spans = []
    for i, ok in enumerate([True, False, True, True]):
        t0 = 1_760_000_000_000_000_000 + i * 10**10
        spans.append({"traceId": f"{i + 77:032x}", "spanId": f"{i + 77:016x}", "name": "invoke_agent r",
                      "kind": 1, "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 10**9),
                      "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                                     {"key": "gen_ai.agent.name", "value": {"stringValue": "restarted"}},
                                     {"key": "relyscope.task.id", "value": {"stringValue": f"t{i % 2}"}},
                                     {"key": "relyscope.outcome", "value": {"stringValue": "success" if ok else "failure"}}]})
    body = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    assert _httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sc.flush()
    assert sc.kill() == 0
    sc2 = sidecar_factory()
    deadline = time.monotonic() + 30
    groups = []
    while time.monotonic() < deadline:
        groups = [g for g in sc2.report()["groups"] if g["agent"] == "restarted"]
        if groups:
            break
        time.sleep(0.3)
    # t0: success, success → 1; t1: failure, success → 0.5; pass^1 = 0.75 — without any flush
    assert groups and groups[0]["metrics"]["pass^1"]["value"] == 0.75
    assert 'relyscope_score{agent="restarted"' in sc2.get("/metrics").text


def test_time_beyond_datetime64_does_not_block_ingestion(sidecar_factory):
    """A reviewer's repro: one span with a timestamp ≥ 2^63 (valid fixed64, but beyond ClickHouse
    DateTime64) made every insert fail, the worker retry forever and the spool fill. The decoder
    now flags such times (``invalid_time``) and treats them as missing; the span and the ones
    after it are stored."""
    import httpx as _httpx

    sc = sidecar_factory()
    bad = {"traceId": "ee" * 16, "spanId": "01" * 8, "name": "far future", "kind": 1,
           "startTimeUnixNano": str(2**63 + 5), "endTimeUnixNano": str(2**64 - 1),
           "events": [{"name": "e", "timeUnixNano": str(2**63)}]}
    good = {"traceId": "ef" * 16, "spanId": "02" * 8, "name": "ok", "kind": 1,
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000"}
    for span in (bad, good):
        body = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
        assert _httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sc.flush()
    keys = {tuple(k) for k in sc.get("/api/v1/spans", params={"keys": "true"}).json()["keys"]}
    assert {("ee" * 16, "01" * 8), ("ef" * 16, "02" * 8)} <= keys


def test_late_root_after_restart_assembles_whole_trace_and_supersedes_the_virtual_trial(sidecar_factory):
    """A reviewer's repro: a trace finalized before a restart (here by flush: children, no root)
    whose root arrives after the restart became a step-less 'complete' trial beside the stale
    virtual one. The restarted sidecar now loads the trace's stored spans and trials first."""
    import httpx as _httpx

    tid, root = "ab" * 16, "a1" * 8

    def span(sid, name, parent, attrs):
        return {"traceId": tid, "spanId": sid, "parentSpanId": parent, "name": name, "kind": 1,
                "startTimeUnixNano": "1760000001000000000", "endTimeUnixNano": "1760000002000000000",
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]}

    children = [span("b2" * 8, "chat m", root, {"gen_ai.operation.name": "chat"}),
                span("c3" * 8, "execute_tool lookup", root,
                     {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"})]
    sc = sidecar_factory()
    body = {"resourceSpans": [{"scopeSpans": [{"spans": children}]}]}
    assert _httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sc.flush()
    assert [t["status"] for t in sc.trials()] == ["incomplete"]
    assert sc.kill() == 0

    sc2 = sidecar_factory()
    rootspan = span(root, "invoke_agent late", "", {"gen_ai.operation.name": "invoke_agent",
                                                     "gen_ai.agent.name": "late-root"})
    rootspan["startTimeUnixNano"], rootspan["endTimeUnixNano"] = "1760000000000000000", "1760000003000000000"
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [rootspan]}]}]}
    assert _httpx.post(sc2.otlp_http + "/v1/traces", json=body, timeout=30).status_code == 200
    sc2.flush()
    trials = sc2.trials()
    assert len(trials) == 1, trials
    t = trials[0]
    assert t["status"] == "complete" and t["agent_name"] == "late-root"
    assert t["actions"] == ["llm", "lookup"] and t["tool_calls"] == 1


def test_request_larger_than_the_whole_spool_is_a_permanent_counted_error(sidecar_factory):
    """A fresh user's find: with a small spool, every normal-sized batch got gRPC
    RESOURCE_EXHAUSTED (which OTLP exporters retry, then drop) and no counter moved."""
    import grpc as _grpc
    import httpx as _httpx
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sc = sidecar_factory(extra_env={"RELYSCOPE_SPOOL_MAX_BYTES": "65536"})
    spans = [{"traceId": f"{i + 900:032x}", "spanId": f"{i + 900:016x}", "name": "x" * 400, "kind": 1,
              "startTimeUnixNano": "1", "endTimeUnixNano": "2"} for i in range(200)]
    body = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    r = _httpx.post(sc.otlp_http + "/v1/traces", json=body, timeout=30)
    assert r.status_code == 413 and "can never fit in the spool" in r.json()["message"]
    req = ExportTraceServiceRequest()
    for i in range(200):
        sp = req.resource_spans.add().scope_spans.add().spans.add()
        sp.trace_id, sp.span_id, sp.name = bytes([1]) * 15 + bytes([i]), bytes([2]) * 7 + bytes([i]), "y" * 400
    with _grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        try:
            trace_service_pb2_grpc.TraceServiceStub(ch).Export(req, timeout=30)
            raise AssertionError("expected an error")
        except _grpc.RpcError as e:
            assert e.code() == _grpc.StatusCode.FAILED_PRECONDITION  # not retryable in OTLP
    text = sc.get("/metrics").text
    assert 'relyscope_spans_rejected_total{reason="too_large_for_spool"} 400.0' in text


def test_sidecar_starts_and_spools_while_the_clickhouse_server_is_down(tmp_path):
    """A fresh user's find: with a ClickHouse server unreachable at start, the sidecar refused to
    start (a pod restarting during an outage would crash-loop). It now starts, acknowledges into
    the spool, and the spool drains into a working store after a restart (here: embedded)."""
    import httpx as _httpx

    spool = str(tmp_path / "spool")
    down = start_sidecar(tmp_path / "a", extra_env={"RELYSCOPE_STORE": "http://127.0.0.1:1/relyscope",
                                                    "RELYSCOPE_SPOOL_DIR": spool})
    try:
        body = {"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "cd" * 16, "spanId": "ef" * 8, "name": "invoke_agent x", "kind": 1,
             "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000",
             "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}}]}]}]}]}
        r = _httpx.post(down.otlp_http + "/v1/traces", json=body, timeout=30)
        assert r.status_code == 200, r.text
        h = down.get("/healthz")
        assert h.status_code == 200 and h.json()["status"] == "degraded"  # spooling, store down
        assert h.json()["spool_pending_records"] == 1
    finally:
        assert down.kill() == 0
    up = start_sidecar(tmp_path / "b", extra_env={"RELYSCOPE_SPOOL_DIR": spool})
    try:
        up.flush()
        keys = {tuple(k) for k in up.get("/api/v1/spans", params={"keys": "true"}).json()["keys"]}
        assert keys == {("cd" * 16, "ef" * 8)}
    finally:
        up.kill()


def _decode_workers(sc: SidecarProc) -> list[int]:
    """The sidecar's decode processes (its spawned children, not multiprocessing's resource tracker)."""
    out = []
    for pid in _decode_children(sc):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(pid)
    return out


def _post_proto(sc: SidecarProc, spans: list[dict]) -> httpx.Response:
    """OTLP/HTTP protobuf: decoded by the decode processes (JSON is decoded when received)."""
    return httpx.post(sc.otlp_http + "/v1/traces", content=otlp_proto(spans),
                      headers={"content-type": "application/x-protobuf"}, timeout=20)


def test_a_stopped_decode_worker_does_not_stop_ingest(tmp_path, sidecars):
    """With 2 decode processes, SIGSTOP them: requests are still acknowledged, and (the bug) nothing
    was stored until SIGCONT while /healthz said ok. Now the worker thread waits at most
    RELYSCOPE_DECODE_TIMEOUT_S for a result, kills the stuck processes, decodes the record itself
    and restarts the pool — counted on /metrics and shown as last_error."""
    sc = _start(sidecars, tmp_path, RELYSCOPE_DECODE_WORKERS=2, RELYSCOPE_DECODE_TIMEOUT_S=2)
    stopped: list[int] = []
    try:
        first = make_trace(trace_id_of(9, 0), task="t0")
        assert _post_proto(sc, first).status_code == 200
        wait_until(lambda: keys_of(first) <= stored_keys(sc), 30, "first trace stored")
        wait_until(lambda: len(_decode_workers(sc)) >= 1, 30, "decode workers started")
        stopped = _decode_workers(sc)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        traces = [make_trace(trace_id_of(9, i), task=f"t{i % 3}") for i in range(1, 6)]
        for spans in traces:
            assert _post_proto(sc, spans).status_code == 200
        want = set().union(*(keys_of(s) for s in traces))
        wait_until(lambda: want <= stored_keys(sc), 30, "spans stored while the decode workers are stopped")
        assert metric(sc, "relyscope_decode_worker_restarts_total") >= 1
        health = sc.get("/healthz").json()
        assert "decode worker" in (health["last_error"] or "") and health["status"] == "degraded", health
        assert all(_gone(p) for p in stopped)  # the stuck processes were killed, not left behind
        more = make_trace(trace_id_of(9, 99), task="t1")  # the restarted pool decodes again
        assert _post_proto(sc, more).status_code == 200
        wait_until(lambda: keys_of(more) <= stored_keys(sc), 30, "stored after the restart")
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        sc.kill(signal.SIGKILL)
