"""OTLP logs and metrics at the receiver edge (``/v1/logs``, ``/v1/metrics``, gRPC LogsService and
MetricsService): SDKs pointed at the sidecar with ``OTEL_EXPORTER_OTLP_ENDPOINT`` export all three
signals, and would otherwise retry ``UNIMPLEMENTED`` / 404 forever.

- **Logs.** The GenAI semantic conventions also send events as log records. A record with a
  trace id, a span id and a GenAI event name (``event_name``, else the ``event.name`` attribute;
  ``gen_ai.*``: ``gen_ai.evaluation.result``, ``gen_ai.client.inference.operation.details``, …)
  joins its span: it becomes a span of that trace, a child of that span, named after the event,
  holding one span event of that name with the record's attributes (its body under
  ``gen_ai.event.body``), scope ``relyscope.logs``. It then goes through the traces path
  (:meth:`relyscope.pipeline.Pipeline.accept`: spooled before the reply, stored, assembled), so a
  ``gen_ai.evaluation.result`` record grades the trial holding the span as the span event would.
  Its span id is derived from the record (SHA-256 of trace id, span id, event name, time, body
  and attributes), so a re-sent record is stored once. Every other record is acknowledged and
  counted, not stored.
- **Metrics.** Acknowledged and counted (data points per metric type), not stored: relyscope
  computes its reliability metrics from spans; the sidecar's own metrics are on ``/metrics``.

Counts: ``relyscope_otlp_log_records_total{kind=joined|other|invalid}`` and
``relyscope_otlp_metric_points_total{type}`` (:class:`SignalCounts`, one per pipeline).
"""

from __future__ import annotations

import base64
import hashlib
import json as _json
import threading
from typing import Any

from google.protobuf import json_format
from google.protobuf.unknown_fields import UnknownFieldSet
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.core import CounterMetricFamily

from relyscope.collector.otlp import OTLPRequestError
from relyscope.collector.otlp.common import no_signal_json

__all__ = ["SignalCounts", "counts_of", "decode_logs", "logs_to_traces", "decode_metrics",
           "count_metric_points", "logs_response", "metrics_response", "GENAI_EVENT_PREFIX"]

#: Log records whose event name starts with this join their span.
GENAI_EVENT_PREFIX = "gen_ai."
_EVENT_NAME_ATTR = "event.name"
_BODY_ATTR = "gen_ai.event.body"
_SCOPE = "relyscope.logs"
_Z16, _Z8 = bytes(16), bytes(8)


class SignalCounts:
    """Counters of the logs / metrics receivers, exported as Prometheus counter families.
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.log_records: dict[str, int] = {"joined": 0, "other": 0}
        self.metric_points: dict[str, int] = {}

    def add_logs(self, joined: int, other: int) -> None:
        with self._lock:
            self.log_records["joined"] += joined
            self.log_records["other"] += other

    def add_points(self, by_type: dict[str, int]) -> None:
        with self._lock:
            for k, v in by_type.items():
                self.metric_points[k] = self.metric_points.get(k, 0) + v

    def families(self):
        """Prometheus counter families (for a custom collector's ``collect``)."""
        with self._lock:
            logs, points = dict(self.log_records), dict(self.metric_points)
        fam = CounterMetricFamily("relyscope_otlp_log_records", "OTLP log records received, by kind "
                                  "(joined: a GenAI event joined to its span; other: acknowledged only)",
                                  labels=["kind"])
        for k, v in sorted(logs.items()):
            fam.add_metric([k], v)
        yield fam
        mfam = CounterMetricFamily("relyscope_otlp_metric_points", "OTLP metric data points received "
                                   "(acknowledged, not stored), by metric type", labels=["type"])
        for k, v in sorted(points.items()):
            mfam.add_metric([k], v)
        yield mfam


_COUNTS_LOCK = threading.Lock()


def counts_of(pipeline: Any) -> SignalCounts:
    """The :class:`SignalCounts` of a pipeline (created on first use, kept on the pipeline)."""
    with _COUNTS_LOCK:
        c = getattr(pipeline, "signal_counts", None)
        if c is None:
            c = SignalCounts()
            pipeline.signal_counts = c
        return c


def _hex_ids_to_b64(obj: Any, keys: tuple[str, ...]) -> None:
    """OTLP/JSON carries ids as hex where the proto3 JSON mapping of ``bytes`` expects base64."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in keys and isinstance(v, str) and v:
                try:
                    obj[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    pass  # already base64 (tolerated, as for traces)
            else:
                _hex_ids_to_b64(v, keys)
    elif isinstance(obj, list):
        for x in obj:
            _hex_ids_to_b64(x, keys)


# the path to the leaf messages of each protobuf request
_LEAVES = {"logs": ("resource_logs", "scope_logs", "log_records"),
           "metrics": ("resource_metrics", "scope_metrics", "metrics")}


def _parse(body: bytes, is_json: bool, msg_type: Any, id_keys: tuple[str, ...], what: str) -> Any:
    try:
        if is_json:
            doc = _json.loads(body)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        else:
            req = msg_type.FromString(body)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the client's: 400
        raise OTLPRequestError(f"cannot decode OTLP {what} body: {exc}") from None
    if not is_json:
        _foreign_pb(req, what)
        return req
    no_signal_json(doc, what)
    try:
        _hex_ids_to_b64(doc, id_keys)
        return json_format.ParseDict(doc, msg_type(), ignore_unknown_fields=True)
    except Exception as exc:  # noqa: BLE001
        raise OTLPRequestError(f"cannot decode OTLP {what} body: {exc}") from None


def _foreign_pb(req: Any, what: str) -> None:
    """A protobuf ``what`` request whose first leaf (log record, metric) holds an unknown field
    under the number of one of its own fields is another message (an OTLP traces request parses
    as log records: a span's trace id lands on ``time_unix_nano`` with the wrong wire type): 400.
    A newer schema adds field numbers but never retypes one, so real records never trip this."""
    top, mid, leaf = _LEAVES[what]
    for r in getattr(req, top):
        for m in getattr(r, mid):
            for x in getattr(m, leaf):
                known = x.DESCRIPTOR.fields_by_number
                if any(f.field_number in known for f in UnknownFieldSet(x)):
                    others = ", ".join(f"{o} to /v1/{o}" for o in ("traces", "logs", "metrics") if o != what)
                    raise OTLPRequestError(f"not an OTLP {what} request: its records hold fields of another "
                                           f"message (another signal? send {others})")
                return


def decode_logs(body: bytes, is_json: bool) -> ExportLogsServiceRequest:
    """Parse an (already decompressed) OTLP logs request. Raises OTLPRequestError (400)."""
    return _parse(body, is_json, ExportLogsServiceRequest, ("traceId", "spanId", "trace_id", "span_id"), "logs")


def decode_metrics(body: bytes, is_json: bool) -> ExportMetricsServiceRequest:
    """Parse an (already decompressed) OTLP metrics request. Raises OTLPRequestError (400)."""
    return _parse(body, is_json, ExportMetricsServiceRequest, ("traceId", "spanId", "trace_id", "span_id"),
                  "metrics")


def _event_name(rec: Any) -> str:
    if rec.event_name:
        return rec.event_name
    for kv in rec.attributes:
        if kv.key == _EVENT_NAME_ATTR and kv.value.WhichOneof("value") == "string_value":
            return kv.value.string_value
    return ""


def logs_to_traces(req: ExportLogsServiceRequest) -> tuple[ExportTraceServiceRequest | None, int, int]:
    """The spans GenAI event records become (see the module docstring), and the counts
    ``(joined, other)``. Returns ``(None, 0, other)`` when no record joins a span. Pure."""
    out = ExportTraceServiceRequest()
    joined = other = 0
    for rl in req.resource_logs:
        rs = None
        for sl in rl.scope_logs:
            ss = None
            for rec in sl.log_records:
                name = _event_name(rec)
                tid, sid = rec.trace_id, rec.span_id
                if not (name.startswith(GENAI_EVENT_PREFIX) and len(tid) == 16 and len(sid) == 8
                        and tid != _Z16 and sid != _Z8):
                    other += 1
                    continue
                if rs is None:
                    rs = out.resource_spans.add()
                    rs.resource.CopyFrom(rl.resource)
                if ss is None:
                    ss = rs.scope_spans.add()
                    ss.scope.name = _SCOPE
                    ss.scope.version = sl.scope.name or ""
                t = rec.time_unix_nano or rec.observed_time_unix_nano
                h = hashlib.sha256(tid + sid + name.encode() + t.to_bytes(8, "big", signed=False)
                                   + rec.body.SerializeToString(deterministic=True)
                                   + b"".join(kv.SerializeToString(deterministic=True) for kv in rec.attributes))
                span_id = h.digest()[:8]
                if span_id == _Z8:
                    span_id = b"\x00" * 7 + b"\x01"
                sp = ss.spans.add(trace_id=tid, span_id=span_id, parent_span_id=sid, name=name, kind=1,
                                  start_time_unix_nano=t, end_time_unix_nano=t)
                ev = sp.events.add(name=name, time_unix_nano=t)
                for kv in rec.attributes:
                    if kv.key != _EVENT_NAME_ATTR:
                        ev.attributes.add().CopyFrom(kv)
                if rec.HasField("body"):
                    ev.attributes.add(key=_BODY_ATTR).value.CopyFrom(rec.body)
                joined += 1
    return (out if joined else None), joined, other


def count_metric_points(req: ExportMetricsServiceRequest) -> dict[str, int]:
    """Data points per metric type (``gauge``, ``sum``, ``histogram``, ``exponential_histogram``,
    ``summary``; ``empty`` for a metric without data). Pure."""
    out: dict[str, int] = {}
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data") or "empty"
                n = len(getattr(m, kind).data_points) if kind != "empty" else 1
                out[kind] = out.get(kind, 0) + n
    return out


def logs_response(*, json: bool) -> bytes:
    """An empty (fully successful) ``ExportLogsServiceResponse``."""
    resp = ExportLogsServiceResponse()
    return json_format.MessageToJson(resp).encode() if json else resp.SerializeToString()


def metrics_response(*, json: bool) -> bytes:
    """An empty (fully successful) ``ExportMetricsServiceResponse``."""
    resp = ExportMetricsServiceResponse()
    return json_format.MessageToJson(resp).encode() if json else resp.SerializeToString()
