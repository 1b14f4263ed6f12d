"""Task identity for runs whose spans the application cannot touch: OTel baggage → span attributes.

A framework (pydantic-ai, LangGraph, the OpenAI Agents SDK bridges, …) creates its own agent span;
the application cannot set ``relyscope.task.id`` on it. Instead it puts the task id in the
OpenTelemetry baggage of the context the framework runs in, and :class:`BaggageSpanProcessor`,
added to the ``TracerProvider``, copies the ``relyscope.*`` baggage entries onto every span started
in that context — the framework's own spans included, no second copy of the trace. Baggage also
crosses process boundaries with the W3C ``baggage`` header, so a downstream service's spans get
the same task id.

Usage::

    tp.add_span_processor(BaggageSpanProcessor())          # once, at set-up
    with task_baggage(task_id="refund-42") as scope:
        agent.run_sync("refund order 42")                  # any framework call
    record_outcome(True, trace_id=scope.trace_id)          # after the run, posted to the API

Only the OTel API and SDK are used (the SDK for the ``SpanProcessor`` interface).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from opentelemetry import baggage, context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from relyscope import semconv as sc

__all__ = ["BaggageSpanProcessor", "TaskScope", "task_baggage", "BAGGAGE_KEYS"]

#: baggage entries copied onto spans (strings, as baggage values are)
BAGGAGE_KEYS: tuple[str, ...] = (sc.RS_TASK_ID, sc.RS_RUN_KIND, sc.GEN_AI_AGENT_VERSION,
                                 sc.GEN_AI_CONVERSATION_ID)

# not baggage: a context value is never propagated to other processes
_SCOPE_KEY = context.create_key("relyscope-task-scope")


class TaskScope:
    """What :func:`task_baggage` saw: the trace ids of the spans started inside it (first first).

    Thread-safe (spans may start on worker threads that inherited the context)."""

    __slots__ = ("task_id", "_trace_ids", "_lock")

    def __init__(self, task_id: str | None) -> None:
        self.task_id = task_id
        self._trace_ids: list[str] = []
        self._lock = threading.Lock()

    def _saw(self, trace_id: str) -> None:
        with self._lock:
            if trace_id not in self._trace_ids:
                self._trace_ids.append(trace_id)

    @property
    def trace_ids(self) -> tuple[str, ...]:
        """Trace ids (32 lowercase hex) of every span started in the scope, in first-seen order."""
        with self._lock:
            return tuple(self._trace_ids)

    @property
    def trace_id(self) -> str | None:
        """The trace id of the first span started in the scope (the run), or None if none was."""
        ids = self.trace_ids
        return ids[0] if ids else None


@contextmanager
def task_baggage(task_id: str | None = None, *, run_kind: str | None = None,
                 version: str | None = None, conversation_id: str | None = None) -> Iterator[TaskScope]:
    """Put ``relyscope.task.id`` (and the other given values) in the baggage of the current
    context for the ``with`` block; yields a :class:`TaskScope` whose ``trace_id`` is the run's
    (needs :class:`BaggageSpanProcessor` on the provider). Raises ValueError for an unknown
    ``run_kind``."""
    if run_kind is not None and run_kind not in sc.RUN_KINDS:
        raise ValueError(f"run_kind must be one of {sc.RUN_KINDS}, got {run_kind!r}")
    scope = TaskScope(task_id)
    ctx = context.set_value(_SCOPE_KEY, scope)
    for key, value in ((sc.RS_TASK_ID, task_id), (sc.RS_RUN_KIND, run_kind),
                       (sc.GEN_AI_AGENT_VERSION, version), (sc.GEN_AI_CONVERSATION_ID, conversation_id)):
        if value is not None:
            ctx = baggage.set_baggage(key, str(value), context=ctx)
    token = context.attach(ctx)
    try:
        yield scope
    finally:
        context.detach(token)


class BaggageSpanProcessor(SpanProcessor):
    """Copies the ``relyscope.*`` baggage entries (``keys``, default :data:`BAGGAGE_KEYS`) of the
    parent context onto each span at its start, unless the span already has the attribute (a
    value the framework or the application set wins). Must not block: a dictionary lookup per key."""

    def __init__(self, keys: Iterable[str] = BAGGAGE_KEYS) -> None:
        self._keys = tuple(keys)

    def on_start(self, span: Span, parent_context: context.Context | None = None) -> None:
        ctx = parent_context if parent_context is not None else context.get_current()
        entries = baggage.get_all(ctx)
        attrs = span.attributes or {}
        for key in self._keys:
            value = entries.get(key)
            if value is not None and key not in attrs:
                span.set_attribute(key, str(value))
        scope = context.get_value(_SCOPE_KEY, ctx)
        if isinstance(scope, TaskScope):
            scope._saw(format(span.get_span_context().trace_id, "032x"))

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
