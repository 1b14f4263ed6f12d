"""The gRPC retry hint reaches the stock OpenTelemetry Python exporter (issue 10 item 3).

opentelemetry-python's gRPC exporter (``opentelemetry/exporter/otlp/proto/grpc/exporter.py``)
reads RetryInfo from the ``google.rpc.retryinfo-bin`` trailer only; the Go exporter reads it from
the ``google.rpc.Status`` in ``grpc-status-details-bin``. The sidecar's spool is filled (store down,
64 KiB spool) and a real ``OTLPSpanExporter`` exports into it: it must wait the hinted delay
(the exporter logs "retrying in 2.00s"; without the hint it logs its own jittered 0.8–1.2 s), and,
with the store back during its retries, deliver the batch within its default 10 s timeout.
"""

from __future__ import annotations

import logging
import threading

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from test_durability import (EXPORT, _start, make_trace, metric, otlp_proto, post_json, sidecars,  # noqa: F401
                             stored_keys, trace_id_of, wait_until)

HINT_S = 2  # relyscope.pipeline.Backpressure.retry_after_s


def _fill_spool(sc) -> None:
    for i in range(400):
        if post_json(sc, make_trace(trace_id_of(30, i), task="t0")).status_code != 200:
            return
    raise AssertionError("the spool never filled")


def _finished_spans(n: int):
    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "hint-agent"}))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    tracer = tp.get_tracer("hint-test")
    for i in range(n):
        with tracer.start_as_current_span(f"invoke_agent hint-{i}", attributes={"gen_ai.operation.name": "invoke_agent"}):
            pass
    return mem.get_finished_spans()


def test_retry_info_travels_in_both_trailers(tmp_path, sidecars):
    down = tmp_path / "down"
    down.touch()
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down, RELYSCOPE_SPOOL_MAX_BYTES=1 << 16)
    _fill_spool(sc)
    with grpc.insecure_channel(f"127.0.0.1:{sc.grpc_port}") as ch:
        export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        try:
            export(otlp_proto(make_trace(trace_id_of(30, 999), task="t0")), timeout=20)
            raise AssertionError("expected RESOURCE_EXHAUSTED")
        except grpc.RpcError as e:
            assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            md = dict(e.trailing_metadata() or ())
    ri = error_details_pb2.RetryInfo.FromString(md["google.rpc.retryinfo-bin"])  # Python exporter
    assert ri.retry_delay.seconds == HINT_S
    st = status_pb2.Status.FromString(md["grpc-status-details-bin"])  # Go / Java exporters
    ri2 = error_details_pb2.RetryInfo()
    assert st.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and st.details[0].Unpack(ri2)
    assert ri2.retry_delay.seconds == HINT_S


def test_stock_python_exporter_waits_the_hint_and_rides_out_a_full_spool(tmp_path, sidecars, caplog):
    down = tmp_path / "down"
    down.touch()
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down, RELYSCOPE_SPOOL_MAX_BYTES=1 << 16)
    _fill_spool(sc)
    spans = _finished_spans(3)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{sc.grpc_port}", insecure=True)  # default 10 s timeout
    before = metric(sc, "relyscope_backpressure_total", 'reason="spool_full"')
    result: list = []
    caplog.set_level(logging.WARNING, logger="opentelemetry.exporter.otlp.proto.grpc.exporter")
    t = threading.Thread(target=lambda: result.append(exporter.export(spans)))
    t.start()
    wait_until(lambda: metric(sc, "relyscope_backpressure_total", 'reason="spool_full"') > before, what="first refused attempt")
    down.unlink()  # the store is back: the spool drains while the exporter waits
    t.join(30)
    exporter.shutdown()
    assert result == [SpanExportResult.SUCCESS]
    delays = [r.args[3] for r in caplog.records if r.msg.startswith("Transient error")]
    assert delays and all(d == HINT_S for d in delays), delays
    ids = {format(s.context.span_id, "016x") for s in spans}
    wait_until(lambda: ids <= {sid for _, sid in stored_keys(sc)}, what="exported spans stored")
