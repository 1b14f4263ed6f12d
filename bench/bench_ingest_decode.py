"""Decode throughput of the OTLP receiver edge (relyscope.collector.otlp).

Builds one ExportTraceServiceRequest of 512 GenAI-like spans (agent root, chat and tool calls,
~12 attributes each, one event on chat spans), then measures in the same run:

- raw upb parse: ``ExportTraceServiceRequest.FromString`` spans/s (the floor any Python decoder
  pays),
- ``decode_http`` protobuf (identity and gzip) spans/s,
- ``decode_http`` OTLP/JSON spans/s,
- what the worker does per spool record before storing: the old path (decode_http, redact,
  normalize, build rows) and :func:`relyscope.collector.fastpath.decode_record` (the hot path:
  the same, laid out as insert columns),

and prints the ratio decode/raw. Target (architecture): >= 50 000 spans/s accepted on one core.

Run: ``.venv/bin/python bench/bench_ingest_decode.py [--spans 512] [--seconds 2]``
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import time

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from relyscope.collector.otlp import decode_http


def build_request(n_spans: int) -> ExportTraceServiceRequest:
    """A request of ``n_spans`` GenAI-like spans in one resource and scope."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in (("service.name", "support-agent"), ("service.version", "1.4.2"),
                 ("telemetry.sdk.language", "python"), ("telemetry.sdk.name", "opentelemetry")):
        a = rs.resource.attributes.add()
        a.key = k
        a.value.string_value = v
    ss = rs.scope_spans.add()
    ss.scope.name = "relyscope.instrumentation"
    ss.scope.version = "0.1.0"
    t0 = 1_760_000_000_000_000_000
    for i in range(n_spans):
        trace = (i // 16).to_bytes(16, "big") or b"\x01" * 16
        trace = bytes([1]) + trace[1:]
        sp = ss.spans.add()
        sp.trace_id = trace
        sp.span_id = (i + 1).to_bytes(8, "big")
        if i % 16:
            sp.parent_span_id = ((i // 16) * 16 + 1).to_bytes(8, "big")
        sp.start_time_unix_nano = t0 + i * 1_000_000
        sp.end_time_unix_nano = t0 + i * 1_000_000 + 900_000
        role = "agent" if i % 16 == 0 else ("chat" if i % 2 else "tool")
        attrs: list[tuple[str, object]] = [("gen_ai.operation.name",
                                            {"agent": "invoke_agent", "chat": "chat",
                                             "tool": "execute_tool"}[role])]
        if role == "agent":
            sp.name = "invoke_agent support_bot"
            sp.kind = 1
            attrs += [("gen_ai.agent.name", "support_bot"), ("gen_ai.agent.id", "agent-7"),
                      ("gen_ai.conversation.id", f"sess-{i}"), ("relyscope.task.id", f"task-{i % 50}"),
                      ("gen_ai.invocation.is_nested", False), ("relyscope.confidence", 0.8)]
        elif role == "chat":
            sp.name = "chat gpt-4o"
            sp.kind = 3
            attrs += [("gen_ai.provider.name", "openai"), ("gen_ai.request.model", "gpt-4o"),
                      ("gen_ai.response.model", "gpt-4o-2024-08-06"),
                      ("gen_ai.usage.input_tokens", 812 + i), ("gen_ai.usage.output_tokens", 41),
                      ("gen_ai.usage.cache_read.input_tokens", 128),
                      ("gen_ai.request.temperature", 0.2), ("gen_ai.response.id", f"chatcmpl-{i}"),
                      ("gen_ai.response.finish_reasons", ["tool_calls"]),
                      ("server.address", "api.openai.com"), ("server.port", 443)]
            ev = sp.events.add()
            ev.name = "gen_ai.evaluation.result"
            ev.time_unix_nano = sp.end_time_unix_nano
            for k, v in (("gen_ai.evaluation.name", "relevance"),
                         ("gen_ai.evaluation.score.value", 0.9)):
                a = ev.attributes.add()
                a.key = k
                _set(a.value, v)
        else:
            sp.name = "execute_tool get_order_details"
            sp.kind = 1
            attrs += [("gen_ai.tool.name", "get_order_details"), ("gen_ai.tool.call.id", f"call_{i}"),
                      ("gen_ai.tool.type", "function"),
                      ("gen_ai.tool.call.arguments", '{"order_id": "#W%07d"}' % i),
                      ("gen_ai.tool.call.result", '{"status": "delivered", "items": 3}'),
                      ("relyscope.tool.side_effect", "read")]
        sp.status.code = 1
        for k, v in attrs:
            a = sp.attributes.add()
            a.key = k
            _set(a.value, v)
    return req


def _set(av, v) -> None:
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    elif isinstance(v, str):
        av.string_value = v
    else:
        for x in v:
            _set(av.array_value.values.add(), x)


def _rate(fn, n_spans: int, seconds: float) -> float:
    fn()  # warm-up
    runs = 0
    t = time.perf_counter()
    end = t + seconds
    while True:
        fn()
        runs += 1
        now = time.perf_counter()
        if now >= end:
            break
    return runs * n_spans / (now - t)


def _to_otlp_json(req: ExportTraceServiceRequest) -> bytes:
    """Spec OTLP/JSON: lowercase hex ids, integer enums (json_format would give base64 ids)."""
    d = json_format.MessageToDict(req, use_integers_for_enums=True)
    for rs in d["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
    return json.dumps(d).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    req = build_request(args.spans)
    body = req.SerializeToString()
    gz = gzip.compress(body)
    js = _to_otlp_json(req)
    assert len(decode_http(body, "application/x-protobuf", None).spans) == args.spans
    raw = _rate(lambda: ExportTraceServiceRequest.FromString(body), args.spans, args.seconds)
    pb = _rate(lambda: decode_http(body, "application/x-protobuf", None), args.spans, args.seconds)
    pbgz = _rate(lambda: decode_http(gz, "application/x-protobuf", "gzip"), args.spans, args.seconds)
    jr = _rate(lambda: decode_http(js, "application/json", None), args.spans, args.seconds)
    from relyscope.collector import fastpath
    from relyscope.collector.normalize import normalize
    from relyscope.collector.otlp import Limits
    from relyscope.collector.redaction import Redactor
    from relyscope.store.clickhouse import span_columns

    lim, red = Limits(), Redactor()

    def legacy_worker():  # what the worker ran per record before the hot path (and still can)
        spans = [red.apply(s) for s in decode_http(body, "application/x-protobuf", None, lim).spans]
        span_columns(spans)  # ~ the rows insert_spans builds
        return [normalize(s) for s in spans]

    old = _rate(legacy_worker, args.spans, args.seconds)
    fast = _rate(lambda: fastpath.decode_record(b"P" + body, lim, red), args.spans, args.seconds)
    print(f"body: {len(body)} B protobuf, {len(gz)} B gzip, {len(js)} B JSON, {args.spans} spans")
    print(f"raw upb FromString      : {raw:12,.0f} spans/s")
    print(f"decode_http protobuf    : {pb:12,.0f} spans/s  (ratio to raw parse {pb / raw:.3f})")
    print(f"decode_http protobuf+gz : {pbgz:12,.0f} spans/s")
    print(f"decode_http OTLP/JSON   : {jr:12,.0f} spans/s")
    print(f"worker per record, old  : {old:12,.0f} spans/s  (decode_http + redact + normalize + rows; "
          f"ratio {old / raw:.3f})")
    print(f"fastpath.decode_record  : {fast:12,.0f} spans/s  (decoded, redacted, normalized, columns; "
          f"ratio {fast / raw:.3f}; {fast / old:.2f}x old)")
    print(f"target >= 50,000 spans/s: protobuf {'OK' if pb >= 50_000 else 'BELOW'}, "
          f"JSON {'OK' if jr >= 50_000 else 'BELOW'}")


if __name__ == "__main__":
    main()
