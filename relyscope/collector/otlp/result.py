"""Errors, limits and results of OTLP decoding: :class:`OTLPRequestError`, :class:`Limits`,
:class:`DecodeResult`, :class:`Validation` and the partial-success message they compose."""

from __future__ import annotations

import collections
import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any

from relyscope.model import CanonicalSpan, SpanSemantics

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
        from relyscope.collector.otlp.responses import encode_status  # (responses imports this module)

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
        ahead: None, or (prepared in a decode process) the trials of the traces whole in this
            batch, assembled there (:func:`relyscope.trajectory.builder.assemble_ahead`).
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
    ahead: dict | None = None

    def __reduce__(self):
        # a decode worker process sends prepared batches back: spans and semantics as plain tuples
        # (C-level attrgetter out, positional constructors in) unpickle ~2x faster than the
        # dataclasses' own pickling, which the receiving worker thread would pay per span
        return (_rebuild_result, (
            [_SPAN_GET(s) for s in self.spans],
            None if self.semantics is None else [_SEM_GET(x) for x in self.semantics],
            self.rejected, self.errors, self.warnings, self.rejected_by_reason, self.repaired,
            self.attributes_dropped, self.columns, self.ahead))

    def error_message(self) -> str:
        """Reasons joined by ``"; "`` (the first 10, then ``"… and N more"``), then the repairs
        made to accepted spans (:data:`REPORTED_FLAGS`, with counts); ``""`` if none."""
        return _compose(self.errors, self.repaired, self.attributes_dropped)


_SPAN_GET = operator.attrgetter(*(f.name for f in dataclasses.fields(CanonicalSpan)))
_SEM_GET = operator.attrgetter(*(f.name for f in dataclasses.fields(SpanSemantics)))


def _rebuild_result(spans, sems, rejected, errors, warnings, by_reason, repaired, dropped, columns, ahead=None):
    """Inverse of :meth:`DecodeResult.__reduce__`."""
    return DecodeResult([CanonicalSpan(*t) for t in spans], rejected, errors, warnings, by_reason, repaired,
                        dropped, None if sems is None else [SpanSemantics(*t) for t in sems], columns, ahead)


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
