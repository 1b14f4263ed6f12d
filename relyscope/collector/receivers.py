"""OTLP receivers: gRPC TraceService (:4317) and OTLP/HTTP ``POST /v1/traces`` (:4318).

Both hand the raw request to :meth:`relyscope.pipeline.Pipeline.accept` and translate its outcome
into OTLP status codes (OTLP 1.x spec, "OTLP/gRPC Response" and "OTLP/HTTP Response"):

| outcome | gRPC | HTTP |
|---|---|---|
| accepted (maybe partially) | OK + ExportTraceServiceResponse (partial_success) | 200, same body |
| undecodable request | INVALID_ARGUMENT | 400 + google.rpc.Status |
| body over the limit | INVALID_ARGUMENT (permanent; beyond twice the limit grpc core's RESOURCE_EXHAUSTED) | 413 + google.rpc.Status |
| unknown content type | — | 415 |
| spool full, or in-flight byte budget exhausted (retryable) | RESOURCE_EXHAUSTED + RetryInfo | 503 + Retry-After |
| spool write failed / unexpected error (retryable) | UNAVAILABLE + RetryInfo | 503 + Retry-After |

RetryInfo goes in both trailers the stock exporters read (:func:`_retry_trailers`).
| decoder bug (``OTLPRequestError`` 500) | INTERNAL | 500 + google.rpc.Status |
| missing/wrong bearer token | UNAUTHENTICATED | 401 |
| body not received within ``http_read_timeout_s`` | — | 408 (a header that slow: connection closed) |
| other path / method | UNIMPLEMENTED | 404 / 405 + google.rpc.Status |

Every HTTP error reply carries a ``google.rpc.Status`` body, JSON when the request was JSON, else
protobuf. An unexpected exception never becomes a bare 500: the request was not acknowledged, so
the client is told to retry (503 / UNAVAILABLE) and the exception is logged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from relyscope.collector.otlp import OTLPRequestError, encode_response, encode_status

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["create_otlp_http_app", "create_grpc_server", "check_bearer"]

log = logging.getLogger("relyscope.receivers")

_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_JSON = "application/json"
_PROTO = "application/x-protobuf"
_RETRY_AFTER_S = 2  # for retryable failures other than a full spool
# media types relyscope.collector.otlp.decode_http accepts (parameters such as charset ignored)
_ACCEPTED_TYPES = frozenset((_PROTO, "application/protobuf", _JSON))


def _error_codes(e: OTLPRequestError) -> tuple[int, grpc.StatusCode]:
    """(HTTP status, gRPC status) of a permanent request error: FAILED_PRECONDITION when the error
    says so (a request larger than the whole spool), 500 → INTERNAL, other 4xx (413 too) →
    INVALID_ARGUMENT — never RESOURCE_EXHAUSTED, which OTLP exporters retry."""
    if e.grpc_code == "FAILED_PRECONDITION":  # e.g. larger than the whole spool: never retry
        return e.http_status, grpc.StatusCode.FAILED_PRECONDITION
    if e.http_status == 413:  # too large: permanent (RESOURCE_EXHAUSTED would be retried)
        return 413, grpc.StatusCode.INVALID_ARGUMENT
    if e.http_status >= 500:
        return 500, grpc.StatusCode.INTERNAL
    if 400 <= e.http_status < 500:
        return e.http_status, grpc.StatusCode.INVALID_ARGUMENT
    return 400, grpc.StatusCode.INVALID_ARGUMENT


def _code_number(code: grpc.StatusCode) -> int:
    return code.value[0]


def check_bearer(header: str | None, token: str | None) -> bool:
    """True when no token is configured or ``header`` is ``Bearer <token>`` (constant-time)."""
    if not token:
        return True
    if not header or not header.lower().startswith("bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def _retry_trailers(code: grpc.StatusCode, message: str, seconds: int) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata carrying a ``google.rpc.RetryInfo`` hint where each stock OTLP exporter
    reads it: ``grpc-status-details-bin`` (a ``google.rpc.Status`` with the RetryInfo in its
    details: the Go exporter's ``throttleDelay``, grpc-java's ``StatusProto``) and
    ``google.rpc.retryinfo-bin`` (the bare RetryInfo: what opentelemetry-python's gRPC exporter
    looks up; without it it backs off 1, 2, 4 … s and gives up at its deadline)."""
    from google.protobuf import duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    ri = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))
    st = status_pb2.Status(code=code.value[0], message=message)
    st.details.add().Pack(ri)
    return (("grpc-status-details-bin", st.SerializeToString()),
            ("google.rpc.retryinfo-bin", ri.SerializeToString()))


def _abort_retryable(context: grpc.ServicerContext, code: grpc.StatusCode, message: str, seconds: int):
    context.set_trailing_metadata(_retry_trailers(code, message, seconds))
    context.abort(code, message)


def create_grpc_server(pipeline: "Pipeline", bind: str, *, token: str | None = None,
                       max_workers: int = 8, tls: tuple[bytes, bytes] | None = None) -> tuple[grpc.Server, int]:
    """Build and start the OTLP/gRPC server on ``bind`` (``host:port``; port 0 = any).
    Returns (server, bound port). Raises RuntimeError if the port cannot be bound."""
    from relyscope.pipeline import Backpressure

    limit = pipeline.settings.max_body_bytes
    budget = pipeline.inflight

    def export(raw: bytes, context: grpc.ServicerContext) -> bytes:
        md = dict(context.invocation_metadata())
        if not check_bearer(md.get("authorization"), token):
            pipeline.stats.refused_request("unauthenticated")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
        if len(raw) > limit:  # permanent: a retry of the same request cannot succeed
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request of {len(raw)} bytes exceeds the limit of {limit} bytes (RELYSCOPE_MAX_BODY_BYTES); "
                          "send smaller batches")
        if not budget.try_acquire(len(raw)):
            pipeline.stats.refused("inflight_budget")
            _abort_retryable(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                             "relyscope in-flight byte budget exhausted; retry later", Backpressure.retry_after_s)
        try:
            result = pipeline.accept(raw, _PROTO, None)
            reply = encode_response(result, json=False)
        except OTLPRequestError as e:
            context.abort(_error_codes(e)[1], e.message)
        except Backpressure as e:
            _abort_retryable(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"relyscope {e}; retry later",
                             Backpressure.retry_after_s)
        except OSError as e:
            _abort_retryable(context, grpc.StatusCode.UNAVAILABLE, f"spool write failed: {e}", _RETRY_AFTER_S)
        except Exception as e:  # noqa: BLE001 - a stage boundary: never a bare UNKNOWN to the client
            log.exception("OTLP/gRPC export failed")
            _abort_retryable(context, grpc.StatusCode.UNAVAILABLE,
                             f"internal error: {type(e).__name__}; retry later", _RETRY_AFTER_S)
        finally:
            budget.release(len(raw))
        return reply

    handler = grpc.method_handlers_generic_handler(
        _SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(export, request_deserializer=None,
                                                                 response_serializer=None)})
    # grpc core answers RESOURCE_EXHAUSTED (retryable for OTLP exporters) for a message over its
    # receive limit; up to twice our limit the handler answers the permanent INVALID_ARGUMENT
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="otlp-grpc"),
                         # RPCs beyond what the in-flight budget can hold are refused by grpc core
                         maximum_concurrent_rpcs=max(2 * max_workers, budget.max_bytes // limit),
                         options=[("grpc.max_receive_message_length", 2 * limit),
                                  ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handler, *_signal_handlers(pipeline, token)))
    if tls:
        creds = grpc.ssl_server_credentials([(tls[1], tls[0])])
        port = server.add_secure_port(bind, creds)
    else:
        port = server.add_insecure_port(bind)
    if not port:
        raise RuntimeError(f"cannot bind OTLP/gRPC to {bind}")
    server.start()
    return server, port


def _export_log_spans(pipeline: "Pipeline", body: bytes, is_json: bool):
    """Logs request bytes → count, and hand the GenAI event records (as spans) to the traces path.
    Raises OTLPRequestError / Backpressure / OSError as ``Pipeline.accept``."""
    from relyscope.collector import signals

    req = signals.decode_logs(body, is_json)
    spans, joined, other = signals.logs_to_traces(req)
    if spans is not None:
        pipeline.accept(spans.SerializeToString(), _PROTO, None)
    signals.counts_of(pipeline).add_logs(joined, other)


def _export_metrics(pipeline: "Pipeline", body: bytes, is_json: bool) -> None:
    from relyscope.collector import signals

    signals.counts_of(pipeline).add_points(signals.count_metric_points(signals.decode_metrics(body, is_json)))


def _signal_handlers(pipeline: "Pipeline", token: str | None) -> list:
    """gRPC LogsService / MetricsService Export (OTLP logs and metrics: see
    :mod:`relyscope.collector.signals`), with the error mapping of the traces service."""
    from relyscope.collector import signals
    from relyscope.pipeline import Backpressure

    def make(fn, ok_reply):
        def export(raw: bytes, context: grpc.ServicerContext) -> bytes:
            md = dict(context.invocation_metadata())
            if not check_bearer(md.get("authorization"), token):
                pipeline.stats.refused_request("unauthenticated")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
            if not pipeline.inflight.try_acquire(len(raw)):  # the traces service's budget, shared
                pipeline.stats.refused("inflight_budget")
                _abort_retryable(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 "relyscope in-flight byte budget exhausted; retry later", Backpressure.retry_after_s)
            try:
                fn(pipeline, raw, False)
            except OTLPRequestError as e:
                context.abort(_error_codes(e)[1], e.message)
            except Backpressure as e:
                _abort_retryable(context, grpc.StatusCode.RESOURCE_EXHAUSTED, f"relyscope {e}; retry later",
                                 Backpressure.retry_after_s)
            except OSError as e:
                _abort_retryable(context, grpc.StatusCode.UNAVAILABLE, f"spool write failed: {e}", _RETRY_AFTER_S)
            except Exception as e:  # noqa: BLE001 - a stage boundary
                log.exception("OTLP/gRPC export failed")
                _abort_retryable(context, grpc.StatusCode.UNAVAILABLE,
                                 f"internal error: {type(e).__name__}; retry later", _RETRY_AFTER_S)
            finally:
                pipeline.inflight.release(len(raw))
            return ok_reply
        return grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)

    return [
        grpc.method_handlers_generic_handler("opentelemetry.proto.collector.logs.v1.LogsService",
                                             {"Export": make(_export_log_spans, signals.logs_response(json=False))}),
        grpc.method_handlers_generic_handler("opentelemetry.proto.collector.metrics.v1.MetricsService",
                                             {"Export": make(_export_metrics, signals.metrics_response(json=False))}),
    ]


def create_otlp_http_app(pipeline: "Pipeline", *, token: str | None = None) -> FastAPI:
    """The OTLP/HTTP receiver app (``POST /v1/traces``)."""
    from relyscope.pipeline import Backpressure

    app = FastAPI(title="relyscope OTLP/HTTP receiver", docs_url=None, redoc_url=None, openapi_url=None)
    limit = pipeline.settings.max_body_bytes
    budget = pipeline.inflight
    read_timeout = pipeline.settings.http_read_timeout_s

    def status_reply(code_http: int, grpc_code: grpc.StatusCode, message: str, is_json: bool,
                     headers=None) -> Response:
        return Response(encode_status(_code_number(grpc_code), message, json=is_json), status_code=code_http,
                        media_type=_JSON if is_json else _PROTO, headers=headers)

    def failure_reply(e: Exception, is_json: bool, backpressure_message: str) -> Response:
        """The OTLP/HTTP reply to a failed export (traces, logs, metrics alike): permanent request
        errors with their code, backpressure and spool-write failures as retryable 503 + Retry-After,
        anything else logged and answered retryable (a stage boundary)."""
        from relyscope.pipeline import Backpressure

        if isinstance(e, OTLPRequestError):
            http_status, code = _error_codes(e)
            return status_reply(http_status, code, e.message, is_json)
        if isinstance(e, Backpressure):
            return status_reply(503, grpc.StatusCode.UNAVAILABLE, backpressure_message, is_json,
                                {"Retry-After": str(Backpressure.retry_after_s)})
        if isinstance(e, OSError):
            return status_reply(503, grpc.StatusCode.UNAVAILABLE, f"spool write failed: {e}", is_json,
                                {"Retry-After": str(_RETRY_AFTER_S)})
        log.exception("OTLP/HTTP export failed", exc_info=e)
        return status_reply(503, grpc.StatusCode.UNAVAILABLE, f"internal error: {type(e).__name__}; retry later",
                            is_json, {"Retry-After": str(_RETRY_AFTER_S)})

    def wants_json(request: Request) -> bool:
        return (request.headers.get("content-type") or "").split(";")[0].strip().lower() == _JSON

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # 404 unknown path, 405 wrong method: still a google.rpc.Status body, as OTLP/HTTP asks
        code = grpc.StatusCode.UNIMPLEMENTED if exc.status_code in (404, 405) else grpc.StatusCode.INVALID_ARGUMENT
        return status_reply(exc.status_code, code, str(exc.detail), wants_json(request),
                            getattr(exc, "headers", None))

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        ctype = request.headers.get("content-type")
        is_json = wants_json(request)
        if not check_bearer(request.headers.get("authorization"), token):
            pipeline.stats.refused_request("unauthenticated")
            return status_reply(401, grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token", is_json,
                                {"WWW-Authenticate": "Bearer"})
        media_type = (ctype or "").split(";")[0].strip().lower()
        if media_type not in _ACCEPTED_TYPES:  # before reading (or inflating) the body
            return status_reply(415, grpc.StatusCode.INVALID_ARGUMENT,
                                f"unsupported Content-Type {ctype!r} (use application/x-protobuf or "
                                "application/json)", is_json)
        too_large = grpc.StatusCode.RESOURCE_EXHAUSTED
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return status_reply(413, too_large,
                                f"request body of {declared} bytes exceeds the limit of {limit} bytes", is_json)
        held = [0]  # bytes of this request reserved in the in-flight budget
        try:
            return await _receive(request, ctype, is_json, declared, held)
        finally:
            budget.release(held[0])

    def over_budget(is_json: bool) -> Response:
        pipeline.stats.refused("inflight_budget")
        return status_reply(503, grpc.StatusCode.UNAVAILABLE, "relyscope in-flight byte budget exhausted; retry "
                            "later", is_json, {"Retry-After": str(Backpressure.retry_after_s)})

    async def _receive(request: Request, ctype, is_json: bool, declared, held: list[int]) -> Response:
        """Read the body within the limit and the in-flight budget (the declared length is reserved
        before reading; a chunked body is reserved as it streams in), then accept it."""
        if declared and declared.isdigit():
            if not budget.try_acquire(int(declared)):
                return over_budget(is_json)
            held[0] = int(declared)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(read_timeout):  # a trickling body must not hold the budget
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        return status_reply(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            f"request body exceeds the limit of {limit} bytes", is_json)
                    if size > held[0]:
                        if not budget.try_acquire(size - held[0]):
                            return over_budget(is_json)
                        held[0] = size
                    chunks.append(chunk)
        except ClientDisconnect:
            return status_reply(400, grpc.StatusCode.INVALID_ARGUMENT, "client disconnected before the body ended",
                                is_json)
        except TimeoutError:
            return status_reply(408, grpc.StatusCode.INVALID_ARGUMENT,
                                f"request body not received within {read_timeout} s", is_json, {"Connection": "close"})
        return await _accept(request, b"".join(chunks), ctype, is_json)

    async def _accept(request: Request, body: bytes, ctype, is_json: bool) -> Response:
        try:
            result = await run_in_threadpool(pipeline.accept, body, ctype, request.headers.get("content-encoding"))
            reply = encode_response(result, json=is_json)
        except Exception as e:  # noqa: BLE001 - mapped to a reply; never a bare 500 to the client
            return failure_reply(e, is_json, f"relyscope {e}; retry later")
        return Response(reply, media_type=_JSON if is_json else _PROTO)

    async def other_signal(request: Request, fn, reply) -> Response:
        """``POST /v1/logs`` and ``/v1/metrics``: as ``/v1/traces`` for auth, content type, size and
        encoding, then :mod:`relyscope.collector.signals`."""
        ctype = request.headers.get("content-type")
        is_json = wants_json(request)
        if not check_bearer(request.headers.get("authorization"), token):
            pipeline.stats.refused_request("unauthenticated")
            return status_reply(401, grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token", is_json,
                                {"WWW-Authenticate": "Bearer"})
        if (ctype or "").split(";")[0].strip().lower() not in _ACCEPTED_TYPES:
            return status_reply(415, grpc.StatusCode.INVALID_ARGUMENT,
                                f"unsupported Content-Type {ctype!r} (use application/x-protobuf or "
                                "application/json)", is_json)
        held = [0]  # in-flight budget and read timeout as /v1/traces
        try:
            return await _other_signal_body(request, fn, reply, ctype, is_json, held)
        finally:
            budget.release(held[0])

    async def _other_signal_body(request: Request, fn, reply, ctype, is_json: bool, held: list[int]) -> Response:
        from relyscope.collector.otlp import Limits, decompress

        chunks, size = [], 0
        try:
            async with asyncio.timeout(read_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        return status_reply(413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            f"request body exceeds the limit of {limit} bytes", is_json)
                    if not budget.try_acquire(len(chunk)):
                        return over_budget(is_json)
                    held[0] += len(chunk)
                    chunks.append(chunk)
        except ClientDisconnect:
            return status_reply(400, grpc.StatusCode.INVALID_ARGUMENT, "client disconnected before the body ended",
                                is_json)
        except TimeoutError:
            return status_reply(408, grpc.StatusCode.INVALID_ARGUMENT,
                                f"request body not received within {read_timeout} s", is_json, {"Connection": "close"})
        try:
            body = decompress(b"".join(chunks), request.headers.get("content-encoding"), Limits(max_body_bytes=limit))
            await run_in_threadpool(fn, pipeline, body, is_json)
        except Exception as e:  # noqa: BLE001 - mapped to a reply; never a bare 500 to the client
            return failure_reply(e, is_json, "relyscope spool full; retry later")
        return Response(reply(json=is_json), media_type=_JSON if is_json else _PROTO)

    @app.post("/v1/logs")
    async def logs(request: Request) -> Response:
        from relyscope.collector import signals

        return await other_signal(request, _export_log_spans, signals.logs_response)

    @app.post("/v1/metrics")
    async def metrics(request: Request) -> Response:
        from relyscope.collector import signals

        return await other_signal(request, _export_metrics, signals.metrics_response)

    return app
