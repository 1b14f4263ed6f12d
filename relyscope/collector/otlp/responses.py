"""OTLP response bodies: ``ExportTraceServiceResponse`` with partial success, ``google.rpc.Status``."""

from __future__ import annotations

from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from relyscope.collector.otlp.result import DecodeResult, Validation

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
