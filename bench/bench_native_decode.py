"""ClickHouse's own Protobuf reader as the span decoder: its rate beside upb and our hot path (issue 13).

Question: is ≥ 35 000 stored spans/s on one core reachable without writing native code of our own?
Our hot path (:func:`relyscope.collector.fastpath.decode_record`) walks every span and attribute of
the upb message in Python; ~0.8 µs per attribute is the floor of such a walk, ~10 µs for a GenAI
span, before any normalizing. ClickHouse (here chDB, the embedded store) parses Protocol Buffers
natively (``Protobuf`` input format; ``format_schema_source='string'`` carries the schema in the
query, so a server needs no schema file; ``input_format_protobuf_oneof_presence`` says which
``AnyValue`` field was set, so an int 0 is not an unset value). This script measures, in one run,
on core 0, on ``bench_ingest.py``'s payload (requests of 512 GenAI-like spans):

1. raw upb parse (``ExportTraceServiceRequest.FromString``): the baseline of every ratio;
2. our hot path, ``decode_record`` (decode, redact, normalize, columns) in this thread;
3. chDB: parse only (``count()`` of the flattened spans), ``--batch`` requests per query;
4. chDB: parse and pick the columns assembly and scoring read (ids, times, status, the GenAI
   operation, model, token counts with their presence, tool name, service) as an Arrow table, and
   those columns turned into Python lists (what a builder fed from columns would pay);
5. chDB: parse and ``INSERT INTO otel_traces SELECT`` the stored row (the product's DDL), the
   attribute values stringified in SQL as ``SpanColumns`` does in Python — stored natively, no
   Python object per span;
6. **oracle check**: the rows of 5 against ``decode_record``'s ``SpanColumns.rows()`` of the same
   requests, column by column (how many spans differ in each column).

A request's bytes reach chDB as a length-delimited file on ``/dev/shm`` (written inside the timing;
the spool could hand over its record bytes the same way). Not a product path: no redaction, no
attribute limits, no repairs, no partial success — what the Python path does to a span before it
stores it would move into the SQL, or a request needing it would fall back to the Python path.

Run: ``.venv/bin/python bench/bench_native_decode.py [--requests 40] [--batch 1,8,40] [--reps 3]``
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import SPANS, template, variant  # noqa: E402

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from relyscope.collector.fastpath import TAG_PROTO, decode_record  # noqa: E402
from relyscope.collector.otlp import Limits, decode_http  # noqa: E402
from relyscope.store.clickhouse import SCHEMA  # noqa: E402

# The OTLP trace messages of opentelemetry-proto v1 (field numbers as there), trimmed to what is
# read; unknown fields are skipped by the reader. AnyValue's nested arrays and kvlists are one
# level deep (a schema the reader maps onto columns cannot recurse): deeper values show as
# presence 5/6 with no content, which a product path would send to the Python decoder.
PROTO = """
syntax = "proto3";
message AnyValue0 { oneof value { string string_value = 1; bool bool_value = 2; int64 int_value = 3;
  double double_value = 4; bytes array_value = 5; bytes kvlist_value = 6; bytes bytes_value = 7; } }
message ArrayValue { repeated AnyValue0 values = 1; }
message KeyValueList { repeated bytes values = 1; }
message AnyValue { oneof value { string string_value = 1; bool bool_value = 2; int64 int_value = 3;
  double double_value = 4; ArrayValue array_value = 5; KeyValueList kvlist_value = 6; bytes bytes_value = 7; } }
message KeyValue { string key = 1; AnyValue value = 2; }
message Resource { repeated KeyValue attributes = 1; }
message InstrumentationScope { string name = 1; string version = 2; }
message Status { string message = 2; int32 code = 3; }
message Span { bytes trace_id = 1; bytes span_id = 2; string trace_state = 3; bytes parent_span_id = 4;
  string name = 5; int32 kind = 6; fixed64 start_time_unix_nano = 7; fixed64 end_time_unix_nano = 8;
  repeated KeyValue attributes = 9; Status status = 15; }
message ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2; }
message ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
message ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
"""
_SCALAR = "string_value String, bool_value Bool, int_value Int64, double_value Float64, bytes_value String"
_KV = (f"Array(Tuple(key String, value Tuple({_SCALAR}, array_value Tuple(values Array(Tuple({_SCALAR}, "
       f"value UInt8))), value UInt8)))")
_SPAN = (f"Tuple(trace_id String, span_id String, trace_state String, parent_span_id String, name String, "
         f"kind Int32, start_time_unix_nano UInt64, end_time_unix_nano UInt64, attributes {_KV}, "
         f"status Tuple(message String, code Int32))")
STRUCTURE = (f"resource_spans Array(Tuple(resource Tuple(attributes {_KV}), scope_spans Array(Tuple("
             f"scope Tuple(name String, version String), spans Array({_SPAN})))))")
SETTINGS = ("SETTINGS format_schema_source = 'string', format_schema = {schema}, "
            "format_schema_message_name = 'ExportTraceServiceRequest', input_format_protobuf_oneof_presence = 1, "
            "output_format_json_escape_forward_slashes = 0, output_format_json_quote_64bit_integers = 0")
FLAT = "ARRAY JOIN resource_spans AS rs ARRAY JOIN rs.scope_spans AS ss ARRAY JOIN ss.spans AS sp"


def _value_str(v: str) -> str:
    """SQL: an AnyValue tuple ``v`` as ``SpanColumns`` stores it (``_attr_str``): str as is, bool
    true/false, int as str, double as Python's repr (ClickHouse prints 1.0 as ``1``), bytes as hex,
    an array as ``json.dumps`` (``", "`` between items), anything else empty."""
    def scalar(x: str) -> str:
        return (f"multiIf({x}.value = 1, {x}.string_value, {x}.value = 2, if({x}.bool_value, 'true', 'false'), "
                f"{x}.value = 3, toString({x}.int_value), {x}.value = 4, "
                f"if(match(toString({x}.double_value), '^-?[0-9]+$'), toString({x}.double_value) || '.0', "
                f"toString({x}.double_value)), {x}.value = 7, lower(hex({x}.bytes_value)), '')")

    def json_item(x: str) -> str:
        return (f"multiIf({x}.value = 1, toJSONString({x}.string_value), {x}.value = 7, "
                f"toJSONString(lower(hex({x}.bytes_value))), {scalar(x)})")

    arr = f"'[' || arrayStringConcat(arrayMap(e -> {json_item('e')}, {v}.array_value.values), ', ') || ']'"
    return f"if({v}.value = 5, {arr}, {scalar(v)})"


def _attr_map(kvs: str) -> str:
    return f"mapFromArrays({kvs}.key, arrayMap(a -> {_value_str('a.value')}, {kvs}))"


def _pick(kvs: str, key: str, field: str) -> str:
    return f"{kvs}.value.{field}[indexOf({kvs}.key, '{key}')]"


STORED_ROW = f"""
    fromUnixTimestamp64Nano(toInt64(sp.start_time_unix_nano)) AS Timestamp,
    lower(hex(sp.trace_id)) AS TraceId, lower(hex(sp.span_id)) AS SpanId,
    lower(hex(sp.parent_span_id)) AS ParentSpanId, sp.trace_state AS TraceState, sp.name AS SpanName,
    transform(sp.kind, [1, 2, 3, 4, 5], ['Internal', 'Server', 'Client', 'Producer', 'Consumer'], 'Unspecified') AS SpanKind,
    {_attr_map('rs.resource.attributes')}['service.name'] AS ServiceName,
    {_attr_map('rs.resource.attributes')} AS ResourceAttributes,
    ss.scope.name AS ScopeName, ss.scope.version AS ScopeVersion,
    {_attr_map('sp.attributes')} AS SpanAttributes,
    sp.end_time_unix_nano - sp.start_time_unix_nano AS Duration,
    transform(sp.status.code, [1, 2], ['Ok', 'Error'], 'Unset') AS StatusCode, sp.status.message AS StatusMessage"""
STORED_COLS = ["Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind",
               "ServiceName", "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration",
               "StatusCode", "StatusMessage"]

A = "sp.attributes"
ASSEMBLY_COLS = f"""
    lower(hex(sp.trace_id)) AS trace_id, lower(hex(sp.span_id)) AS span_id,
    lower(hex(sp.parent_span_id)) AS parent_span_id, sp.name AS name,
    sp.start_time_unix_nano AS start_ns, sp.end_time_unix_nano AS end_ns, sp.status.code AS status_code,
    {_pick(A, 'gen_ai.operation.name', 'string_value')} AS operation,
    {_pick(A, 'gen_ai.request.model', 'string_value')} AS model,
    if(indexOf({A}.key, 'gen_ai.usage.input_tokens') > 0, {_pick(A, 'gen_ai.usage.input_tokens', 'int_value')}, NULL) AS input_tokens,
    if(indexOf({A}.key, 'gen_ai.usage.output_tokens') > 0, {_pick(A, 'gen_ai.usage.output_tokens', 'int_value')}, NULL) AS output_tokens,
    {_pick(A, 'gen_ai.tool.name', 'string_value')} AS tool_name,
    {_pick('rs.resource.attributes', 'service.name', 'string_value')} AS service"""


def _json_value(v: str) -> str:
    """SQL: an AnyValue tuple ``v`` as JSON text that ``json.loads`` turns into the Python value
    ``decode_http`` gives (str, bool, int, float, list); bytes and kvlists are left out of this
    measurement (a product path would send them to the Python decoder)."""
    def scalar(x: str) -> str:
        return (f"multiIf({x}.value = 1, toJSONString({x}.string_value), {x}.value = 2, "
                f"if({x}.bool_value, 'true', 'false'), {x}.value = 3, toString({x}.int_value), "
                f"{x}.value = 4, toString({x}.double_value), 'null')")

    return (f"if({v}.value = 5, '[' || arrayStringConcat(arrayMap(e -> {scalar('e')}, {v}.array_value.values), ',') "
            f"|| ']', {scalar(v)})")


SPAN_OBJECTS = f"""
    lower(hex(sp.trace_id)) AS trace_id, lower(hex(sp.span_id)) AS span_id,
    lower(hex(sp.parent_span_id)) AS parent_span_id, sp.name AS name, sp.kind AS kind,
    sp.start_time_unix_nano AS start_ns, sp.end_time_unix_nano AS end_ns, sp.status.code AS status_code,
    sp.status.message AS status_message,
    '{{' || arrayStringConcat(arrayMap(a -> toJSONString(a.key) || ':' || {_json_value('a.value')}, sp.attributes), ',')
        || '}}' AS attributes,
    ss.scope.name AS scope_name, ss.scope.version AS scope_version, sp.trace_state AS trace_state"""


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


class Native:
    """chDB session reading length-delimited ExportTraceServiceRequest bodies from a /dev/shm file."""

    def __init__(self, workdir: str) -> None:
        from chdb import session

        self.s = session.Session(os.path.join(workdir, "chdb"))
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else workdir
        self.path = tempfile.mktemp(prefix="relyscope-native-", suffix=".pb", dir=shm)
        self.settings = SETTINGS.format(schema="'" + PROTO.replace("\\", "\\\\").replace("'", "\\'") + "'")
        for ddl in SCHEMA[:1]:
            self.s.query(ddl.format(db="default"))

    def source(self, bodies: list[bytes]) -> str:
        with open(self.path, "wb") as f:
            f.write(b"".join(varint(len(b)) + b for b in bodies))
        return f"file('{self.path}', 'Protobuf', '{STRUCTURE}')"

    def count(self, bodies: list[bytes]) -> int:
        return int(self.s.query(f"SELECT count() FROM {self.source(bodies)} {FLAT} {self.settings}", "CSV").bytes())

    def assembly_arrow(self, bodies: list[bytes]):
        import pyarrow as pa

        r = self.s.query(f"SELECT {ASSEMBLY_COLS} FROM {self.source(bodies)} {FLAT} {self.settings}", "ArrowStream")
        return pa.ipc.open_stream(r.bytes()).read_all()

    def canonical_spans(self, bodies: list[bytes]) -> list:
        """``CanonicalSpan``s with their attribute dicts (``json.loads`` of SQL-built JSON), the
        resource dict left empty: what today's normalizer and builder would take from a native
        decode."""
        import json

        import pyarrow as pa

        from relyscope.model import CanonicalSpan

        r = self.s.query(f"SELECT {SPAN_OBJECTS} FROM {self.source(bodies)} {FLAT} {self.settings}", "ArrowStream")
        t = pa.ipc.open_stream(r.bytes()).read_all()
        c = [t.column(i).to_pylist() for i in range(t.num_columns)]
        loads = json.loads
        return [CanonicalSpan(tid, sid, par, name, kind, st, en, code, msg, loads(attrs), {}, sn, sv, (), (), ts)
                for tid, sid, par, name, kind, st, en, code, msg, attrs, sn, sv, ts in zip(*c)]

    def insert(self, bodies: list[bytes]) -> None:
        self.s.query(f"INSERT INTO default.otel_traces ({', '.join(STORED_COLS)}) "
                     f"SELECT {STORED_ROW} FROM {self.source(bodies)} {FLAT} {self.settings}")

    def stored_rows(self, bodies: list[bytes]) -> list[tuple]:
        import pyarrow as pa

        r = self.s.query(f"SELECT {STORED_ROW} FROM {self.source(bodies)} {FLAT} {self.settings}", "ArrowStream")
        t = pa.ipc.open_stream(r.bytes()).read_all()
        return list(zip(*[t.column(c).to_pylist() for c in STORED_COLS]))

    def close(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.s.close()


def oracle_rows(bodies: list[bytes]) -> list[tuple]:
    """``decode_record``'s stored rows (``SpanColumns.rows()``), the columns of STORED_COLS, maps as
    sorted item lists and times as ns (as the Arrow read of the native rows gives them)."""
    out = []
    for b in bodies:
        res = decode_record(TAG_PROTO + b, Limits())
        for r in res.columns.rows():
            out.append(tuple(r[:len(STORED_COLS)]))
    return out


def recorded_requests() -> dict[str, bytes]:
    """The real emitters' requests of ``../shared/data/spans`` (OTLP/JSON, hex ids) as protobuf
    bodies (ids to base64 for ``json_format``); a file protobuf cannot hold (an ``intValue`` past
    int64) is skipped. Empty when the directory is absent."""
    import base64
    import json

    from google.protobuf import json_format

    d = Path(__file__).resolve().parents[2] / "shared" / "data" / "spans"
    out: dict[str, bytes] = {}

    def ids_to_b64(o):
        if isinstance(o, dict):
            for k in ("traceId", "spanId", "parentSpanId"):
                if isinstance(o.get(k), str) and o[k]:
                    o[k] = base64.b64encode(bytes.fromhex(o[k])).decode()
            for v in o.values():
                ids_to_b64(v)
        elif isinstance(o, list):
            for v in o:
                ids_to_b64(v)

    for f in sorted(d.glob("*.otlp.json")) if d.is_dir() else []:
        doc = json.loads(f.read_text())
        ids_to_b64(doc)
        try:
            out[f.name] = json_format.ParseDict(doc, ExportTraceServiceRequest(),
                                                ignore_unknown_fields=True).SerializeToString()
        except json_format.ParseError:
            continue
    return out


def compare(native: list[tuple], oracle: list[tuple]) -> dict[str, int]:
    """Per column: how many spans differ (matched by (TraceId, SpanId)); '_missing' counts spans
    in one side only."""
    def norm(row):
        row = list(row)
        ts = row[0]
        row[0] = int(ts.value) if hasattr(ts, "value") else (ts if isinstance(ts, int) else int(ts.timestamp() * 1e9))
        for i in (8, 11):
            row[i] = sorted(dict(row[i]).items()) if not isinstance(row[i], list) else sorted(row[i])
        return row

    n = {(r[1], r[2]): norm(r) for r in native}
    o = {(r[1], r[2]): norm(r) for r in oracle}
    diff: collections.Counter = collections.Counter()
    diff["_missing"] = len(set(n) ^ set(o))
    for k in set(n) & set(o):
        for i, c in enumerate(STORED_COLS):
            if n[k][i] != o[k][i]:
                diff[c] += 1
    return dict(diff)


def rate(fn, n_spans: int, reps: int) -> tuple[float, float]:
    """(spans per wall second, CPU µs per span) of the best of ``reps`` runs (CPU: this process,
    chDB's threads included)."""
    best_w, best_c = 0.0, float("inf")
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        w, cp = time.perf_counter() - t, time.process_time() - c
        best_w, best_c = max(best_w, n_spans / w), min(best_c, cp / n_spans * 1e6)
    return best_w, best_c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--batch", default="1,8,40", help="requests per chDB query, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})  # one core; chDB's threads inherit it
    tm = template()
    bodies = [variant(tm, k) for k in range(args.requests)]
    total = args.requests * SPANS
    batches = [int(x) for x in args.batch.split(",") if x]
    work = tempfile.mkdtemp(prefix="relyscope-bench-native-")
    nat = Native(work)
    rows: list[tuple[str, float, float]] = []

    def per_batch(fn, b):
        return lambda: [fn(bodies[i:i + b]) for i in range(0, len(bodies), b)]

    try:
        assert nat.count(bodies[:1]) == SPANS
        rows.append(("raw upb parse", *rate(lambda: [ExportTraceServiceRequest.FromString(b) for b in bodies],
                                            total, args.reps)))
        lim = Limits()
        rows.append(("decode_record (our hot path: decode, redact, normalize, columns)",
                     *rate(lambda: [decode_record(TAG_PROTO + b, lim) for b in bodies], total, args.reps)))
        for b in batches:
            rows.append((f"chDB parse only, {b} request(s) per query", *rate(per_batch(nat.count, b), total, args.reps)))
        for b in batches:
            rows.append((f"chDB parse → assembly columns (Arrow), {b}/query",
                         *rate(per_batch(nat.assembly_arrow, b), total, args.reps)))
        b = max(batches)
        rows.append((f"chDB parse → assembly columns → Python lists, {b}/query",
                     *rate(per_batch(lambda bs: [c.to_pylist() for c in nat.assembly_arrow(bs).columns], b),
                           total, args.reps)))
        rows.append(("decode_http alone (the decode inside decode_record)",
                     *rate(lambda: [decode_http(b, "application/x-protobuf", None, lim) for b in bodies],
                           total, args.reps)))
        rows.append((f"chDB parse → CanonicalSpan with attribute dicts (json.loads), {b}/query",
                     *rate(per_batch(nat.canonical_spans, b), total, args.reps)))
        got = [(x.span_id, x.name, x.start_ns, dict(x.attributes)) for x in nat.canonical_spans(bodies[:2])]
        want = [(x.span_id, x.name, x.start_ns, dict(x.attributes))
                for bb in bodies[:2] for x in decode_http(bb, "application/x-protobuf", None, lim).spans]
        spans_equal = sorted(got, key=repr) == sorted(want, key=repr)
        for b in batches:
            rows.append((f"chDB parse → INSERT INTO otel_traces (stored row in SQL), {b}/query",
                         *rate(per_batch(nat.insert, b), total, args.reps)))
        diff = compare(nat.stored_rows(bodies[:4]), oracle_rows(bodies[:4]))
        recorded = {name: compare(nat.stored_rows([b]), oracle_rows([b])) for name, b in recorded_requests().items()}
        one = nat.source(bodies[:1])
        overhead = {"SELECT 1": rate(lambda: nat.s.query("SELECT 1", "CSV"), 1, 20)[1],
                    "count() of 1 request, no ARRAY JOIN": rate(lambda: nat.s.query(
                        f"SELECT count() FROM {one} {nat.settings}", "CSV"), 1, 20)[1]}
    finally:
        nat.close()
        shutil.rmtree(work, ignore_errors=True)

    base_w, base_c = rows[0][1], rows[0][2]
    print(f"{args.requests} requests x {SPANS} spans, core 0, best of {args.reps}; load avg {os.getloadavg()[0]:.2f}")
    print(f"{'stage':74s} {'spans/s':>11s} {'µs CPU/span':>12s} {'× upb CPU':>10s}")
    for label, w, c in rows:
        print(f"{label:74s} {w:11,.0f} {c:12.2f} {c / base_c:10.1f}")
    print(f"oracle check, {4 * SPANS} bench spans, spans differing per column (native vs decode_record): {diff}")
    print(f"oracle check, CanonicalSpan ids, names, start, attributes of {2 * SPANS} spans equal to decode_http's: "
          f"{spans_equal}")
    for name, d in recorded.items():
        print(f"oracle check, {name}: {d}")
    for label, us in overhead.items():
        print(f"per query, {label}: {us / 1000:.2f} ms CPU")
    del base_w


if __name__ == "__main__":
    main()
