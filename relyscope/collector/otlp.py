"""OTLP trace decoding at the receiver edge: bytes / protobuf messages in, ``CanonicalSpan`` out.

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
- OTLP/JSON tolerances, each counted in ``DecodeResult.warnings``: base64 ids (``base64_id``),
  snake_case keys (``snake_case_keys``), uppercase hex (``uppercase_hex``), enum names as strings
  (``enum_name``), 64-bit integers as JSON numbers or strings.

Thread-safety: every function here is pure and safe from any thread; CPU-bound, so callers on an
event loop should run :func:`decode_http` in a worker thread for large bodies.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import json as _json
import math
import operator
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.unknown_fields import UnknownFieldSet
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from relyscope.collector.normalize.versions import attribute_rank, never_truncate
from relyscope.model import CanonicalSpan, SpanEvent, SpanSemantics

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
    "encode_response",
    "encode_status",
    "GRPC_CODE_NUMBERS",
]

# --------------------------------------------------------------------------------------------------
# Errors, limits, result
# --------------------------------------------------------------------------------------------------

#: google.rpc.Code numbers of the gRPC status names used here.
GRPC_CODE_NUMBERS: dict[str, int] = {
    "OK": 0,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "RESOURCE_EXHAUSTED": 8,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
}


class OTLPRequestError(Exception):
    """A whole request is unusable: a permanent error, the client must not retry it unchanged.

    Attributes:
        http_status: 400 (undecodable body, bad compressed data), 413 (body larger than
            ``Limits.max_body_bytes`` compressed or decompressed), 415 (unknown content type or
            content encoding), 500 (a bug in this module; never expected).
        grpc_code: the ``grpc.StatusCode`` name (``"INVALID_ARGUMENT"`` for every client error,
            never a retryable code; ``"INTERNAL"`` for 500). ``getattr(grpc.StatusCode, code)``.
        message: developer-facing reason.
    """

    def __init__(self, message: str, http_status: int = 400, grpc_code: str = "INVALID_ARGUMENT"):
        super().__init__(message)
        self.message = message
        self.http_status = http_status
        self.grpc_code = grpc_code

    def status_body(self, *, json: bool) -> bytes:
        """The ``google.rpc.Status`` HTTP response body for this error (see :func:`encode_status`)."""
        return encode_status(GRPC_CODE_NUMBERS.get(self.grpc_code, 2), self.message, json=json)


@dataclass(frozen=True)
class Limits:
    """Decoder limits.

    Attributes:
        max_body_bytes: bytes, applied to the received body and again to the decompressed body
            (default 16 MiB). Over it: 413.
        max_attributes: attributes kept per span / event (OTel SDK default
            ``OTEL_ATTRIBUTE_COUNT_LIMIT`` = 128); over it, attributes are dropped (flag
            ``dropped_attributes``, count in ``CanonicalSpan.dropped_attributes``) but never one
            that scoring reads (:func:`relyscope.collector.normalize.versions.attribute_rank`,
            which may keep a span over the limit), flattened message history first.
        max_attribute_length: code points kept per string value (``None``: unlimited, the SDK
            default); longer strings are truncated (flag ``truncated_attribute``), except the
            identity and other exact values scoring reads
            (:func:`~relyscope.collector.normalize.versions.never_truncate`: ids never merge).
            Resource attributes are subject to neither limit.
        max_events: events kept per span (SDK default 128); flag ``dropped_events``.
    """

    max_body_bytes: int = 16 << 20
    max_attributes: int = 128
    max_attribute_length: int | None = None
    max_events: int = 128

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be > 0")
        if self.max_attributes < 0 or self.max_events < 0:
            raise ValueError("max_attributes and max_events must be >= 0")
        if self.max_attribute_length is not None and self.max_attribute_length < 0:
            raise ValueError("max_attribute_length must be >= 0 or None")


_DEFAULT_LIMITS = Limits()
_MAX_ERROR_MESSAGE_REASONS = 10

#: Span flags meaning something the client sent was dropped or altered at decode time. Each is
#: reported back in the reply (OTLP partial success ``error_message``; ``rejected_spans`` stays 0
#: when no span was lost: a warning, as the OTLP spec allows) and counted
#: (``relyscope_otlp_warnings_total{kind}``). Repairs that lose nothing (a missing kind, an end
#: before the start whose raw value is kept, a value nested deeper than 32 kept as its OTLP/JSON
#: text: ``attribute_too_deep``) are counted only.
REPORTED_FLAGS: dict[str, str] = {
    "invalid_attribute": "attributes not in OTLP's list-of-{key, value} shape, dropped",
    "invalid_attribute_value": "attribute values of no OTLP AnyValue shape, dropped",
    "dropped_attributes": "attributes over the count limit dropped, none that scoring reads",
    "truncated_attribute": "string attributes cut to the length limit (ids never)",
    "dropped_events": "events over the count limit, dropped",
    "invalid_events": "events not in OTLP shape, dropped",
    "invalid_link": "links with invalid ids, dropped",
    "invalid_utf8": "invalid UTF-8 replaced by U+FFFD",
    "invalid_time": "timestamps out of range, read as missing",
    "invalid_kind": "unknown span kind, read as unspecified",
    "invalid_status": "invalid status, read as unset",
    "invalid_parent_span_id": "invalid parentSpanId, dropped",
    "invalid_field_type": "fields of the wrong JSON type, dropped",
    "invalid_resource": "resource not a JSON object, dropped",
    "invalid_scope": "scope not a JSON object, dropped",
}


#: The subset reported for OTLP/protobuf: the limits and invalid UTF-8, what the receiver can
#: check without converting a span (``validate_http`` must answer what ``decode_http`` does, at a
#: fraction of its cost). The other flags (an out-of-range kind, status or time, a bad parent or
#: link id: in protobuf only a broken encoder sends those) are counted by the worker's decode
#: (``relyscope_otlp_warnings_total``), not reported.
PB_REPORTED_FLAGS: frozenset[str] = frozenset({
    "dropped_attributes", "truncated_attribute", "dropped_events", "invalid_utf8",
})


def _repair_summary(repaired: collections.Counter, attributes_dropped: int) -> str:
    """``"accepted with repairs: 2 spans invalid_attribute (…); 1 span dropped_attributes (…,
    7 attributes)"``, flags in name order; ``""`` when nothing was repaired."""
    parts = []
    for flag in sorted(repaired):
        n = repaired[flag]
        if n <= 0:
            continue
        desc = REPORTED_FLAGS[flag]
        if flag == "dropped_attributes" and attributes_dropped:
            desc += f", {attributes_dropped} attributes"
        parts.append(f"{n} span{'' if n == 1 else 's'} {flag} ({desc})")
    return "accepted with repairs: " + "; ".join(parts) if parts else ""


def _compose(errors: Any, repaired: collections.Counter, attributes_dropped: int) -> str:
    return "; ".join(m for m in (_join_errors(errors), _repair_summary(repaired, attributes_dropped)) if m)


@dataclass
class DecodeResult:
    """What one request decoded to.

    Attributes:
        spans: accepted spans, at most one per (trace_id, span_id) (the last occurrence wins).
        rejected: number of spans that could not be stored (OTLP ``rejected_spans``).
        errors: one reason per rejected span (``"span 2 (scope 0) of resource 0: spanId
            missing"``), plus request-level notes that did not cost a span.
        warnings: counts of tolerated oddities and repairs: every span flag (counted once per
            span) plus ``duplicate_in_batch``, ``base64_id``, ``snake_case_keys`` (per key),
            ``uppercase_hex``, ``enum_name``.
        rejected_by_reason: ``rejected`` split by a short, bounded reason code (for a
            ``relyscope_spans_rejected_total{reason}`` counter): ``trace_id_missing``,
            ``trace_id_invalid``, ``trace_id_zero``, ``span_id_*``, ``malformed``, ``internal``.
        repaired: accepted spans per :data:`REPORTED_FLAGS` flag (what was dropped or altered).
        attributes_dropped: attributes the count limit dropped, over the accepted spans.
        semantics: None, or (once :func:`relyscope.collector.fastpath.prepare` ran) the
            ``SpanSemantics`` of each span, aligned with ``spans`` (which are then redacted and
            lean: no attributes or events).
        columns: None, or (prepared) the ``otel_traces`` rows of the full spans as a
            :class:`relyscope.store.clickhouse.SpanColumns`. Both pickle.
    """

    spans: list[CanonicalSpan] = field(default_factory=list)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: collections.Counter = field(default_factory=collections.Counter)
    rejected_by_reason: collections.Counter = field(default_factory=collections.Counter)
    repaired: collections.Counter = field(default_factory=collections.Counter)
    attributes_dropped: int = 0
    semantics: list | None = None
    columns: Any = None

    def __reduce__(self):
        # a decode worker process sends prepared batches back: spans and semantics as plain tuples
        # (C-level attrgetter out, positional constructors in) unpickle ~2x faster than the
        # dataclasses' own pickling, which the receiving worker thread would pay per span
        return (_rebuild_result, (
            [_SPAN_GET(s) for s in self.spans],
            None if self.semantics is None else [_SEM_GET(x) for x in self.semantics],
            self.rejected, self.errors, self.warnings, self.rejected_by_reason, self.repaired,
            self.attributes_dropped, self.columns))

    def error_message(self) -> str:
        """Reasons joined by ``"; "`` (the first 10, then ``"… and N more"``), then the repairs
        made to accepted spans (:data:`REPORTED_FLAGS`, with counts); ``""`` if none."""
        return _compose(self.errors, self.repaired, self.attributes_dropped)


_SPAN_GET = operator.attrgetter(*(f.name for f in dataclasses.fields(CanonicalSpan)))
_SEM_GET = operator.attrgetter(*(f.name for f in dataclasses.fields(SpanSemantics)))


def _rebuild_result(spans, sems, rejected, errors, warnings, by_reason, repaired, dropped, columns):
    """Inverse of :meth:`DecodeResult.__reduce__`."""
    return DecodeResult([CanonicalSpan(*t) for t in spans], rejected, errors, warnings, by_reason, repaired,
                        dropped, None if sems is None else [SpanSemantics(*t) for t in sems], columns)


def _join_errors(errors: Any) -> str:
    if not errors:
        return ""
    head = errors[:_MAX_ERROR_MESSAGE_REASONS]
    msg = "; ".join(head)
    if len(errors) > len(head):
        msg += f"; ... and {len(errors) - len(head)} more"
    return msg


@dataclass(frozen=True)
class Validation:
    """What the receiver must answer for one request, without building any span.

    Equal, on every input, to the reply fields of :func:`decode_http` on the same input (that
    function is the test oracle): ``accepted == len(decode_http(...).spans)``, and ``rejected``,
    ``errors``, ``rejected_by_reason`` equal; the same :class:`OTLPRequestError` is raised.

    Attributes:
        accepted: spans that will be stored, counted once per distinct (trace_id, span_id).
        rejected: spans that cannot be stored (OTLP ``rejected_spans``).
        errors: one reason per rejected span plus request-level notes (as ``DecodeResult.errors``).
        rejected_by_reason: ``rejected`` split by bounded reason code (``trace_id_missing`` …).
        decoded: the full :class:`DecodeResult` when validating needed it anyway (OTLP/JSON, whose
            reject reasons depend on the whole span walk), so the caller need not decode again;
            ``None`` for protobuf.
        repaired, attributes_dropped: as :class:`DecodeResult`.
    """

    accepted: int = 0
    rejected: int = 0
    errors: tuple[str, ...] = ()
    rejected_by_reason: collections.Counter = field(default_factory=collections.Counter)
    decoded: DecodeResult | None = None
    repaired: collections.Counter = field(default_factory=collections.Counter)
    attributes_dropped: int = 0

    @classmethod
    def of(cls, result: DecodeResult) -> "Validation":
        """The reply fields of a full decode (``decoded`` is ``result``)."""
        return cls(len(result.spans), result.rejected, tuple(result.errors),
                   result.rejected_by_reason, result, result.repaired, result.attributes_dropped)

    def error_message(self) -> str:
        """As :meth:`DecodeResult.error_message`."""
        return _compose(self.errors, self.repaired, self.attributes_dropped)


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------

_Z16 = bytes(16)
_Z8 = bytes(8)
_EMPTY_FLAGS: frozenset[str] = frozenset()
_U64 = 1 << 64
_MAX_DEPTH = 32  # nesting of array/kvlist values we follow; deeper values become None
_SURR = re.compile("[\ud800-\udfff]+")


class _Rejected(Exception):
    """A span cannot be stored. ``code`` is the bounded reason code, ``args[0]`` the reason."""

    def __init__(self, reason: str, code: str):
        super().__init__(reason)
        self.code = code


def _truncate(s: str, max_len: int | None, fl: set) -> str:
    if max_len is not None and len(s) > max_len:
        fl.add("truncated_attribute")
        return s[:max_len]
    return s


class _Batch:
    """Accumulates accepted spans with last-wins de-duplication, rejections and warnings."""

    __slots__ = ("spans", "index", "result", "reported")

    def __init__(self, reported: Any = REPORTED_FLAGS) -> None:
        self.reported = reported
        self.spans: list[CanonicalSpan | None] = []
        self.index: dict[tuple[str, str], int] = {}
        self.result = DecodeResult()

    def add(self, span: CanonicalSpan) -> None:
        key = (span.trace_id, span.span_id)
        prev = self.index.get(key)
        if prev is not None:
            self.spans[prev] = None
            self.result.warnings["duplicate_in_batch"] += 1
        self.index[key] = len(self.spans)
        self.spans.append(span)
        if span.flags:
            self.result.warnings.update(span.flags)

    def reject(self, where: str, reason: str, code: str) -> None:
        r = self.result
        r.rejected += 1
        r.errors.append(f"{where}: {reason}")
        r.rejected_by_reason[code] += 1

    def reject_many(self, n: int, where: str, reason: str, code: str) -> None:
        r = self.result
        if n <= 0:
            r.errors.append(f"{where}: {reason}")
            return
        r.rejected += n
        r.rejected_by_reason[code] += n
        r.errors.extend(f"{where} span {i}: {reason}" for i in range(n))

    def finish(self) -> DecodeResult:
        r = self.result
        r.spans = [s for s in self.spans if s is not None]
        for s in r.spans:
            if s.flags:
                for f in s.flags:
                    if f in self.reported:
                        r.repaired[f] += 1
            r.attributes_dropped += s.dropped_attributes
        if r.attributes_dropped:
            r.warnings["attributes_dropped"] += r.attributes_dropped
        return r


# ClickHouse DateTime64(9) holds 1900-01-01 .. 2262-04-11; OTLP's fixed64 goes to 2^64. A time
# beyond int64 can never be stored (and once blocked the writer for good): flag it, treat as missing.
_MAX_TIME_NS = (1 << 63) - 1


def _event_time(t: int, fl: set) -> int:
    if t > _MAX_TIME_NS:
        fl.add("invalid_time")
        return 0
    return t


def _times(start: int, end: int, fl: set) -> tuple[int, int, int | None]:
    if start > _MAX_TIME_NS:
        fl.add("invalid_time")
        start = 0
    if end > _MAX_TIME_NS:
        fl.add("invalid_time")
        end = 0
    if start == 0:
        fl.add("missing_start")
    if end < start:
        fl.add("end_before_start")
        if end == 0:
            fl.add("missing_end")
        return start, start, end
    return start, end, None


def _internal(where: str, exc: BaseException, batch: _Batch) -> None:
    batch.reject(where, f"internal: {type(exc).__name__}", "internal")


# --------------------------------------------------------------------------------------------------
# Protobuf path
# --------------------------------------------------------------------------------------------------

_SCALAR_ONEOFS = frozenset(("int_value", "double_value", "bool_value"))


def _any_pb(v: Any, max_len: int | None, fl: set, depth: int) -> Any:
    w = v.WhichOneof("value")
    if w == "string_value":
        return _truncate(v.string_value, max_len, fl)
    if w in _SCALAR_ONEOFS:
        return getattr(v, w)
    if w is None:
        fl.add("empty_attribute")
        return None
    if depth >= _MAX_DEPTH:
        fl.add("attribute_too_deep")
        return _truncate(_deep_text_pb(v), max_len, fl)
    if w == "array_value":
        return [_any_pb(x, max_len, fl, depth + 1) for x in v.array_value.values]
    if w == "kvlist_value":
        out = {}
        for kv in v.kvlist_value.values:
            out[kv.key] = _any_pb(kv.value, max_len, fl, depth + 1)
        return out
    if w == "bytes_value":
        return v.bytes_value
    fl.add("invalid_attribute_value")  # an oneof member added by a future proto
    return None


def _deep_text_pb(v: Any) -> str:
    """A value nested past ``_MAX_DEPTH``, kept as its OTLP/JSON text (nothing is dropped)."""
    return json_format.MessageToJson(v, indent=None)


def _attrs_pb(kvs: Any, lim: Limits, fl: set, drops: list | None = None) -> dict[str, Any]:
    """OTLP KeyValue list -> dict (last duplicate key wins; over ``max_attributes``: see
    :func:`_cap`). ``drops``: a one-element list the number of dropped attributes is added to."""
    out: dict[str, Any] = {}
    if not kvs:
        return out
    max_len = lim.max_attribute_length
    for kv in kvs:
        v = kv.value
        # Hot path without WhichOneof: a non-empty string / non-zero int can only be the set member
        # of the oneof. Empty strings, zeros, doubles, bools and composites take the general path.
        x = v.string_value
        if x:
            if max_len is not None and len(x) > max_len and not never_truncate(kv.key):
                fl.add("truncated_attribute")
                x = x[:max_len]
            out[kv.key] = x
            continue
        x = v.int_value
        if x:
            out[kv.key] = x
            continue
        out[kv.key] = _any_pb(v, None if max_len is None or never_truncate(kv.key) else max_len, fl, 0)
    if len(out) > lim.max_attributes:
        return _cap(out, lim.max_attributes, fl, drops)
    return out


def _keep(keys: Any, max_n: int) -> set[str] | None:
    """Keys an attribute-count limit keeps (``keys`` distinct, in first-seen order), or None for
    all. Never drops a key scoring reads (rank 0 of :func:`attribute_rank`, even past ``max_n``);
    fills the rest of the ``max_n`` slots with other keys in order, flattened message history
    (rank 2) last — so the history's tail goes first, as the issue asks (D20)."""
    keys = list(keys)
    if len(keys) <= max_n:
        return None
    by_rank: tuple[list, list, list] = ([], [], [])
    for k in keys:
        by_rank[attribute_rank(k)].append(k)
    kept = set(by_rank[0])
    room = max_n - len(kept)
    for k in by_rank[1] + by_rank[2]:
        if room <= 0:
            break
        kept.add(k)
        room -= 1
    return kept


def _cap(out: dict[str, Any], max_n: int, fl: set, drops: list | None) -> dict[str, Any]:
    kept = _keep(out, max_n)
    if kept is None:
        return out
    fl.add("dropped_attributes")
    if drops is not None:
        drops[0] += len(out) - len(kept)
    return {k: v for k, v in out.items() if k in kept}


def _pb_id(raw: bytes, n: int, zero: bytes, name: str) -> str:
    if len(raw) != n:
        if not raw:
            raise _Rejected(f"{name} missing", f"{_CODE[name]}_missing")
        raise _Rejected(f"{name} has {len(raw)} bytes, expected {n}", f"{_CODE[name]}_invalid")
    if raw == zero:
        raise _Rejected(f"{name} is all zeros", f"{_CODE[name]}_zero")
    return raw.hex()


_CODE = {"traceId": "trace_id", "spanId": "span_id"}


def _span_pb(sp: Any, resource: dict, scope_name: str, scope_version: str, lim: Limits,
             extra_flags: frozenset[str]) -> CanonicalSpan:
    raw = sp.trace_id
    if len(raw) != 16 or raw == _Z16:  # the checks of _pb_id, inlined for the valid case
        tid = _pb_id(raw, 16, _Z16, "traceId")
    else:
        tid = raw.hex()
    raw = sp.span_id
    if len(raw) != 8 or raw == _Z8:
        sid = _pb_id(raw, 8, _Z8, "spanId")
    else:
        sid = raw.hex()
    fl: set[str] = set(extra_flags) if extra_flags else set()
    praw = sp.parent_span_id
    if not praw:
        parent = ""
    elif len(praw) != 8 or praw == _Z8:
        fl.add("invalid_parent_span_id")
        parent = ""
    else:
        parent = praw.hex()
    kind = sp.kind
    if kind == 0:
        fl.add("missing_kind")
    elif not 0 < kind <= 5:
        fl.add("invalid_kind")
        kind = 0
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    if 0 < start <= end <= _MAX_TIME_NS:  # the usual case of _times: nothing to flag or repair
        raw_end = None
    else:
        start, end, raw_end = _times(start, end, fl)
    st = sp.status
    code = st.code
    if not 0 <= code <= 2:
        fl.add("invalid_status")
        code = 0
    drops = [0]
    attrs = _attrs_pb(sp.attributes, lim, fl, drops)
    events: tuple[SpanEvent, ...] = ()
    if sp.events:
        evs = sp.events
        if len(evs) > lim.max_events:
            fl.add("dropped_events")
            evs = evs[: lim.max_events]
        events = tuple(SpanEvent(e.name, _event_time(e.time_unix_nano, fl), _attrs_pb(e.attributes, lim, fl, drops))
                       for e in evs)
    links: tuple[tuple[str, str], ...] = ()
    if sp.links:
        lk = []
        for link in sp.links:
            lt, ls = link.trace_id, link.span_id
            if len(lt) == 16 and len(ls) == 8 and lt != _Z16 and ls != _Z8:
                lk.append((lt.hex(), ls.hex()))
            else:
                fl.add("invalid_link")
        links = tuple(lk)
    return CanonicalSpan(tid, sid, parent, sp.name, kind, start, end, code, st.message, attrs,
                         resource, scope_name, scope_version, events, links, sp.trace_state,
                         frozenset(fl) if fl else _EMPTY_FLAGS, raw_end, drops[0])


def _walk_pb(req: Any, lim: Limits, bad: _BadUtf8 | None = None) -> DecodeResult:
    batch = _Batch(PB_REPORTED_FLAGS)
    for ri, rs in enumerate(req.resource_spans):
        try:
            rfl: set[str] = set()
            resource = _attrs_pb(rs.resource.attributes, _RESOURCE_LIMITS, rfl)
            if bad is not None and ri in bad.resources:
                rfl.add("invalid_utf8")
        except Exception as exc:  # noqa: BLE001 - never fail the batch (style.md lesson 12)
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            batch.reject_many(n, f"resource {ri}", f"internal: {type(exc).__name__}", "internal")
            continue
        for si, ss in enumerate(rs.scope_spans):
            scope = ss.scope
            sname, sversion = scope.name, scope.version
            sfl = rfl
            if bad is not None and (ri, si) in bad.scopes:
                sfl = rfl | {"invalid_utf8"}
            base = frozenset(sfl) if sfl else _EMPTY_FLAGS
            for pi, sp in enumerate(ss.spans):
                flags = base
                if bad is not None and (ri, si, pi) in bad.spans:
                    flags = base | {"invalid_utf8"}
                try:
                    batch.add(_span_pb(sp, resource, sname, sversion, lim, flags))
                except _Rejected as rej:
                    batch.reject(f"span {pi} (scope {si}) of resource {ri}", rej.args[0], rej.code)
                except Exception as exc:  # noqa: BLE001
                    _internal(f"span {pi} (scope {si}) of resource {ri}", exc, batch)
    result = batch.finish()
    if result.rejected and not result.spans:
        _other_signal_pb(req)
    return result


# Resource attributes are not subject to the span attribute limits.
_RESOURCE_LIMITS = Limits(max_attributes=1 << 30)


def _validate_pb(req: Any, lim: Limits = _DEFAULT_LIMITS, bad: "_BadUtf8 | None" = None) -> Validation:
    """The reply fields of ``_walk_pb(req, lim, bad)`` without building spans (see :class:`Validation`).

    Mirrors ``_walk_pb`` step for step. ``_walk_pb`` rejects a span (a) when ``_pb_id`` refuses its
    trace id, then its span id, or (b) ``internal`` when anything else in ``_span_pb`` raises, or
    every span of a resource when its attribute conversion raises. Past the ids, ``_span_pb`` only
    reads fields of an already parsed message (total in upb), compares ints, converts attributes
    with a depth cap (no RecursionError) and builds slotted dataclasses without validation: it
    raises only MemoryError, so (b) is not reproduced per span; the resource conversion is redone
    here (once per resource, cheap) to mirror it exactly. The :data:`REPORTED_FLAGS` repairs of
    each accepted span are recomputed by :func:`_report_pb` (the last copy of a duplicate counts).
    """
    rejected = 0
    errors: list[str] = []
    reasons: collections.Counter = collections.Counter()
    keys: dict[bytes, tuple[frozenset[str], int]] = {}
    clean = (_EMPTY_FLAGS, 0)
    max_n, max_e = lim.max_attributes, lim.max_events
    slow_all = lim.max_attribute_length is not None  # every value must be looked at
    for ri, rs in enumerate(req.resource_spans):
        rfl: set[str] = set()
        try:
            _attrs_pb(rs.resource.attributes, _RESOURCE_LIMITS, rfl)
        except Exception as exc:  # noqa: BLE001 - as _walk_pb
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            where, reason = f"resource {ri}", f"internal: {type(exc).__name__}"
            if n <= 0:
                errors.append(f"{where}: {reason}")
            else:
                rejected += n
                reasons["internal"] += n
                errors.extend(f"{where} span {i}: {reason}" for i in range(n))
            continue
        if bad is not None and ri in bad.resources:
            rfl.add("invalid_utf8")
        for si, ss in enumerate(rs.scope_spans):
            sfl = rfl
            if bad is not None and (ri, si) in bad.scopes:
                sfl = rfl | {"invalid_utf8"}
            for pi, sp in enumerate(ss.spans):
                tid = sp.trace_id
                sid = sp.span_id
                if len(tid) == 16 and len(sid) == 8 and tid != _Z16 and sid != _Z8:
                    # fast path: nothing in this span can have been altered (the common case)
                    if (not sfl and not slow_all and (bad is None or (ri, si, pi) not in bad.spans)
                            and len(sp.attributes) <= max_n):
                        evs = sp.events
                        ok = True
                        if evs:
                            if len(evs) > max_e:
                                ok = False
                            else:
                                for e in evs:
                                    if len(e.attributes) > max_n:
                                        ok = False
                                        break
                        if ok:
                            keys[tid + sid] = clean
                            continue
                    fl = set(sfl)
                    if bad is not None and (ri, si, pi) in bad.spans:
                        fl.add("invalid_utf8")
                    keys[tid + sid] = _report_pb(sp, lim, fl)
                    continue
                try:
                    _pb_id(tid, 16, _Z16, "traceId")
                    _pb_id(sid, 8, _Z8, "spanId")
                except _Rejected as rej:
                    rejected += 1
                    errors.append(f"span {pi} (scope {si}) of resource {ri}: {rej.args[0]}")
                    reasons[rej.code] += 1
    if rejected and not keys:
        _other_signal_pb(req)
    repaired: collections.Counter = collections.Counter()
    dropped = 0
    for fl, n in keys.values():
        if fl:
            repaired.update(fl)
            dropped += n
    return Validation(len(keys), rejected, tuple(errors), reasons, None, repaired, dropped)


def _report_pb(sp: Any, lim: Limits, fl: set) -> tuple[frozenset[str], int]:
    """The :data:`PB_REPORTED_FLAGS` flags ``_span_pb`` would set on ``sp`` (``fl``: flags it
    starts from) and the attributes its count limit drops, without converting any value."""
    drops = [0]
    _scan_attrs_pb(sp.attributes, lim, fl, drops)
    if sp.events:
        evs = sp.events
        if len(evs) > lim.max_events:
            fl.add("dropped_events")
            evs = evs[: lim.max_events]
        for e in evs:
            _scan_attrs_pb(e.attributes, lim, fl, drops)
    if not fl:
        return _EMPTY_FLAGS, drops[0]
    return frozenset(f for f in fl if f in PB_REPORTED_FLAGS), drops[0]


def _scan_attrs_pb(kvs: Any, lim: Limits, fl: set, drops: list) -> None:
    """The :data:`PB_REPORTED_FLAGS` flags of ``_attrs_pb(kvs, lim, fl, drops)`` (and the drop
    count), reading no more than it must: values only under a length limit."""
    if not kvs:
        return
    max_len = lim.max_attribute_length
    if max_len is not None:  # with no length limit no value can be altered: nothing to read
        for kv in kvs:
            v = kv.value
            x = v.string_value
            if x:
                if len(x) > max_len and not never_truncate(kv.key):
                    fl.add("truncated_attribute")
                continue
            if not v.int_value:
                _scan_any_pb(v, None if never_truncate(kv.key) else max_len, fl, 0)
    if len(kvs) > lim.max_attributes:
        seen = dict.fromkeys(kv.key for kv in kvs)
        kept = _keep(seen, lim.max_attributes)
        if kept is not None:
            fl.add("dropped_attributes")
            drops[0] += len(seen) - len(kept)


def _scan_any_pb(v: Any, max_len: int | None, fl: set, depth: int) -> None:
    """Flags of ``_any_pb(v, max_len, fl, depth)`` (same order of checks)."""
    w = v.WhichOneof("value")
    if w == "string_value":
        if max_len is not None and len(v.string_value) > max_len:
            fl.add("truncated_attribute")
        return
    if w in _SCALAR_ONEOFS or w is None:
        return
    if depth >= _MAX_DEPTH:
        if max_len is not None and len(_deep_text_pb(v)) > max_len:
            fl.add("truncated_attribute")
        return
    if w == "array_value":
        for x in v.array_value.values:
            _scan_any_pb(x, max_len, fl, depth + 1)
        return
    if w == "kvlist_value":
        for kv in v.kvlist_value.values:
            _scan_any_pb(kv.value, max_len, fl, depth + 1)
        return
    if w == "bytes_value":
        return
    fl.add("invalid_attribute_value")  # unreachable with a known schema, as in _any_pb


# --- lenient protobuf: the same schema with every `string` field typed `bytes` ----------------
# upb validates UTF-8 in proto3 string fields and fails the whole parse on one bad byte
# (C08). The wire format of `string` and `bytes` is identical, so a copy of the schema with
# bytes fields parses anything; we repair the strings (U+FFFD) and re-parse strictly.


def _build_lenient() -> tuple[Any, frozenset[str]]:
    pool = descriptor_pool.DescriptorPool()
    string_fields: set[str] = set()

    def fix(msg: descriptor_pb2.DescriptorProto, prefix: str) -> None:
        for f in msg.field:
            if f.type == FieldDescriptor.TYPE_STRING:
                f.type = FieldDescriptor.TYPE_BYTES
                string_fields.add(f"{prefix}.{msg.name}.{f.name}")
        for nested in msg.nested_type:
            fix(nested, f"{prefix}.{msg.name}")

    for mod in (common_pb2, resource_pb2, trace_pb2, trace_service_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fdp)
        for m in fdp.message_type:
            fix(m, fdp.package)
        pool.Add(fdp)
    desc = pool.FindMessageTypeByName(ExportTraceServiceRequest.DESCRIPTOR.full_name)
    return message_factory.GetMessageClass(desc), frozenset(string_fields)


_LenientRequest, _LENIENT_STRING_FIELDS = _build_lenient()


@dataclass
class _BadUtf8:
    resources: set[int] = field(default_factory=set)
    scopes: set[tuple[int, int]] = field(default_factory=set)
    spans: set[tuple[int, int, int]] = field(default_factory=set)


def _repair_lenient(msg: Any) -> bool:
    """Replace invalid UTF-8 in every former string field in place; True if any was found."""
    bad = False
    for fd, value in msg.ListFields():
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if fd.is_repeated else (value,)
            if fd.message_type.GetOptions().map_entry:  # no maps in OTLP traces; be safe
                continue
            for item in items:
                bad |= _repair_lenient(item)
        elif fd.full_name in _LENIENT_STRING_FIELDS:
            if fd.is_repeated:
                for i, b in enumerate(value):
                    fixed = _fix_bytes(b)
                    if fixed is not None:
                        value[i] = fixed
                        bad = True
            else:
                fixed = _fix_bytes(value)
                if fixed is not None:
                    setattr(msg, fd.name, fixed)
                    bad = True
    return bad


def _fix_bytes(b: bytes) -> bytes | None:
    try:
        b.decode("utf-8")
        return None
    except UnicodeDecodeError:
        return b.decode("utf-8", "replace").encode("utf-8")


def _parse_pb(body: bytes) -> tuple[Any, _BadUtf8 | None]:
    """Parse protobuf bytes strictly, falling back to the lenient schema on invalid UTF-8."""
    try:
        return ExportTraceServiceRequest.FromString(body), None
    except Exception as strict_exc:  # noqa: BLE001 - upb raises DecodeError; anything else is 400 too
        try:
            lenient = _LenientRequest.FromString(body)
        except Exception:  # noqa: BLE001
            raise OTLPRequestError(f"cannot decode protobuf body: {strict_exc}") from None
    return _from_lenient(lenient)


def _from_lenient(lenient: Any) -> tuple[Any, _BadUtf8]:
    bad = _BadUtf8()
    for ri, rs in enumerate(lenient.resource_spans):
        if rs.HasField("resource") and _repair_lenient(rs.resource):
            bad.resources.add(ri)
        for si, ss in enumerate(rs.scope_spans):
            if ss.HasField("scope") and _repair_lenient(ss.scope):
                bad.scopes.add((ri, si))
            for pi, sp in enumerate(ss.spans):
                if _repair_lenient(sp):
                    bad.spans.add((ri, si, pi))
        # schema_url fields of resource/scope spans are not read; repair them so the strict parse works
        _repair_lenient(rs)
    try:
        strict = ExportTraceServiceRequest.FromString(lenient.SerializeToString())
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"cannot decode protobuf body: {exc}") from None
    return strict, bad


class _Undecodable:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def deserialize_request(data: bytes) -> Any:
    """A gRPC ``request_deserializer`` that never raises.

    Returns an ``ExportTraceServiceRequest`` (invalid UTF-8 is kept and repaired later by
    :func:`decode_request`), or a marker object for which :func:`decode_request` raises
    ``OTLPRequestError`` (INVALID_ARGUMENT). grpcio turns an exception in a deserializer into an
    INTERNAL status, which OTLP clients may retry forever; this avoids it.
    """
    try:
        return ExportTraceServiceRequest.FromString(data)
    except Exception:  # noqa: BLE001
        try:
            return _LenientRequest.FromString(data)
        except Exception as exc:  # noqa: BLE001
            return _Undecodable(f"cannot decode protobuf body: {exc}")


def decode_request(req: Any, limits: Limits = _DEFAULT_LIMITS) -> DecodeResult:
    """Decode an already parsed ``ExportTraceServiceRequest`` (the gRPC path).

    Args:
        req: an ``ExportTraceServiceRequest``, or whatever :func:`deserialize_request` returned.
        limits: attribute / event limits (``max_body_bytes`` is the gRPC server's job here).

    Returns:
        DecodeResult. Raises OTLPRequestError only for a :func:`deserialize_request` failure marker.
    """
    try:
        if isinstance(req, _Undecodable):
            raise OTLPRequestError(req.reason)
        bad = None
        if isinstance(req, _LenientRequest):
            req, bad = _from_lenient(req)
        return _walk_pb(req, limits, bad)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None


# --------------------------------------------------------------------------------------------------
# JSON path
# --------------------------------------------------------------------------------------------------

_KIND_NAMES = {
    "SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5,
}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}

# AnyValue member name (camelCase or snake_case) -> kind
_ANY_KEYS = {
    "stringValue": "s", "string_value": "s",
    "boolValue": "b", "bool_value": "b",
    "intValue": "i", "int_value": "i",
    "doubleValue": "d", "double_value": "d",
    "arrayValue": "a", "array_value": "a",
    "kvlistValue": "k", "kvlist_value": "k",
    "bytesValue": "y", "bytes_value": "y",
}


class _JCtx:
    """Per-request JSON walk state: limits and the warnings counter."""

    __slots__ = ("lim", "warn")

    def __init__(self, lim: Limits, warn: collections.Counter):
        self.lim = lim
        self.warn = warn

    def get(self, d: dict, camel: str, snake: str) -> Any:
        v = d.get(camel)
        if v is None and snake in d:
            v = d[snake]
            if v is not None:
                self.warn["snake_case_keys"] += 1
        return v


def _int64(v: Any) -> int | None:
    """A JSON int64/uint64 (number or decimal string) as int, or None if not one."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        s = v.strip()
        if s[:1] == "-":
            return -int(s[1:]) if s[1:].isdigit() and s[1:].isascii() else None
        return int(s) if s.isdigit() and s.isascii() else None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _any_json(v: Any, cx: _JCtx, fl: set, depth: int, max_len: int | None) -> Any:
    if not isinstance(v, dict):
        fl.add("invalid_attribute_value")
        return None
    for k, x in v.items():
        t = _ANY_KEYS.get(k)
        if t is None or x is None:
            continue
        if "_" in k:
            cx.warn["snake_case_keys"] += 1
        if t == "s":
            if isinstance(x, str):
                return _truncate(x, max_len, fl)
        elif t == "i":
            n = _int64(x)
            if n is not None and -(1 << 63) <= n < (1 << 63):
                return n
        elif t == "d":
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                return float(x)
            if isinstance(x, str):
                try:
                    return float(x)  # "NaN", "Infinity", "-Infinity" per proto3 JSON
                except ValueError:
                    pass
        elif t == "b":
            if isinstance(x, bool):
                return x
        elif t == "y":
            if isinstance(x, str):
                b = _b64(x)
                if b is not None:
                    return b
        elif depth >= _MAX_DEPTH:
            fl.add("attribute_too_deep")  # kept as its OTLP/JSON text: nothing is dropped
            return _truncate(_json.dumps({k: x}, ensure_ascii=False), max_len, fl)
        elif isinstance(x, dict):
            vals = x.get("values", ())
            if isinstance(vals, list):
                if t == "a":
                    return [_any_json(e, cx, fl, depth + 1, max_len) for e in vals]
                return _attrs_json(vals, cx, fl, _KVLIST_NOLIMIT, depth + 1, max_len)
        fl.add("invalid_attribute_value")
        return None
    fl.add("empty_attribute")
    return None


_KVLIST_NOLIMIT = 1 << 30


_INHERIT: Any = object()


def _attrs_json(kvs: Any, cx: _JCtx, fl: set, max_n: int, depth: int = 0, max_len: Any = _INHERIT,
                drops: list | None = None) -> dict[str, Any]:
    """OTLP/JSON KeyValue list -> dict. ``max_len``: the string length limit for every value
    (nested kvlists inherit their key's); by default the limits' own, waived for the keys of
    :func:`never_truncate`. Over ``max_n`` keys: :func:`_cap`."""
    out: dict[str, Any] = {}
    if not kvs:
        return out
    if not isinstance(kvs, list):
        fl.add("invalid_attribute")
        return out
    per_key = max_len is _INHERIT
    lim_len = cx.lim.max_attribute_length if per_key else max_len
    for kv in kvs:
        if not isinstance(kv, dict):
            fl.add("invalid_attribute")
            continue
        key = kv.get("key")
        if not isinstance(key, str):
            fl.add("invalid_attribute")
            continue
        ml = lim_len
        if per_key and ml is not None and never_truncate(key):
            ml = None
        v = kv.get("value")
        if v is None:
            fl.add("empty_attribute")
            out[key] = None
            continue
        # fast path: the common one-member stringValue / intValue objects
        if isinstance(v, dict) and len(v) == 1:
            x = v.get("stringValue")
            if type(x) is str:
                if ml is not None and len(x) > ml:
                    fl.add("truncated_attribute")
                    x = x[:ml]
                out[key] = x
                continue
            x = v.get("intValue")
            if type(x) is str and len(x) < 19 and x.isdigit() and x.isascii():
                out[key] = int(x)  # < 10**18 fits int64
                continue
        out[key] = _any_json(v, cx, fl, depth, ml)
    if len(out) > max_n:
        return _cap(out, max_n, fl, drops)
    return out


def _b64(s: str) -> bytes | None:
    """Standard or URL-safe base64, padding optional; None if not base64."""
    if len(s) % 4:
        s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        try:
            return base64.b64decode(s, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None


def _json_id(v: Any, n: int, name: str, cx: _JCtx | None) -> str:
    """Hex id from OTLP/JSON (hex any case, or base64); raises _Rejected."""
    code = _CODE[name]
    if v is None or v == "":
        raise _Rejected(f"{name} missing", f"{code}_missing")
    if not isinstance(v, str):
        raise _Rejected(f"{name} is not a string", f"{code}_invalid")
    raw = None
    if len(v) == 2 * n:
        try:
            raw = bytes.fromhex(v)
        except ValueError:
            raw = None
        if raw is not None and len(raw) == n:
            h = raw.hex()
            if h != v and cx is not None:
                cx.warn["uppercase_hex"] += 1
            if raw == bytes(n):
                raise _Rejected(f"{name} is all zeros", f"{code}_zero")
            return h
        raw = None
    if raw is None and len(v) in (4 * ((n + 2) // 3), math.ceil(n * 4 / 3)):
        raw = _b64(v)
        if raw is not None and len(raw) == n:
            if cx is not None:
                cx.warn["base64_id"] += 1
            if raw == bytes(n):
                raise _Rejected(f"{name} is all zeros", f"{code}_zero")
            return raw.hex()
    raise _Rejected(f"{name} invalid (expected {2 * n} hex chars or base64 of {n} bytes)",
                    f"{code}_invalid")


def _json_time(v: Any, fl: set) -> int:
    if v is None:
        return 0
    t = _int64(v)
    if t is None or not 0 <= t < _U64:
        fl.add("invalid_time")
        return 0
    return t


def _json_enum(v: Any, names: dict[str, int], hi: int, cx: _JCtx, fl: set, bad_flag: str) -> int:
    if v is None:
        return 0
    if type(v) is int:
        if 0 <= v <= hi:
            return v
    elif isinstance(v, str):
        if v in names:
            cx.warn["enum_name"] += 1
            return names[v]
        n = _int64(v)
        if n is not None and 0 <= n <= hi:
            return n
    fl.add(bad_flag)
    return 0


def _str(v: Any, fl: set) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    fl.add("invalid_field_type")
    return ""


def _span_json(sp: Any, resource: dict, scope_name: str, scope_version: str, cx: _JCtx,
               extra: frozenset[str], slow: bool) -> CanonicalSpan:
    if not isinstance(sp, dict):
        raise _Rejected("span is not a JSON object", "malformed")
    fl: set[str] = set(extra) if extra else set()
    if slow:
        sp, bad = _deep_clean(sp)
        if bad:
            fl.add("invalid_utf8")
    g = cx.get
    tid = _json_id(g(sp, "traceId", "trace_id"), 16, "traceId", cx)
    sid = _json_id(g(sp, "spanId", "span_id"), 8, "spanId", cx)
    pv = g(sp, "parentSpanId", "parent_span_id")
    parent = ""
    if pv is not None and pv != "":
        try:
            parent = _json_id(pv, 8, "spanId", cx)
        except _Rejected:
            fl.add("invalid_parent_span_id")
    kind = _json_enum(sp.get("kind"), _KIND_NAMES, 5, cx, fl, "invalid_kind")
    if kind == 0 and "invalid_kind" not in fl:
        fl.add("missing_kind")
    start, end, raw_end = _times(_json_time(g(sp, "startTimeUnixNano", "start_time_unix_nano"), fl),
                                 _json_time(g(sp, "endTimeUnixNano", "end_time_unix_nano"), fl), fl)
    st = sp.get("status")
    code, smsg = 0, ""
    if st is not None:
        if isinstance(st, dict):
            code = _json_enum(st.get("code"), _STATUS_NAMES, 2, cx, fl, "invalid_status")
            smsg = _str(st.get("message"), fl)
        else:
            fl.add("invalid_status")
    lim = cx.lim
    drops = [0]
    attrs = _attrs_json(sp.get("attributes"), cx, fl, lim.max_attributes, drops=drops)
    events: tuple[SpanEvent, ...] = ()
    evs = sp.get("events")
    if evs:
        if not isinstance(evs, list):
            fl.add("invalid_events")
        else:
            if len(evs) > lim.max_events:
                fl.add("dropped_events")
                evs = evs[: lim.max_events]
            out = []
            for e in evs:
                if not isinstance(e, dict):
                    fl.add("invalid_events")
                    continue
                out.append(SpanEvent(_str(e.get("name"), fl),
                                     _event_time(_json_time(g(e, "timeUnixNano", "time_unix_nano"), fl), fl),
                                     _attrs_json(e.get("attributes"), cx, fl, lim.max_attributes,
                                                 drops=drops)))
            events = tuple(out)
    links: tuple[tuple[str, str], ...] = ()
    lks = sp.get("links")
    if lks:
        out_l = []
        for link in lks if isinstance(lks, list) else ():
            try:
                out_l.append((_json_id(g(link, "traceId", "trace_id"), 16, "traceId", cx),
                              _json_id(g(link, "spanId", "span_id"), 8, "spanId", cx)))
            except (_Rejected, AttributeError):
                fl.add("invalid_link")
        if not isinstance(lks, list):
            fl.add("invalid_link")
        links = tuple(out_l)
    return CanonicalSpan(tid, sid, parent, _str(sp.get("name"), fl), kind, start, end, code, smsg,
                         attrs, resource, scope_name, scope_version, events, links,
                         _str(g(sp, "traceState", "trace_state"), fl),
                         frozenset(fl) if fl else _EMPTY_FLAGS, raw_end, drops[0])


def _repair_str(s: str) -> tuple[str, bool]:
    if _SURR.search(s) is None:
        return s, False

    def run(m: re.Match) -> str:
        chunk = m.group()
        try:  # bytes of an invalid sequence that came in the body (surrogateescape) -> U+FFFD
            return chunk.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # lone surrogates from "\ud800" escapes
            return "\ufffd" * len(chunk)

    return _SURR.sub(run, s), True


def _deep_clean(obj: Any) -> tuple[Any, bool]:
    """Copy of a json.loads value with lone surrogates replaced by U+FFFD; True if any was."""
    if isinstance(obj, str):
        return _repair_str(obj)
    if isinstance(obj, list):
        bad = False
        out = []
        for x in obj:
            y, b = _deep_clean(x)
            bad |= b
            out.append(y)
        return out, bad
    if isinstance(obj, dict):
        bad = False
        d = {}
        for k, x in obj.items():
            k2, b1 = _repair_str(k) if isinstance(k, str) else (k, False)
            y, b2 = _deep_clean(x)
            bad |= b1 | b2
            d[k2] = y
        return d, bad
    return obj, False


def _body_text(body: bytes | str) -> tuple[str, bool]:
    """Body as text and whether a repair pass is needed (invalid UTF-8 or surrogate escapes)."""
    if isinstance(body, str):
        text = body
        slow = not text.isascii() and _SURR.search(text) is not None
    else:
        try:
            text = body.decode("utf-8")
            slow = False
        except UnicodeDecodeError:
            text = body.decode("utf-8", "surrogateescape")
            slow = True
    if text[:1] == "\ufeff":
        text = text[1:]
    if not slow and ("\\ud" in text or "\\uD" in text):
        slow = True
    return text, slow


def _walk_json(doc: Any, cx: _JCtx, slow: bool) -> DecodeResult:
    batch = _Batch()
    batch.result.warnings = cx.warn
    if not isinstance(doc, dict):
        raise OTLPRequestError("OTLP/JSON body must be a JSON object")
    rss = cx.get(doc, "resourceSpans", "resource_spans")
    if rss is None:
        _no_spans(doc)
        return batch.finish()
    if not isinstance(rss, list):
        raise OTLPRequestError("resourceSpans must be a JSON array")
    g = cx.get
    for ri, rs in enumerate(rss):
        where_r = f"resource {ri}"
        try:
            if not isinstance(rs, dict):
                batch.reject_many(0, where_r, "not a JSON object", "malformed")
                continue
            rfl: set[str] = set()
            res = rs.get("resource")
            resource: dict[str, Any] = {}
            if res is not None:
                if slow:
                    res, bad = _deep_clean(res)
                    if bad:
                        rfl.add("invalid_utf8")
                if isinstance(res, dict):
                    # not subject to the span limits (as protobuf: _RESOURCE_LIMITS)
                    resource = _attrs_json(res.get("attributes"), cx, rfl, _KVLIST_NOLIMIT, max_len=None)
                else:
                    rfl.add("invalid_resource")
            sss = g(rs, "scopeSpans", "scope_spans")
            if sss is None:
                continue
            if not isinstance(sss, list):
                batch.reject_many(0, where_r, "scopeSpans is not a JSON array", "malformed")
                continue
        except Exception as exc:  # noqa: BLE001
            batch.reject_many(0, where_r, f"internal: {type(exc).__name__}", "internal")
            continue
        for si, ss in enumerate(sss):
            try:
                if not isinstance(ss, dict):
                    batch.reject_many(0, f"scope {si} of {where_r}", "not a JSON object",
                                      "malformed")
                    continue
                sfl = set(rfl)
                scope = ss.get("scope")
                sname = sversion = ""
                if scope is not None:
                    if slow:
                        scope, bad = _deep_clean(scope)
                        if bad:
                            sfl.add("invalid_utf8")
                    if isinstance(scope, dict):
                        sname = _str(scope.get("name"), sfl)
                        sversion = _str(scope.get("version"), sfl)
                    else:
                        sfl.add("invalid_scope")
                spans = ss.get("spans")
                if spans is None:
                    continue
                if not isinstance(spans, list):
                    batch.reject_many(0, f"scope {si} of {where_r}", "spans is not a JSON array",
                                      "malformed")
                    continue
                base = frozenset(sfl) if sfl else _EMPTY_FLAGS
            except Exception as exc:  # noqa: BLE001
                batch.reject_many(0, f"scope {si} of {where_r}", f"internal: {type(exc).__name__}",
                                  "internal")
                continue
            for pi, sp in enumerate(spans):
                try:
                    batch.add(_span_json(sp, resource, sname, sversion, cx, base, slow))
                except _Rejected as rej:
                    batch.reject(f"span {pi} (scope {si}) of {where_r}", rej.args[0], rej.code)
                except Exception as exc:  # noqa: BLE001
                    _internal(f"span {pi} (scope {si}) of {where_r}", exc, batch)
    return batch.finish()


_OTHER_SIGNALS = {"resourceLogs": "logs", "resource_logs": "logs", "resourceMetrics": "metrics",
                  "resource_metrics": "metrics", "resourceProfiles": "profiles",
                  "resource_profiles": "profiles"}


def _no_spans(doc: dict) -> None:
    """A JSON object without ``resourceSpans``: ``{}`` is an empty (valid) request; anything else
    holds nothing this endpoint reads and is refused (400), naming what it looks like."""
    if not doc:
        return
    for k in doc:
        sig = _OTHER_SIGNALS.get(k)
        if sig:
            raise OTLPRequestError(
                f"this is an OTLP {sig} request ({k}), not traces: send it to /v1/{sig}")
    keys = ", ".join(sorted(str(k) for k in doc)[:5])
    raise OTLPRequestError(f"no resourceSpans in the OTLP/JSON traces request (keys: {keys})")


def _other_signal_pb(req: Any) -> None:
    """Called when no span of a protobuf request was accepted and some were rejected: when the
    first of them holds fields no ``Span`` has, the body is another message (an OTLP metrics
    request parses as spans with a metric name for a trace id): refused (400)."""
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                if len(UnknownFieldSet(sp)):
                    raise OTLPRequestError(
                        "not an OTLP traces request: its spans hold fields no Span has (OTLP "
                        "metrics or logs? send those to /v1/metrics, /v1/logs)")
                return


def decode_json(body: bytes | str, limits: Limits = _DEFAULT_LIMITS) -> DecodeResult:
    """Decode an OTLP/JSON ``ExportTraceServiceRequest`` (already decompressed).

    Invalid UTF-8 bytes and lone-surrogate escapes inside strings are replaced by U+FFFD (flag
    ``invalid_utf8`` on the spans they touch); 64-bit integers keep full precision.

    Raises:
        OTLPRequestError: 400 if the body is not JSON or not an object with a ``resourceSpans``
            array; 413 if it is longer than ``limits.max_body_bytes``.
    """
    try:
        if len(body) > limits.max_body_bytes:
            raise _too_large(limits)
        text, slow = _body_text(body)
        try:
            doc = _json.loads(text, strict=False)
        except (ValueError, RecursionError) as exc:
            raise OTLPRequestError(f"cannot decode JSON body: {exc}") from None
        return _walk_json(doc, _JCtx(limits, collections.Counter()), slow)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None


# --------------------------------------------------------------------------------------------------
# HTTP edge: content type, content encoding, size limits
# --------------------------------------------------------------------------------------------------

_PROTOBUF_TYPES = frozenset(("application/x-protobuf", "application/protobuf"))
_JSON_TYPES = frozenset(("application/json",))
_CHUNK = 64 << 10


def _too_large(limits: Limits, what: str = "body") -> OTLPRequestError:
    return OTLPRequestError(
        f"{what} exceeds the limit of {limits.max_body_bytes} bytes", 413, "INVALID_ARGUMENT")


def _inflate(data: bytes, wbits: int, cap: int, limits: Limits, name: str) -> bytes:
    """zlib-family decompression that never produces more than ``cap`` bytes (413 beyond)."""
    out = bytearray()
    rest = data
    try:
        while True:
            d = zlib.decompressobj(wbits)
            buf = rest
            while not d.eof:
                chunk = d.decompress(buf, cap + 1 - len(out))
                out += chunk
                if len(out) > cap:
                    raise _too_large(limits, "decompressed body")
                tail = d.unconsumed_tail
                if not tail and not d.eof:  # all input consumed: drain, then it must have ended
                    out += d.flush()
                    if len(out) > cap:
                        raise _too_large(limits, "decompressed body")
                    if not d.eof:
                        raise OTLPRequestError(f"{name} body is truncated")
                elif not chunk and len(tail) == len(buf):
                    raise OTLPRequestError(f"bad {name} data: no progress")
                buf = tail
            rest = d.unused_data
            # only gzip has multi-member streams; trailing zero padding is tolerated like gzip(1)
            if wbits != 31 or not rest.strip(b"\x00"):
                break
    except zlib.error as exc:
        raise OTLPRequestError(f"bad {name} data: {exc}") from None
    return bytes(out)


def _unzstd(data: bytes, cap: int, limits: Limits) -> bytes:
    """zstd decompression, multi-frame, holding at most about ``cap`` + 128 KiB of output.

    One zstd block (at most 128 KiB of output) can be as small as 4 input bytes (an RLE block),
    so input is fed in slices of (remaining budget / 32 768) bytes: one slice can never expand
    past the cap by more than one block before the cap is checked.
    """
    import zstandard  # the sidecar extra installs it

    out = bytearray()
    dctx = zstandard.ZstdDecompressor()
    rest = data
    try:
        while rest:
            d = dctx.decompressobj()
            pos = 0
            while pos < len(rest) and not d.eof:
                step = max(8, (cap + 1 - len(out)) >> 15)
                out += d.decompress(rest[pos:pos + step])
                pos += step
                if len(out) > cap:
                    raise _too_large(limits, "decompressed body")
            if not d.eof:
                raise OTLPRequestError("zstd body is truncated")
            rest = d.unused_data + rest[pos:]
    except zstandard.ZstdError as exc:
        raise OTLPRequestError(f"bad zstd data: {exc}") from None
    return bytes(out)


def _decompress(body: bytes, encoding: str | None, limits: Limits) -> bytes:
    if not encoding:
        return body
    codings = [c.strip().lower() for c in encoding.split(",")]
    cap = limits.max_body_bytes
    for c in reversed(codings):  # applied in the order listed, so undone in reverse
        if c in ("", "identity"):
            continue
        if c in ("gzip", "x-gzip"):
            body = _inflate(body, 31, cap, limits, "gzip")
        elif c == "deflate":
            zlib_header = len(body) >= 2 and (body[0] & 0x0F) == 8 and (
                (body[0] << 8) | body[1]) % 31 == 0
            body = _inflate(body, 15 if zlib_header else -15, cap, limits, "deflate")
        elif c == "zstd":
            body = _unzstd(body, cap, limits)
        else:
            raise OTLPRequestError(f"unsupported Content-Encoding {c!r}", 415, "INVALID_ARGUMENT")
    return body


def decode_http(body: bytes, content_type: str | None, content_encoding: str | None,
                limits: Limits = _DEFAULT_LIMITS) -> DecodeResult:
    """Decode the body of ``POST /v1/traces``.

    Args:
        body: the request body as received (possibly compressed).
        content_type: the Content-Type header; parameters are ignored.
        content_encoding: the Content-Encoding header (gzip, deflate, zstd, identity or None).
        limits: size and attribute limits.

    Returns:
        DecodeResult (reply 200 with :func:`encode_response`, partial success if ``rejected``).

    Raises:
        OTLPRequestError: 415 unknown content type / encoding; 413 body or decompressed body over
            ``limits.max_body_bytes`` (message names the limit in bytes); 400 bad compressed data
            or undecodable protobuf / JSON. Never anything else.
    """
    try:
        is_json = _is_json_type(content_type)
        if len(body) > limits.max_body_bytes:
            raise _too_large(limits)
        body = _decompress(bytes(body), content_encoding, limits)
        if is_json:
            return decode_json(body, limits)
        req, bad = _parse_pb(body)
        return _walk_pb(req, limits, bad)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None


def validate_http(body: bytes, content_type: str | None, content_encoding: str | None,
                  limits: Limits = _DEFAULT_LIMITS) -> Validation:
    """What :func:`decode_http` would answer for this body, without building the spans.

    Enough to acknowledge a request (OTLP partial success) once its bytes are durable; the spans
    themselves can be decoded later from the same bytes. Protobuf: the upb parse (with the same
    lenient fallback for invalid UTF-8) plus an id check per span, about 10x cheaper than
    :func:`decode_http` (bench/bench_ingest.py). OTLP/JSON: a span's reject reason can come from
    anywhere in its walk (``malformed``, ``internal``), so this runs :func:`decode_json` and
    returns its result in ``Validation.decoded``.

    Args / raises: as :func:`decode_http` (``limits.max_body_bytes`` applies; the attribute and
    event limits never change what is rejected).

    Returns:
        Validation, equal to the reply fields of ``decode_http(body, content_type,
        content_encoding, limits)``.
    """
    try:
        is_json = _is_json_type(content_type)
        if len(body) > limits.max_body_bytes:
            raise _too_large(limits)
        body = _decompress(bytes(body), content_encoding, limits)
        if is_json:
            return Validation.of(decode_json(body, limits))
        req, bad = _parse_pb(body)
        return _validate_pb(req, limits, bad)
    except OTLPRequestError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"internal: {type(exc).__name__}", 500, "INTERNAL") from None


def _is_json_type(content_type: str | None) -> bool:
    """True for OTLP/JSON, False for protobuf; OTLPRequestError 415 for anything else."""
    ct = (content_type or "").split(";", 1)[0].strip().lower()
    if ct in _PROTOBUF_TYPES:
        return False
    if ct in _JSON_TYPES:
        return True
    raise OTLPRequestError(
        f"unsupported Content-Type {content_type!r} (use application/x-protobuf or "
        "application/json)", 415, "INVALID_ARGUMENT")


# --------------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------------


def _valid_text(s: str) -> str:
    return s.encode("utf-8", "replace").decode("utf-8")


def encode_response(result: DecodeResult | Validation, *, json: bool) -> bytes:
    """``ExportTraceServiceResponse`` body (protobuf, or OTLP/JSON when ``json``).

    ``partial_success`` {rejected_spans, error_message} is set when spans were rejected or
    request-level errors were noted; a clean result encodes as an empty message (``b""`` / ``{}``).
    """
    resp = ExportTraceServiceResponse()
    msg = result.error_message()
    if result.rejected > 0 or msg:
        resp.partial_success.rejected_spans = max(0, min(result.rejected, (1 << 63) - 1))
        resp.partial_success.error_message = _valid_text(msg)
    if json:
        return json_format.MessageToJson(resp, indent=None).encode("utf-8")
    return resp.SerializeToString()


def encode_status(code: int, message: str, *, json: bool) -> bytes:
    """``google.rpc.Status`` body for an HTTP 4xx/5xx reply (OTLP/HTTP spec).

    Args:
        code: a ``google.rpc.Code`` number (3 INVALID_ARGUMENT, see ``GRPC_CODE_NUMBERS``);
            values outside int32 become 2 (UNKNOWN).
        message: developer-facing text (invalid code points are replaced).
    """
    if not isinstance(code, int) or not -(1 << 31) <= code < (1 << 31):
        code = 2
    st = status_pb2.Status(code=code, message=_valid_text(str(message)))
    if json:
        return json_format.MessageToJson(st, indent=None).encode("utf-8")
    return st.SerializeToString()
