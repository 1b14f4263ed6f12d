"""pydantic-ai adapter: task id, outcome and confidence on the agent-run span pydantic-ai emits.

pydantic-ai's own instrumentation (the ``Instrumentation`` capability, or ``Agent.instrument_all``)
already emits GenAI-semconv spans — ``invoke_agent {name}`` with ``gen_ai.agent.name``, ``chat
{model}``, ``execute_tool {tool}`` — which the sidecar turns into a trial. What it cannot know is
the task and whether the run succeeded. :class:`RelyscopeCapability` is a pydantic-ai capability
that sets them on that same agent-run span (no second copy of the trace):

- before the run: ``relyscope.task.id`` (a string, or a function of the ``RunContext``);
- after the run: ``relyscope.outcome`` from ``outcome(result)`` (True / False / None = unknown)
  and ``relyscope.confidence`` from ``confidence(result)`` (0–1), if given.

Usage (tested with pydantic-ai-slim 2.68.0)::

    from pydantic_ai import Agent, InstrumentationSettings
    from pydantic_ai.capabilities import Instrumentation
    from relyscope.instrumentation.adapters.pydantic_ai import RelyscopeCapability

    agent = Agent(model, name="support",
                  capabilities=[Instrumentation(settings=InstrumentationSettings(tracer_provider=tp))])
    result = agent.run_sync("refund order 42", capabilities=[RelyscopeCapability(
        task_id="refund-42", outcome=lambda r: db.refunded(42), confidence=lambda r: r.output.confidence)])

An exception raised by ``outcome`` or ``confidence`` is logged and leaves the value unset (the
run's result is never lost to a scoring helper); a confidence outside [0, 1] is not set.
Imports pydantic-ai, so import this module only in an application that uses it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from opentelemetry import trace
from pydantic_ai.capabilities import AbstractCapability

from relyscope import semconv as sc

__all__ = ["RelyscopeCapability"]

log = logging.getLogger("relyscope.instrumentation")


@dataclass
class RelyscopeCapability(AbstractCapability[Any]):
    """Sets ``relyscope.task.id`` / ``relyscope.outcome`` / ``relyscope.confidence`` on the
    current agent-run span (the one pydantic-ai's ``Instrumentation`` opened). Pass it per run
    (``run_sync(..., capabilities=[RelyscopeCapability(task_id=…)])``) or on the agent with a
    ``task_id`` function. Must be used together with pydantic-ai's instrumentation; without it
    there is no span and the capability does nothing."""

    task_id: str | Callable[[Any], str | None] | None = None
    outcome: Callable[[Any], bool | None] | None = None
    confidence: Callable[[Any], float | None] | None = None
    outcome_source: str | None = None

    _safe_at_runtime: ClassVar[bool] = True  # sets span attributes only

    async def before_run(self, ctx: Any) -> None:
        span = trace.get_current_span()
        task = self.task_id(ctx) if callable(self.task_id) else self.task_id
        if task is not None and span.is_recording():
            span.set_attribute(sc.RS_TASK_ID, str(task))

    async def after_run(self, ctx: Any, *, result: Any) -> Any:
        span = trace.get_current_span()
        if not span.is_recording():
            return result
        if self.outcome is not None:
            ok = _safely(self.outcome, result, "outcome")
            if ok is not _FAILED:
                span.set_attribute(sc.RS_OUTCOME, "unknown" if ok is None else ("success" if ok else "failure"))
                if self.outcome_source:
                    span.set_attribute(sc.RS_OUTCOME_SOURCE, self.outcome_source)
        if self.confidence is not None:
            q = _safely(self.confidence, result, "confidence")
            if isinstance(q, (int, float)) and not isinstance(q, bool) and not math.isnan(q) and 0 <= q <= 1:
                span.set_attribute(sc.RS_CONFIDENCE, float(q))
            elif q is not None and q is not _FAILED:
                log.warning("relyscope: confidence %r is not in [0, 1]; not recorded", q)
        return result


_FAILED = object()


def _safely(fn: Callable[[Any], Any], result: Any, what: str) -> Any:
    try:
        return fn(result)
    except Exception:  # noqa: BLE001 - the application's helper must not cost it its result
        log.exception("relyscope: the %s function raised; %s not recorded", what, what)
        return _FAILED
