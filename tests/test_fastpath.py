"""The worker's hot path (relyscope.collector.fastpath: key-table normalizer, columnar Arrow insert)
against the reference path it replaced (decode_http → Redactor → normalize → row insert), which
stays selectable (``ingest_decoder="legacy"``) and is the oracle here.

Both pipelines run on the same chDB engine (one database each), are fed the same requests through
``Pipeline.accept`` and drained by the worker's own loop; then the stored ``otel_traces`` rows
(every column but the write time ``IngestedAt``), the stored trials (every column but the write
version) and the reply / counters must be equal — on the benchmark payload (protobuf, gzip,
OTLP/JSON), every bug case in shared/data/bugcases (with the settings the case names), every
recorded emitter file in shared/data/spans (OTLP/JSON and protobuf), with redaction on, and under
tight attribute limits (truncation, count limit: the partial-success accounting).
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import pickle
import sys
import uuid
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from relyscope.collector import fastpath
from relyscope.collector.normalize import normalize
from relyscope.collector.normalize.fast import OTHER_KEYS, normalize_fast
from relyscope.collector.normalize.versions import CONVENTIONS
from relyscope.collector.otlp import Limits, OTLPRequestError, decode_http
from relyscope.collector.otlp import decompress
from relyscope.collector.redaction import Redactor
from relyscope.config import Settings
from relyscope.model import CanonicalSpan, SpanEvent
from relyscope.pipeline import Pipeline, _ahead_of
from relyscope.store import Store

from conftest import DATA

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_ingest_decode import _to_otlp_json, build_request  # noqa: E402

CASES = DATA / "bugcases"
SPANS = DATA / "spans"
PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
CLOCK = 1_000.0  # a fixed clock: finalization (grace 0) happens at the same pass on both sides


@pytest.fixture(scope="module")
def chdb_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fastpath")


AHEAD: list[int] = []  # traces assembled ahead per "ahead" run (the feature is exercised, not dead)


def _run(root: Path, decoder: str, requests: list[tuple[dict, bytes]], *, ahead: bool = False, **settings):
    db = f"fp_{decoder}_{uuid.uuid4().hex[:8]}"
    store = Store(f"chdb://{root}/data", database=db)
    st = Settings(store=store.dsn, spool_dir=str(root / f"spool-{db}"), grace_period_s=0.0,
                  ingest_decoder=decoder, **settings)
    p = Pipeline(st, store, clock=lambda: CLOCK)
    if ahead:  # what a decode process runs, its result through pickle as a process ships it
        fn = _ahead_of(p._decode_fn)
        assert fn is not p._decode_fn
        p._decode_fn = lambda payload: pickle.loads(pickle.dumps(fn(payload)))
    replies = []
    for headers, body in requests:
        try:
            v = p.accept(body, headers.get("Content-Type"), headers.get("Content-Encoding"))
            replies.append((v.accepted, v.rejected, v.errors, v.error_message()))
        except OTLPRequestError as e:
            replies.append((e.http_status, e.message))
    for _ in range(10_000):
        if p._queue_empty():
            break
        p._work_once()
    assert p._queue_empty()
    assert p._finalize_all()
    spans = store.query("SELECT * EXCEPT IngestedAt FROM {db}.otel_traces FINAL ORDER BY TraceId, SpanId")
    trials = store.query("SELECT * EXCEPT version_ns FROM {db}.trials FINAL ORDER BY trial_id")
    stats = (p.stats.accepted, dict(p.stats.rejected), dict(p.stats.warnings), p.stats.deduplicated,
             p.stats.trials_finalized)
    if ahead:
        AHEAD.append(p.builder.assembled_ahead)
    p.spool.close()
    store.close()
    return replies, spans, trials, stats


def _same_semantics(requests, **settings) -> None:
    """Per request: the hot path's semantics equal ``normalize`` of the redacted full spans (most
    SpanSemantics fields never reach a stored row, so the rows alone would not show a difference)."""
    st = Settings(**settings)
    lim = Limits(max_body_bytes=st.max_body_bytes, max_attributes=st.max_attributes,
                 max_attribute_length=st.max_attribute_length)
    red = Redactor(st.redact_deny, st.redact_patterns)
    for headers, body in requests:
        ct, enc = headers.get("Content-Type"), headers.get("Content-Encoding")
        try:
            full = decode_http(body, ct, enc, lim)
        except OTLPRequestError:
            continue
        tag = b"J" if "json" in ct else b"P"
        fast = fastpath.decode_record(tag + decompress(body, enc, lim), lim, red)
        assert fast.semantics == [normalize(red.apply(s)) for s in full.spans]


def _same(root: Path, requests, **settings) -> tuple:
    _same_semantics(requests, **settings)
    legacy = _run(root, "legacy", requests, **settings)
    fast = _run(root, "fast", requests, **settings)
    assert fast[0] == legacy[0], "replies differ"
    assert fast[1] == legacy[1], "stored spans differ"
    assert fast[2] == legacy[2], "stored trials differ"
    assert fast[3] == legacy[3], "counters differ"
    # the decode processes' path: traces whole in a record assembled there, ahead of the worker
    ahead = _run(root, "fast", requests, ahead=True, **settings)
    assert ahead == fast, "assembled ahead differs"
    # an OTLP/JSON body is decoded when accepted, never by a decode process: its protobuf twin is
    pb = [_as_protobuf(r) for r in requests]
    if pb != requests:
        assert _run(root, "fast", pb, ahead=True, **settings) == _run(root, "fast", pb, **settings), \
            "assembled ahead differs (protobuf twins)"
    return legacy


def _as_protobuf(request: tuple[dict, bytes]) -> tuple[dict, bytes]:
    """The protobuf encoding of an uncompressed OTLP/JSON request where protobuf can hold it."""
    headers, body = request
    if headers.get("Content-Type") != "application/json" or headers.get("Content-Encoding"):
        return request
    try:
        msg = json_format.ParseDict(_hex_to_b64(json.loads(body)), ExportTraceServiceRequest(),
                                    ignore_unknown_fields=True)
    except Exception:  # noqa: BLE001 - not valid OTLP for protobuf (the case is about that): as is
        return request
    return {**headers, "Content-Type": "application/x-protobuf"}, msg.SerializeToString()


# ---- payloads ----------------------------------------------------------------------------------

def _bench_requests() -> list[tuple[dict, bytes]]:
    req = build_request(64)
    body = req.SerializeToString()
    return [(PB, body), ({**PB, "Content-Encoding": "gzip"}, gzip.compress(body, mtime=0)),
            (JS, _to_otlp_json(req).replace(b"sess-", b"json-"))]


def _case_requests(path: Path) -> list[tuple[dict, bytes]]:
    out = []
    for r in json.loads(path.read_text())["requests"]:
        if "body_file" in r:
            body = (CASES / r["body_file"]).read_bytes()
        elif "body" in r:
            body = json.dumps(r["body"]).encode()
        else:
            continue
        out.append((dict(r["headers"]), body))
    return out


def _case_settings(path: Path) -> dict:
    env = (json.loads(path.read_text()).get("sidecar") or {}).get("env") or {}
    out = {}
    for k, v in env.items():
        name = k.removeprefix("RELYSCOPE_").lower()
        if name in Settings.model_fields:
            out[name] = v
    return out


def _hex_to_b64(doc):
    """OTLP/JSON (hex ids) → the protobuf JSON mapping (base64 bytes), for json_format.Parse."""
    doc = copy.deepcopy(doc)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(k):
                        sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
                for ln in sp.get("links", []):
                    for k in ("traceId", "spanId"):
                        if ln.get(k):
                            ln[k] = base64.b64encode(bytes.fromhex(ln[k])).decode()
    return doc


def _spans_file_requests() -> list[tuple[dict, bytes]]:
    out = []
    for f in sorted(SPANS.glob("*.json")):
        raw = f.read_bytes()
        out.append((JS, raw))
        try:
            msg = json_format.ParseDict(_hex_to_b64(json.loads(raw)), ExportTraceServiceRequest(),
                                        ignore_unknown_fields=True)
        except json_format.ParseError:  # a value protobuf cannot hold (an int64 over 2^63): JSON only
            continue
        out.append((PB, msg.SerializeToString()))
    return out


CASE_FILES = sorted(p for p in CASES.glob("*.json") if not p.name.startswith("C11"))


# ---- both paths, same stored rows ---------------------------------------------------------------

def test_bench_payload_same_rows_and_trials(chdb_dir):
    replies, spans, trials, _ = _same(chdb_dir, _bench_requests())
    assert len(spans) == 64  # the gzip and JSON requests re-send the same ids (the last one wins)
    assert len(trials) == 4 and all(r[0] == 64 for r in replies)  # 16 spans per trace


def test_assembled_ahead_is_used_and_equal(chdb_dir):
    """One protobuf request of whole traces: each of its 4 traces is assembled in the decode
    process's function and taken by the builder (counted), the stored trials equal the oracle's."""
    AHEAD.clear()
    _, spans, trials, _ = _same(chdb_dir, [(PB, build_request(64).SerializeToString())])
    assert len(spans) == 64 and len(trials) == 4
    assert AHEAD == [4]


def test_a_trace_split_over_two_requests_is_assembled_by_the_worker(chdb_dir):
    """The root in one request, the rest in the next (as a BatchSpanProcessor sends a run longer
    than its export delay): the first request's assembly ahead holds only the root, so the
    builder assembles the trace itself — same trials as the oracle, nothing taken ahead."""
    req = build_request(64)
    first, second = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    first.CopyFrom(req)
    second.CopyFrom(req)
    roots = [sp for sp in req.resource_spans[0].scope_spans[0].spans if not sp.parent_span_id]
    assert len(roots) == 4
    del first.resource_spans[0].scope_spans[0].spans[:]
    first.resource_spans[0].scope_spans[0].spans.extend(roots)
    keep = [sp for sp in req.resource_spans[0].scope_spans[0].spans if sp.parent_span_id]
    del second.resource_spans[0].scope_spans[0].spans[:]
    second.resource_spans[0].scope_spans[0].spans.extend(keep)
    AHEAD.clear()
    _, spans, trials, _ = _same(chdb_dir, [(PB, first.SerializeToString()), (PB, second.SerializeToString())])
    assert len(spans) == 64 and len(trials) == 4
    assert AHEAD == [0]


def _demo_requests(per_request: int) -> list[tuple[dict, bytes]]:
    """The demo agent's runs (tool faults, refusals, retries, confirmations, outcomes) recorded by
    the real OTel SDK and encoded by its OTLP exporter's encoder, ``per_request`` spans a request
    in the order they ended, as a BatchSpanProcessor sends them (not sorted by end time: the
    demo's simulated clock lets runs overlap in span time while they end one after another)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from relyscope.demo.agent import run_demo

    mem = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(mem))
    run_demo(tp, tasks=8, trials=3, seed=11)
    spans = mem.get_finished_spans()
    return [(PB, encode_spans(spans[i:i + per_request]).SerializeToString())
            for i in range(0, len(spans), per_request)]


@pytest.mark.parametrize("per_request", [10_000, 7])
def test_demo_agent_runs_assembled_ahead_equal(chdb_dir, per_request):
    """Realistic runs: all in one request (every trace whole: all taken ahead), or 7 spans a
    request (traces cut across requests: only those whole in one are taken ahead)."""
    requests = _demo_requests(per_request)
    where: dict[bytes, set[int]] = {}  # trace id → the requests holding its spans
    for i, (_, body) in enumerate(requests):
        for sp in ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans:
            where.setdefault(sp.trace_id, set()).add(i)
    whole = sum(len(r) == 1 for r in where.values())  # every demo run has its agent root
    AHEAD.clear()
    _, _, trials, _ = _same(chdb_dir, requests)
    assert len(trials) == len(where) == 24
    assert AHEAD == [whole]
    assert (whole == 24) if per_request > 1000 else (0 < whole < 24)


@pytest.mark.parametrize("case", CASE_FILES, ids=lambda p: p.stem)
def test_bug_cases_same_rows_and_trials(chdb_dir, case):
    _same(chdb_dir, _case_requests(case), **_case_settings(case))


def test_c11_large_attribute_same_rows(chdb_dir):
    # C11 names a ~6 MiB body that is not shipped: one span whose gen_ai.input.messages holds it
    text = "x" * (6 << 20)
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "c1" * 16, "spanId": "c2" * 8, "name": "chat", "startTimeUnixNano": "1",
        "endTimeUnixNano": "2", "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.input.messages", "value": {"stringValue": text}}]}]}]}]}
    _same(chdb_dir, [(JS, json.dumps(doc).encode())], max_body_bytes=16 << 20)


def test_recorded_emitter_spans_same_rows_and_trials(chdb_dir):
    _, spans, _, _ = _same(chdb_dir, _spans_file_requests())
    assert len(spans) >= 9


def test_redaction_same_rows_and_trials(chdb_dir):
    reqs = _bench_requests() + _spans_file_requests()
    # one identity-token key for both runs (each pipeline would otherwise keep its own beside its spool)
    _, spans, _, _ = _same(chdb_dir, reqs, redact_deny=["gen_ai.tool.call.arguments", "llm.*"],
                           redact_patterns=[r"\d{3}", "delivered"], redact_key="fastpath-same-key-0123")
    stored = json.dumps([list(map(str, r)) for r in spans])
    assert "delivered" not in stored and "[REDACTED]" in stored


def test_attribute_limits_same_rows_and_partial_success(chdb_dir):
    reqs = _bench_requests() + _spans_file_requests()
    replies, _, _, stats = _same(chdb_dir, reqs, max_attributes=3, max_attribute_length=5)
    assert any("dropped_attributes" in r[3] for r in replies if len(r) == 4)
    assert stats[2].get("attributes_dropped", 0) > 0


# ---- the normalizer alone, on every attribute name the conventions read --------------------------

def _all_keys() -> list[str]:
    keys = {k for spec in CONVENTIONS.values() for names in spec.attrs.values() for k in names}
    return sorted(keys | set(OTHER_KEYS) | {"session.id", "operation.cost", "error.type"})


_VALUES = ("x", "", "  Success ", '{"a": 1, "isError": true}', '[{"role": "user", "content": "hi"}]',
           "12", 7, 0, -3, 0.5, 2.0, True, False, ["tool_calls"], {"isError": True}, None, b"\x01")


@pytest.mark.parametrize("key", _all_keys())
def test_normalize_fast_equals_normalize_for_every_known_key(key):
    base = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
    ev = (SpanEvent("gen_ai.evaluation.result", 5, {"gen_ai.evaluation.name": "r",
                                                    "gen_ai.evaluation.score.value": 0.5}),)
    for scope in ("", "openinference.instrumentation.openai_agents", "pydantic-ai", "openlit",
                  "Microsoft.SemanticKernel.x"):
        for v in _VALUES:
            for attrs in ({key: v}, {**base, key: v}, {key: v, "relyscope.task.id": "t1"}):
                for status in (0, 2):
                    s = CanonicalSpan("a" * 32, "b" * 16, "", "n", 1, 1, 2, status, "boom", attrs, {},
                                      scope, "", ev if status else ())
                    assert normalize_fast(s) == normalize(s), (key, v, scope, attrs)


# ---- the interface a decode worker process uses -------------------------------------------------

def test_decode_record_is_pure_and_pickles():
    body = build_request(32).SerializeToString()
    lim = Limits()
    a = fastpath.decode_record(b"P" + body, lim)
    b = pickle.loads(pickle.dumps(a))
    assert b.spans == a.spans and b.semantics == a.semantics and b.columns.rows() == a.columns.rows()
    full = decode_http(body, "application/x-protobuf", None, lim)
    assert [s.key for s in a.spans] == [s.key for s in full.spans]
    assert a.semantics == [normalize(s) for s in full.spans]
    assert (a.rejected, a.errors, a.warnings, a.repaired) == (full.rejected, full.errors, full.warnings,
                                                              full.repaired)
    assert all(not s.attributes and not s.events for s in a.spans)


def test_decode_pool_runs_the_hot_path_and_returns_the_same_batches():
    """decode_workers > 1 runs fastpath.decode_record (with the redactor) in processes: each batch
    comes back equal to the in-thread call (spans, semantics, columns, counts)."""
    import functools

    from relyscope.decode_pool import DecodePool
    from test_decode_pool import LIMITS, RECORDS

    red = Redactor(["gen_ai.tool.call.*"], [r"\d{3}"])
    pool = DecodePool(functools.partial(fastpath.decode_record, limits=LIMITS, redactor=red), 2)
    try:
        futs = [pool.submit(r) for r in RECORDS]
        for rec, fut in zip(RECORDS, futs):
            got, want = pool.unpack(fut.result(timeout=120)), fastpath.decode_record(rec, LIMITS, red)
            assert got == want and fastpath.is_prepared(got)
        assert any(len(fastpath.decode_record(r, LIMITS, red).spans) for r in RECORDS)
    finally:
        pool.close()


# ---- the builder with assembly made ahead ---------------------------------------------------------

def _demo_items():
    from relyscope.collector.otlp import Limits

    spans, sems = [], []
    for _, body in _demo_requests(10_000):
        r = fastpath.decode_record(b"P" + body, Limits(), None)
        spans += r.spans
        sems += r.semantics
    return spans, sems


def test_builder_takes_ahead_only_what_it_would_assemble_itself():
    from relyscope.trajectory.builder import TrajectoryBuilder, assemble_ahead

    spans, sems = _demo_items()
    plain = TrajectoryBuilder(grace_s=0.0)
    plain.add(zip(spans, sems), 0.0)
    want = plain.poll(1.0)
    assert len(want) == 24

    whole = TrajectoryBuilder(grace_s=0.0)
    whole.add(zip(spans, sems), 0.0, pickle.loads(pickle.dumps(assemble_ahead(spans, sems))))
    # the trials made ahead are held with the open trace and counted in its memory (as much again)
    assert whole.open_bytes == 2 * plain_open_bytes(spans, sems)
    assert whole.poll(1.0) == want and whole.assembled_ahead == 24
    assert whole.open_bytes == 0

    # cut in two adds (two requests): a trace in both is assembled by the builder, from all its spans
    k = len(spans) // 2
    cut = TrajectoryBuilder(grace_s=0.0)
    cut.add(zip(spans[:k], sems[:k]), 0.0, assemble_ahead(spans[:k], sems[:k]))
    cut.add(zip(spans[k:], sems[k:]), 0.0, assemble_ahead(spans[k:], sems[k:]))
    both = {s.trace_id for s in spans[:k]} & {s.trace_id for s in spans[k:]}
    assert len(both) == 1
    assert sorted(cut.poll(1.0), key=lambda t: t.trial_id) == sorted(want, key=lambda t: t.trial_id)
    assert cut.assembled_ahead == 23 and cut.open_bytes == 0

    # an exact re-send of one trace's span in a later add: assembled by the builder
    again = TrajectoryBuilder(grace_s=0.0)
    again.add(zip(spans, sems), 0.0, assemble_ahead(spans, sems))
    again.add([(spans[0], sems[0])], 0.0)
    assert again.poll(1.0) == want and again.assembled_ahead == 23


def plain_open_bytes(spans, sems) -> int:
    from relyscope.trajectory.builder import TrajectoryBuilder

    b = TrajectoryBuilder(grace_s=0.0)
    b.add(zip(spans, sems), 0.0)
    return b.open_bytes
