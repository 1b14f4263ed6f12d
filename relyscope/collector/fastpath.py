"""The worker's hot path: one spool record in, a batch ready to store and assemble out.

:func:`decode_record` is a pure function of (spool record, limits, redactor) — safe in any thread
or in a separate process (its result pickles) — returning a :class:`~relyscope.collector.otlp.
DecodeResult` that is *prepared* (:func:`prepare`):

- ``spans`` are redacted (:class:`~relyscope.collector.redaction.Redactor`, as the worker did before
  storing) and lean: attributes and events dropped (what :class:`~relyscope.trajectory.
  TrajectoryBuilder` keeps of a span anyway), ids, times, links, flags kept;
- ``semantics[i]`` is the meaning of ``spans[i]`` (:func:`~relyscope.collector.normalize.fast.
  normalize_fast`, equal to ``normalize`` of the redacted full span);
- ``columns`` holds the ``otel_traces`` rows of the redacted full spans as columns
  (:class:`~relyscope.store.clickhouse.SpanColumns`), written by ``Store.insert_span_columns`` as
  one Arrow block.

Equal to the oracle path (``decode_http`` → ``Redactor.apply`` → ``Store.insert_spans`` +
``normalize``): the same stored rows and the same assembled trials, partial-success counts,
repairs and warnings unchanged (the decode itself is :func:`~relyscope.collector.otlp.
decode_http`); ``tests/test_fastpath.py`` checks both paths on every test payload and bug case.
Selected by ``Settings.ingest_decoder`` (``fast``, the default, or ``legacy``).
"""

from __future__ import annotations

import collections
from typing import Any

from relyscope.collector.normalize.fast import normalize_fast
from relyscope.collector.otlp import DecodeResult, Limits, OTLPRequestError, decode_http
from relyscope.collector.redaction import Redactor
from relyscope.model import CanonicalSpan
from relyscope.store.clickhouse import SpanColumns

__all__ = ["decode_record", "prepare", "is_prepared", "TAG_JSON", "TAG_PROTO"]

TAG_PROTO = b"P"  # spool record tag: protobuf body follows
TAG_JSON = b"J"  # OTLP/JSON body follows

_EMPTY: dict[str, Any] = {}  # shared by every lean span (read-only; one object after unpickling)


def is_prepared(res: DecodeResult) -> bool:
    """Whether ``res`` went through :func:`prepare`."""
    return res.columns is not None


def decode_record(payload: bytes, limits: Limits, redactor: Redactor | None = None, *,
                  ahead: bool = False) -> DecodeResult:
    """Decode one spool record (tag byte ``P``/``J`` + decompressed OTLP body) and prepare it.
    The hot-path twin of :func:`relyscope.collector.records.decode_spool_record` (same contract:
    module-level and pure, ``functools.partial(decode_record, limits=..., redactor=...)`` pickles,
    so ``decode_workers`` processes run it). An unusable body (:class:`OTLPRequestError`, which
    ``accept`` refused already) decodes to an empty prepared result; never raises otherwise.
    ``ahead``: also assemble the traces whole in this record (``DecodeResult.ahead``; for decode
    processes, which take that work off the worker thread)."""
    ct = "application/json" if payload[:1] == TAG_JSON else "application/x-protobuf"
    try:
        res = decode_http(payload[1:], ct, None, limits)
    except OTLPRequestError:
        res = DecodeResult(spans=[], rejected=0, errors=[], warnings=collections.Counter())
    return prepare(res, redactor, ahead=ahead)


def prepare(res: DecodeResult, redactor: Redactor | None = None, *, ahead: bool = False) -> DecodeResult:
    """Redact, normalize and lay out as columns the spans of a full decode, in place; returns
    ``res``. Idempotent (a prepared result is returned unchanged)."""
    if res.columns is not None:
        return res
    spans = res.spans
    if redactor is not None and redactor.active:
        spans = [redactor.apply(s) for s in spans]
    cols = SpanColumns()
    cols.add_all(spans)
    res.semantics = [normalize_fast(s) for s in spans]
    res.spans = [_lean(s) for s in spans]
    res.columns = cols
    if ahead:
        from relyscope.trajectory.builder import assemble_ahead

        res.ahead = assemble_ahead(res.spans, res.semantics)
    return res


def _lean(s: CanonicalSpan) -> CanonicalSpan:
    if not s.attributes and not s.events:
        return s
    return CanonicalSpan(s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_ns, s.end_ns,
                         s.status_code, s.status_message, _EMPTY, s.resource, s.scope_name,
                         s.scope_version, (), s.links, s.trace_state, s.flags, s.raw_end_ns,
                         s.dropped_attributes)
