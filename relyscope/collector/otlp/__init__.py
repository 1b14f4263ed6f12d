"""OTLP trace decoding at the receiver edge: bytes / protobuf messages in, ``CanonicalSpan`` out.

Modules: :mod:`.result` (errors, limits, results), :mod:`.protobuf` and :mod:`.jsonformat` (the
two decoders), :mod:`.common` (what they share), :mod:`.http` (content type, encoding, size
limits), :mod:`.responses` (OTLP response bodies). Import from the package.

This is the one place that sees OTLP (style.md lesson 4). It never crashes on bad input (lesson 12):
a request that cannot be used at all raises :class:`OTLPRequestError` (a *permanent* error,
lesson 13) — including a JSON body of another signal or with no ``resourceSpans`` (``{}`` is a
valid empty request); a span that cannot be stored is rejected and counted with a reason (OTLP
partial success); everything else is repaired and the repair is named in ``CanonicalSpan.flags``
and, when something the client sent was dropped or altered (:data:`REPORTED_FLAGS`), reported
back in the partial-success ``error_message`` with its span count.

Shapes and units:

- ids are lowercase hex (trace 32 chars, span 16 chars; conventions.md §3 "IDs");
- times are Unix epoch nanoseconds (``int``); an end before its start is clamped to the start
  (flag ``end_before_start``, the raw value kept in ``raw_end_ns``);
- attribute values are ``str | bool | int | float | bytes | list | dict | None`` (``None`` only
  for an attribute sent without a value, flag ``empty_attribute``).

Accepted input (OTLP 1.x, opentelemetry-proto 1.x):

- HTTP: ``application/x-protobuf`` and ``application/json`` (parameters such as ``charset``
  ignored), ``Content-Encoding`` gzip, deflate (zlib or raw), zstd, identity;
- gRPC: an already parsed ``ExportTraceServiceRequest`` (or the output of
  :func:`deserialize_request`, which survives invalid UTF-8 that upb refuses to parse);
- protobuf a whole parse refuses (upb's depth limit, bytes that are no message): the request is
  parsed with its spans as byte strings and each span alone; a span that still fails is rejected
  (reason ``malformed``) and the rest of its batch is kept;
- OTLP/JSON tolerances, each counted in ``DecodeResult.warnings``: base64 ids (``base64_id``),
  snake_case keys (``snake_case_keys``), uppercase hex (``uppercase_hex``), enum names as strings
  (``enum_name``), 64-bit integers as JSON numbers or strings.

Thread-safety: every function here is pure and safe from any thread; CPU-bound, so callers on an
event loop should run :func:`decode_http` in a worker thread for large bodies.
"""

from relyscope.collector.otlp.result import (
    GRPC_CODE_NUMBERS,
    PB_REPORTED_FLAGS,
    REPORTED_FLAGS,
    DecodeResult,
    Limits,
    OTLPRequestError,
    Validation,
)
from relyscope.collector.otlp.protobuf import decode_request, deserialize_request
from relyscope.collector.otlp.jsonformat import decode_json
from relyscope.collector.otlp.http import decode_http, decompress, validate_http
from relyscope.collector.otlp.responses import encode_response, encode_status

__all__ = [
    "OTLPRequestError",
    "Limits",
    "DecodeResult",
    "Validation",
    "decode_http",
    "validate_http",
    "decode_request",
    "decode_json",
    "deserialize_request",
    "decompress",
    "encode_response",
    "encode_status",
    "GRPC_CODE_NUMBERS",
    "REPORTED_FLAGS",
    "PB_REPORTED_FLAGS",
]
