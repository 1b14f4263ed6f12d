"""``configure()``: the only place the instrumentation touches the OTel SDK and OTLP exporters.

All SDK/exporter imports are inside the function so importing ``relyscope.instrumentation`` stays
API-only (style.md lesson 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit, urlunsplit

from relyscope import semconv as sc

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["configure"]

PROTOCOLS = ("grpc", "http/protobuf")


def _http_traces_url(endpoint: str) -> str:
    """Append the signal path ``/v1/traces`` to a base URL (one with an empty or ``/`` path)."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path="/v1/traces"))
    return endpoint


def configure(
    endpoint: str | None = None,
    *,
    protocol: Literal["grpc", "http/protobuf"] | None = None,
    service_name: str = "agent",
    service_version: str | None = None,
    headers: Mapping[str, str] | None = None,
    batch: bool = True,
    set_global: bool = False,
    exporter: SpanExporter | None = None,
    resource_attributes: Mapping[str, str] | None = None,
) -> TracerProvider:
    """Build an SDK ``TracerProvider`` exporting spans over OTLP (to a relyscope sidecar).

    Args:
        endpoint: OTLP endpoint, e.g. ``http://127.0.0.1:4317`` (gRPC) or
            ``http://127.0.0.1:4318`` (HTTP; a base URL gets ``/v1/traces`` appended). ``None`` lets
            the exporter read the standard ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` variables
            (and its own defaults, localhost:4317 / localhost:4318/v1/traces).
        protocol: ``"grpc"`` or ``"http/protobuf"``; default: the standard
            ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` variable, else gRPC.
        service_name / service_version: resource ``service.name`` / ``service.version`` (merged
            with ``OTEL_RESOURCE_ATTRIBUTES`` by the SDK's ``Resource.create``).
        headers: extra OTLP request headers (e.g. auth).
        batch: ``BatchSpanProcessor`` (default) or ``SimpleSpanProcessor`` (synchronous export).
        set_global: also install the provider as the global OTel provider (default: don't).
        exporter: use this ``SpanExporter`` instead of OTLP (e.g.
            :class:`relyscope.instrumentation.otlp_json.OTLPJsonFileExporter`); then ``endpoint``,
            ``protocol`` and ``headers`` are ignored.
        resource_attributes: extra resource attributes.

    Returns the provider; call its ``shutdown()`` at exit to flush buffered spans. To make the
    wrappers use it, pass it as ``tracer_provider=`` to ``agent_run`` (children inherit it), call
    ``use_tracer_provider(tp)``, or pass ``set_global=True``.

    Raises ValueError for an unknown ``protocol``, or for ``OTEL_BSP_*`` variables the SDK's
    ``BatchSpanProcessor`` refuses (a queue, batch or delay not positive, a batch larger than the
    queue), naming the variable to change and its value.
    """
    if protocol is None:
        import os

        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    attrs: dict[str, str] = dict(resource_attributes or {})
    attrs[sc.SERVICE_NAME] = service_name
    if service_version is not None:
        attrs[sc.SERVICE_VERSION] = service_version
    provider = TracerProvider(resource=Resource.create(attrs))

    if exporter is None:
        exporter = otlp_exporter(endpoint, protocol, headers)

    try:
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    except ValueError as e:  # the SDK's own check of its OTEL_BSP_* variables, which it reads here
        raise ValueError(_bsp_refusal(str(e))) from e
    provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


#: the SDK's ``BatchSpanProcessor`` argument named in its refusal → the variable it was read from
#: and what that variable must be (opentelemetry-sdk ``trace/export/__init__.py``, its checks)
_BSP_VARS = (("max_export_batch_size must be less", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
              "at most OTEL_BSP_MAX_QUEUE_SIZE"),
             ("max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "a positive integer"),
             ("max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "a positive integer"),
             ("schedule_delay_millis", "OTEL_BSP_SCHEDULE_DELAY", "a positive number of milliseconds"),
             ("export_timeout_millis", "OTEL_BSP_EXPORT_TIMEOUT", "a positive number of milliseconds"))
_BSP_DEFAULTS = {"OTEL_BSP_MAX_QUEUE_SIZE": "2048", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512",
                 "OTEL_BSP_SCHEDULE_DELAY": "5000", "OTEL_BSP_EXPORT_TIMEOUT": "30000"}


def _bsp_refusal(sdk_message: str) -> str:
    """What to change when the SDK's ``BatchSpanProcessor`` refuses its settings
    (``sdk_message``): the variable that argument is read from and what it must be, with its value
    and those of the other ``OTEL_BSP_*`` variables set (an unset one shows the SDK's default)."""
    import os

    def now(name: str) -> str:
        return f"{name} (now {os.environ[name]!r})" if name in os.environ else \
            f"{name} (now unset: {_BSP_DEFAULTS[name]})"

    for arg, name, must in _BSP_VARS:
        if sdk_message.startswith(arg):
            if must.startswith("at most"):  # the one check of two variables: either may change
                fix = f"set {now(name)} at most {now('OTEL_BSP_MAX_QUEUE_SIZE')}"
            else:
                others = [now(n) for n in _BSP_DEFAULTS if n != name and n in os.environ]
                fix = f"set {now(name)} to {must}" + (f" (also set: {', '.join(others)})" if others else "")
            return f"the OTel SDK refused its batch settings ({sdk_message}): {fix}, or pass batch=False"
    set_vars = ", ".join(now(n) for n in _BSP_DEFAULTS if n in os.environ) or "no OTEL_BSP_* variable set"
    return f"the OTel SDK refused its batch settings ({sdk_message}; {set_vars}), or pass batch=False"


def otlp_exporter(endpoint: str | None, protocol: Literal["grpc", "http/protobuf"],
                  headers: Mapping[str, str] | None = None) -> SpanExporter:
    """The OTel SDK's OTLP span exporter :func:`configure` uses: gRPC, or HTTP/protobuf with
    ``/v1/traces`` appended to a base URL. Raises ValueError for an unknown ``protocol``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    hdrs = dict(headers) if headers else None
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, headers=hdrs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPSpanExporter

    return HTTPSpanExporter(endpoint=_http_traces_url(endpoint) if endpoint else None, headers=hdrs)
