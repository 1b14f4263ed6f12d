"""Helpers shared by the protobuf and OTLP/JSON decoders: rejection, truncation, time repair,
attribute caps, other-signal detection, the size-limit error."""

from __future__ import annotations

import re
from typing import Any

from google.protobuf.unknown_fields import UnknownFieldSet

from relyscope.collector.normalize.versions import attribute_rank
from relyscope.model import CanonicalSpan
from relyscope.collector.otlp.result import DecodeResult, Limits, OTLPRequestError, REPORTED_FLAGS

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


_CODE = {"traceId": "trace_id", "spanId": "span_id"}


# the top-level key of an OTLP/JSON request of each signal
_SIGNAL_KEYS = {"resourceSpans": "traces", "resource_spans": "traces", "resourceLogs": "logs",
                "resource_logs": "logs", "resourceMetrics": "metrics", "resource_metrics": "metrics",
                "resourceProfiles": "profiles", "resource_profiles": "profiles"}


def no_signal_json(doc: dict, what: str = "traces") -> None:
    """An OTLP/JSON ``what`` request (traces, logs, metrics) without its own top-level key: ``{}``
    is an empty (valid) request; anything else holds nothing that endpoint reads and is refused
    (400), naming the signal it is (traces posted to /v1/logs were answered 200 and dropped) or
    its keys. Returns when ``doc`` holds the key of ``what``."""
    if not doc or what in {_SIGNAL_KEYS.get(k) for k in doc}:
        return
    for k in doc:
        sig = _SIGNAL_KEYS.get(k)
        if sig:
            raise OTLPRequestError(f"this is an OTLP {sig} request ({k}), not {what}: send it to /v1/{sig}")
    keys = ", ".join(sorted(str(k) for k in doc)[:5])
    own = next(k for k, v in _SIGNAL_KEYS.items() if v == what)
    raise OTLPRequestError(f"no {own} in the OTLP/JSON {what} request (keys: {keys})")


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


def _too_large(limits: Limits, what: str = "body") -> OTLPRequestError:
    return OTLPRequestError(
        f"{what} exceeds the limit of {limits.max_body_bytes} bytes", 413, "INVALID_ARGUMENT")
