"""A request of one OTLP signal posted to another signal's endpoint is a 400 naming the right one,
never a 200 with the data dropped. Traces sent to ``/v1/logs`` (or ``/v1/metrics``) were answered
200 ``{}``: OTLP/JSON because ``resourceSpans`` is an unknown key there, protobuf because a span
parses as a log record (its trace id on ``time_unix_nano`` with the wrong wire type). Real logs and
metrics, encoded by the OTel SDK's own OTLP encoders, still pass."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relyscope.collector.otlp import OTLPRequestError
from relyscope.collector.signals import decode_logs, decode_metrics

DECODERS = {"logs": decode_logs, "metrics": decode_metrics}


def _traces_pb() -> bytes:
    mem = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(mem))
    with tp.get_tracer("t").start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "x"}):
        with tp.get_tracer("t").start_as_current_span("chat m"):
            pass
    return encode_spans(mem.get_finished_spans()).SerializeToString()


def _logs_pb() -> bytes:
    mem = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(mem))
    lp.get_logger("t").emit(body="an ordinary log line", attributes={"k": "v"})
    return encode_logs(mem.get_finished_logs()).SerializeToString()


def _metrics_pb() -> bytes:
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    mp.get_meter("t").create_counter("requests").add(3, {"route": "/x"})
    mp.get_meter("t").create_histogram("latency", unit="s").record(0.25)
    return encode_metrics(reader.get_metrics_data()).SerializeToString()


def _bare_traces_pb() -> bytes:
    """One span with ids, name and times only: bytes that parse as a log record and as a metric
    (the SDK's spans above carry more, which upb already refuses there)."""
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="invoke_agent x", start_time_unix_nano=1,
        end_time_unix_nano=2)
    return req.SerializeToString()


@pytest.mark.parametrize("what", DECODERS)
def test_traces_protobuf_on_another_endpoint_is_refused(what):
    with pytest.raises(OTLPRequestError) as e:
        DECODERS[what](_traces_pb(), False)
    assert e.value.http_status == 400
    with pytest.raises(OTLPRequestError) as e:
        DECODERS[what](_bare_traces_pb(), False)  # was parsed, answered 200 and dropped
    assert e.value.http_status == 400 and f"not an OTLP {what} request" in e.value.message
    assert "traces to /v1/traces" in e.value.message


@pytest.mark.parametrize("what", DECODERS)
@pytest.mark.parametrize("key", ["resourceSpans", "resource_spans"])
def test_traces_json_on_another_endpoint_is_refused(what, key):
    doc = {key: [{"scopeSpans": [{"spans": [{"traceId": "01" * 16, "spanId": "02" * 8, "name": "x"}]}]}]}
    with pytest.raises(OTLPRequestError) as e:
        DECODERS[what](json.dumps(doc).encode(), True)
    assert e.value.message == f"this is an OTLP traces request ({key}), not {what}: send it to /v1/traces"


def test_json_with_no_known_key_is_refused_and_empty_is_fine():
    with pytest.raises(OTLPRequestError) as e:
        decode_logs(b'{"foo": []}', True)
    assert "no resourceLogs in the OTLP/JSON logs request (keys: foo)" in e.value.message
    assert len(decode_logs(b"{}", True).resource_logs) == 0
    assert len(decode_metrics(b'{"resourceMetrics": []}', True).resource_metrics) == 0


def test_real_logs_and_metrics_still_pass():
    logs = decode_logs(_logs_pb(), False)
    assert logs.resource_logs[0].scope_logs[0].log_records[0].body.string_value == "an ordinary log line"
    metrics = decode_metrics(_metrics_pb(), False)
    names = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names == {"requests", "latency"}
