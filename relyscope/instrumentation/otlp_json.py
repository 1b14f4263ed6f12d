"""OTLP/JSON file exporter: one ``ExportTraceServiceRequest`` per line (OTel Collector file format).

Encoding follows the OTLP/JSON rules (OTLP spec, "JSON Protobuf Encoding"; conventions.md §3):
lowerCamelCase field names, enums as integers, 64-bit integers as decimal strings, and
``traceId``/``spanId``/``parentSpanId`` as lowercase hex — NOT the base64 protobuf's JSON mapping
would produce for bytes fields. Other bytes values (``bytesValue``) stay base64 as the spec says.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import IO, Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["OTLPJsonFileExporter", "encode_otlp_json"]

_log = logging.getLogger("relyscope.instrumentation.otlp_json")

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _fix_ids(obj: dict[str, Any]) -> None:
    for key in _ID_FIELDS:
        if key in obj and isinstance(obj[key], str):
            obj[key] = _b64_to_hex(obj[key])


def encode_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Encode finished SDK spans as one OTLP/JSON ``ExportTraceServiceRequest`` dict.

    Ids are lowercase hex (trace 32 chars, span 16 chars); int64/fixed64 fields are strings;
    enums are integers; fields at their default value are omitted (as protobuf JSON does).
    """
    request = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in request.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                _fix_ids(span)
                for link in span.get("links", ()):
                    _fix_ids(link)
    return request


class OTLPJsonFileExporter(SpanExporter):
    """SDK ``SpanExporter`` appending one OTLP/JSON request per ``export()`` call as a line.

    ``path_or_file``: a path (opened for append, UTF-8, closed on ``shutdown``) or an open text
    file object (flushed, never closed, by the exporter). Thread-safe; ``shutdown()`` is idempotent;
    ``export`` after shutdown returns FAILURE.
    """

    def __init__(self, path_or_file: str | os.PathLike[str] | IO[str]) -> None:
        if isinstance(path_or_file, (str, os.PathLike)):
            self._file: IO[str] = open(path_or_file, "a", encoding="utf-8")  # noqa: SIM115
            self._owned = True
        elif isinstance(path_or_file, io.IOBase) or hasattr(path_or_file, "write"):
            self._file = path_or_file
            self._owned = False
        else:
            raise TypeError("path_or_file must be a path or a writable text file object")
        self._lock = threading.Lock()
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = json.dumps(encode_otlp_json(spans), separators=(",", ":"), ensure_ascii=False)
            with self._lock:
                self._file.write(line + "\n")
                self._file.flush()
        except Exception:  # an exporter must not raise into the SDK
            _log.exception("OTLP/JSON file export failed")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._closed:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._file.flush()
            finally:
                if self._owned:
                    self._file.close()
