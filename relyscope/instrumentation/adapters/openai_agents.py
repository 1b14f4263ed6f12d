"""OpenAI Agents SDK adapter: a trace processor giving each SDK trace a task id and an outcome.

The Agents SDK traces through its own processors; an OTel bridge (OpenInference's
``OpenAIAgentsInstrumentor``, which registers one) turns each SDK trace into OTel spans under one
root span, which the sidecar reads as the trial. :class:`RelyscopeAgentsProcessor` sets on that
root span — no span of its own, no second copy of the trace —

- ``relyscope.task.id`` (and ``relyscope.run.kind``, ``gen_ai.agent.version``) from the trace
  metadata (``RunConfig(trace_metadata={"relyscope.task.id": …})`` or ``trace(..., metadata=…)``);
- ``gen_ai.agent.name``: the metadata's, else the first agent that runs (the bridge names its root
  after the workflow, not the agent);
- ``relyscope.outcome`` / ``relyscope.confidence`` given with :meth:`record` while the trace is
  still open (inside ``with trace(...)``).

It is two things at once: an Agents SDK ``TracingProcessor`` (register it **before** the bridge)
and, as :attr:`span_processor`, an OTel ``SpanProcessor`` for the bridge's ``TracerProvider``,
which recognises the bridge's root span when it starts. After a trace has ended, post the
outcome by its OTel trace id: ``record_outcome(ok, trace_id=proc.otel_trace_id(sdk_trace_id))``.

Usage (tested with openai-agents 0.24.0 and openinference-instrumentation-openai-agents 2.6.0)::

    from agents import set_trace_processors, trace
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    proc = RelyscopeAgentsProcessor()
    tp.add_span_processor(proc.span_processor)
    set_trace_processors([proc])                 # first (this also drops OpenAI's own exporter)
    OpenAIAgentsInstrumentor().instrument(tracer_provider=tp, exclusive_processor=False)
    with trace("support", metadata={"relyscope.task.id": "refund-42"}) as t:
        result = await Runner.run(agent, "refund order 42")
        proc.record(t.trace_id, success=db.refunded(42), confidence=0.8)

Thread-safe; never raises into the SDK (its processor calls must not disrupt a run).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from agents.tracing import AgentSpanData, TracingProcessor
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import SpanProcessor

from relyscope import semconv as sc

__all__ = ["RelyscopeAgentsProcessor", "TASK_METADATA_KEYS"]

log = logging.getLogger("relyscope.instrumentation")

#: trace-metadata keys copied onto the bridge's root span
TASK_METADATA_KEYS = (sc.RS_TASK_ID, sc.RS_RUN_KIND, sc.GEN_AI_AGENT_NAME, sc.GEN_AI_AGENT_VERSION)
_MAX_REMEMBERED = 10_000  # SDK → OTel trace ids kept for posting outcomes later
_SDK_TRACE = otel_context.create_key("relyscope-agents-sdk-trace")


class _Trace:
    __slots__ = ("metadata", "token", "root", "named")

    def __init__(self, metadata: dict, token: object) -> None:
        self.metadata = metadata
        self.token = token
        self.root: Any = None  # the bridge's root span, once it started
        self.named = sc.GEN_AI_AGENT_NAME in metadata


class _RootSpanCatcher(SpanProcessor):
    """OTel side: the first span started while an SDK trace's context marker is current and
    no span is (the bridge's root) is handed to the processor."""

    def __init__(self, owner: "RelyscopeAgentsProcessor") -> None:
        self._owner = owner

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        ctx = parent_context if parent_context is not None else otel_context.get_current()
        sdk_id = otel_context.get_value(_SDK_TRACE, ctx)
        if sdk_id is not None:
            self._owner._root_started(sdk_id, span)


class RelyscopeAgentsProcessor(TracingProcessor):
    """Agents SDK ``TracingProcessor`` + OTel :attr:`span_processor` (see the module doc)."""

    def __init__(self) -> None:
        self._open: dict[str, _Trace] = {}
        self._otel_ids: dict[str, str] = {}
        self._lock = threading.Lock()
        self.span_processor = _RootSpanCatcher(self)

    # ---- the SDK's processor interface -----------------------------------------------------------
    def on_trace_start(self, trace: Any) -> None:
        try:
            meta = getattr(trace, "metadata", None) or {}
            attrs = {k: str(meta[k]) for k in TASK_METADATA_KEYS if meta.get(k) is not None}
            # mark the context for the bridge's root span, which starts right after this call
            token = otel_context.attach(otel_context.set_value(_SDK_TRACE, trace.trace_id))
            with self._lock:
                self._open[trace.trace_id] = _Trace(attrs, token)
        except Exception:  # noqa: BLE001 - never disrupt the agent's run
            log.exception("relyscope: on_trace_start failed")

    def _root_started(self, sdk_id: str, span: Any) -> None:
        with self._lock:
            t = self._open.get(sdk_id)
            if t is None or t.root is not None:
                return
            t.root = span
            self._otel_ids[sdk_id] = format(span.get_span_context().trace_id, "032x")
            while len(self._otel_ids) > _MAX_REMEMBERED:
                self._otel_ids.pop(next(iter(self._otel_ids)))
            # the marker has done its job: later spans get their parents from the bridge
            otel_context.detach(t.token)
            t.token = None
        for k, v in t.metadata.items():
            span.set_attribute(k, v)

    def on_trace_end(self, trace: Any) -> None:
        with self._lock:
            t = self._open.pop(trace.trace_id, None)
        if t is not None and t.token is not None:  # no bridge span started (no bridge registered)
            otel_context.detach(t.token)

    def on_span_start(self, span: Any) -> None:
        data = getattr(span, "span_data", None)
        if not isinstance(data, AgentSpanData):
            return
        with self._lock:
            t = self._open.get(span.trace_id)
            if t is None or t.named or t.root is None:
                return
            t.named = True
        t.root.set_attribute(sc.GEN_AI_AGENT_NAME, str(data.name))  # the entry agent

    def on_span_end(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass

    # ---- for the application ---------------------------------------------------------------------
    def record(self, sdk_trace_id: str, *, success: bool | None = None,
               confidence: float | None = None, source: str | None = None) -> bool:
        """Set ``relyscope.outcome`` (True / False / None = unknown; left unset when only a
        confidence is given) and ``relyscope.confidence`` (0–1) on the bridge's root span of the
        open SDK trace ``sdk_trace_id``. Returns False when that trace is not open (it ended:
        post the outcome with ``record_outcome(..., trace_id=self.otel_trace_id(sdk_trace_id))``).
        Raises ValueError for a confidence outside [0, 1]."""
        if confidence is not None and (math.isnan(confidence) or not 0 <= confidence <= 1):
            raise ValueError(f"confidence must be in [0, 1], got {confidence!r}")
        with self._lock:
            t = self._open.get(sdk_trace_id)
        if t is None or t.root is None:
            return False
        span = t.root
        if success is not None or confidence is None:
            span.set_attribute(sc.RS_OUTCOME, "unknown" if success is None else ("success" if success else "failure"))
        if source is not None:
            span.set_attribute(sc.RS_OUTCOME_SOURCE, source)
        if confidence is not None:
            span.set_attribute(sc.RS_CONFIDENCE, float(confidence))
        return True

    def otel_trace_id(self, sdk_trace_id: str) -> str | None:
        """The OTel trace id (32 hex) of an SDK trace this processor saw (the last 10 000 kept)."""
        with self._lock:
            return self._otel_ids.get(sdk_trace_id)
