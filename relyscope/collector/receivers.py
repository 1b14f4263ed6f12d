"""OTLP receivers: gRPC TraceService (:4317) and OTLP/HTTP ``POST /v1/traces`` (:4318).

Both hand the raw request to :meth:`relyscope.pipeline.Pipeline.accept` and translate its outcome
into OTLP status codes (OTLP 1.x spec, "OTLP/gRPC Response" and "OTLP/HTTP Response"):

| outcome | gRPC | HTTP |
|---|---|---|
| accepted (maybe partially) | OK + ExportTraceServiceResponse (partial_success) | 200, same body |
| undecodable request | INVALID_ARGUMENT | 400 + google.rpc.Status |
| body over the limit | RESOURCE_EXHAUSTED (message size) | 413 + google.rpc.Status |
| unknown content type | — | 415 |
| spool full (retryable) | RESOURCE_EXHAUSTED + RetryInfo | 503 + Retry-After |
| missing/wrong bearer token | UNAUTHENTICATED | 401 |
"""

from __future__ import annotations

import hmac
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from relyscope.collector.otlp import OTLPRequestError, encode_response, encode_status

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["create_otlp_http_app", "create_grpc_server", "check_bearer"]

_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_JSON = "application/json"
_PROTO = "application/x-protobuf"


def check_bearer(header: str | None, token: str | None) -> bool:
    """True when no token is configured or ``header`` is ``Bearer <token>`` (constant-time)."""
    if not token:
        return True
    if not header or not header.lower().startswith("bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def _retry_info_status(message: str, seconds: int) -> bytes:
    from google.protobuf import duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    st = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message=message)
    ri = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))
    st.details.add().Pack(ri)
    return st.SerializeToString()


def create_grpc_server(pipeline: "Pipeline", bind: str, *, token: str | None = None,
                       max_workers: int = 8, tls: tuple[bytes, bytes] | None = None) -> tuple[grpc.Server, int]:
    """Build and start the OTLP/gRPC server on ``bind`` (``host:port``; port 0 = any).
    Returns (server, bound port). Raises RuntimeError if the port cannot be bound."""
    from relyscope.pipeline import Backpressure

    def export(raw: bytes, context: grpc.ServicerContext) -> bytes:
        md = dict(context.invocation_metadata())
        if not check_bearer(md.get("authorization"), token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
        try:
            result = pipeline.accept(raw, _PROTO, None)
        except OTLPRequestError as e:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if e.http_status == 413 else grpc.StatusCode.INVALID_ARGUMENT
            context.abort(code, e.message)
        except Backpressure:
            context.set_trailing_metadata(
                (("grpc-status-details-bin", _retry_info_status("spool full", Backpressure.retry_after_s)),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "relyscope spool full; retry later")
        except OSError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"spool write failed: {e}")
        return encode_response(result, json=False)

    handler = grpc.method_handlers_generic_handler(
        _SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export, request_deserializer=None,
                                                                 response_serializer=None)})
    limit = pipeline.settings.max_body_bytes
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="otlp-grpc"),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler,))
    if tls:
        creds = grpc.ssl_server_credentials([(tls[1], tls[0])])
        port = server.add_secure_port(bind, creds)
    else:
        port = server.add_insecure_port(bind)
    if not port:
        raise RuntimeError(f"cannot bind OTLP/gRPC to {bind}")
    server.start()
    return server, port


def create_otlp_http_app(pipeline: "Pipeline", *, token: str | None = None) -> FastAPI:
    """The OTLP/HTTP receiver app (``POST /v1/traces``)."""
    from relyscope.pipeline import Backpressure

    app = FastAPI(title="relyscope OTLP/HTTP receiver", docs_url=None, redoc_url=None, openapi_url=None)
    limit = pipeline.settings.max_body_bytes

    def status_reply(code_http: int, grpc_code: int, message: str, is_json: bool, headers=None) -> Response:
        return Response(encode_status(grpc_code, message, json=is_json), status_code=code_http,
                        media_type=_JSON if is_json else _PROTO, headers=headers)

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        ctype = request.headers.get("content-type")
        is_json = (ctype or "").split(";")[0].strip().lower() == _JSON
        if not check_bearer(request.headers.get("authorization"), token):
            return status_reply(401, 16, "missing or invalid bearer token", is_json,
                                {"WWW-Authenticate": "Bearer"})
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return status_reply(413, 8, f"request body of {declared} bytes exceeds the limit of {limit} bytes", is_json)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return status_reply(413, 8, f"request body exceeds the limit of {limit} bytes", is_json)
            chunks.append(chunk)
        body = b"".join(chunks)
        try:
            result = await run_in_threadpool(pipeline.accept, body, ctype, request.headers.get("content-encoding"))
        except OTLPRequestError as e:
            return status_reply(e.http_status, 3 if e.http_status == 400 else 8 if e.http_status == 413 else 3,
                                e.message, is_json)
        except Backpressure:
            return status_reply(503, 14, "relyscope spool full; retry later", is_json,
                                {"Retry-After": str(Backpressure.retry_after_s)})
        except OSError as e:
            return status_reply(503, 14, f"spool write failed: {e}", is_json, {"Retry-After": "5"})
        return Response(encode_response(result, json=is_json), media_type=_JSON if is_json else _PROTO)

    return app
