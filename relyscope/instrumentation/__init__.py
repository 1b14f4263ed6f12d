"""relyscope instrumentation: the API an agent developer calls (conventions.md §1–2).

Wrappers (context managers and decorators, sync and async) emitting OpenTelemetry GenAI-semconv
spans plus the ``relyscope.*`` extension attributes scoring needs:

- :func:`agent_run` — root span ``invoke_agent {name}`` of one trial;
- :func:`tool_call` — ``execute_tool {name}``; :func:`llm_call` — ``chat {model}``;
- :func:`record_outcome`, :func:`record_confidence`, :func:`record_claimed_success` (on the
  innermost open agent run), :func:`record_decision` (on the current span);
- :func:`set_redactor` — hook applied to content attributes before they are set;
- :func:`configure` — SDK ``TracerProvider`` + OTLP exporter;
- :class:`BaggageSpanProcessor` / :func:`task_baggage` — ``relyscope.task.id`` from OTel baggage
  onto spans a framework creates (SDK ``SpanProcessor``, imported on first use);
- :func:`post_outcome` / ``record_outcome(..., trace_id=…)`` — an outcome after the run, posted
  to the sidecar's outcome API (stdlib ``urllib``); :func:`current_trace_id`;
- ``relyscope.instrumentation.otlp_json.OTLPJsonFileExporter`` — OTLP/JSON lines file exporter.

Provider choice: explicit ``tracer_provider=`` on a wrapper > the enclosing ``agent_run``'s provider
> :func:`use_tracer_provider` default > the global OTel provider.

This package imports nothing of the sidecar (collector, store, scorers, exporter, numpy, …); the
wrappers use only the OTel API.

Example::

    from relyscope.instrumentation import agent_run, tool_call, record_outcome, configure
    tp = configure("http://127.0.0.1:4317", service_name="support-agent")
    with agent_run("support-agent", task_id="refund", tracer_provider=tp):
        with tool_call("issue_refund", side_effect="irreversible", arguments={"id": 7}) as t:
            t.set_result({"ok": True})
        record_outcome(True, source="db_state")
    tp.shutdown()
"""

from __future__ import annotations

from relyscope.instrumentation._configure import configure
from relyscope.instrumentation.outcomes import OutcomePostError, current_trace_id, post_outcome
from relyscope.instrumentation._core import (
    AgentRunHandle,
    LlmCallHandle,
    Redactor,
    SpanHandle,
    ToolCallHandle,
    agent_run,
    get_redactor,
    llm_call,
    record_claimed_success,
    record_confidence,
    record_decision,
    record_outcome,
    set_redactor,
    tool_call,
    use_tracer_provider,
)

__all__ = [
    "AgentRunHandle",
    "BaggageSpanProcessor",
    "OutcomePostError",
    "TaskScope",
    "current_trace_id",
    "post_outcome",
    "task_baggage",
    "LlmCallHandle",
    "Redactor",
    "SpanHandle",
    "ToolCallHandle",
    "agent_run",
    "configure",
    "get_redactor",
    "llm_call",
    "record_claimed_success",
    "record_confidence",
    "record_decision",
    "record_outcome",
    "set_redactor",
    "tool_call",
    "use_tracer_provider",
]


def __getattr__(name: str):
    # the baggage processor implements the SDK's SpanProcessor: imported on first use, so that
    # importing the wrappers stays API-only
    if name in ("BaggageSpanProcessor", "TaskScope", "task_baggage"):
        from relyscope.instrumentation import baggage

        return getattr(baggage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
