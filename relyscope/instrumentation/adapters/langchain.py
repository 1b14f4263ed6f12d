"""LangChain / LangGraph adapter: a callback handler that scores the run OpenInference traces.

OpenInference's ``LangChainInstrumentor`` turns every LangChain / LangGraph run into OTel spans;
the run's root span (the graph, named after it) becomes the trial. :class:`RelyscopeCallbackHandler`,
passed in the run config, sets on that same root span before it ends (no span of its own):

- ``relyscope.task.id`` (and ``relyscope.run.kind``) from the run-config metadata
  (``config={"metadata": {"relyscope.task.id": "refund-42"}}``), else the handler's ``task_id``;
- ``gen_ai.agent.name``: the handler's ``agent_name``, else the root run's name (the graph's);
- ``relyscope.outcome`` from ``outcome(outputs)`` (True / False / None) and ``relyscope.confidence``
  from ``confidence(outputs)`` (0–1), functions of the run's final output, if given; a run that
  raises gets ``relyscope.outcome=failure`` only if ``error_is_failure``.

After the run, :meth:`trace_id_of` (by the run id you passed as ``config["run_id"]``) or
:attr:`last_trace_id` gives the OTel trace id for ``record_outcome(ok, trace_id=…)``.

Usage (tested with langgraph 1.2.24, langchain-core 1.8.3, openinference-instrumentation-langchain
0.1.80)::

    from openinference.instrumentation.langchain import LangChainInstrumentor
    LangChainInstrumentor().instrument(tracer_provider=tp)
    handler = RelyscopeCallbackHandler(outcome=lambda out: orders.is_refunded(42))
    graph.invoke({"messages": [("user", "refund order 42")]},
                 config={"callbacks": [handler], "metadata": {"relyscope.task.id": "refund-42"}})

An exception raised by ``outcome`` or ``confidence`` is logged and leaves the value unset.
Imports langchain-core and OpenInference's LangChain instrumentation.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from openinference.instrumentation.langchain import LangChainInstrumentor

from relyscope import semconv as sc

__all__ = ["RelyscopeCallbackHandler"]

log = logging.getLogger("relyscope.instrumentation")
_MAX_REMEMBERED = 10_000


class RelyscopeCallbackHandler(BaseCallbackHandler):
    """LangChain callback handler (see the module doc). One handler may serve many runs, from
    any thread; it only reads run metadata and sets attributes on OpenInference's root span."""

    run_inline = True  # called in the run's own thread, before OpenInference ends its span

    def __init__(self, *, task_id: str | None = None, agent_name: str | None = None,
                 outcome: Callable[[Any], bool | None] | None = None,
                 confidence: Callable[[Any], float | None] | None = None,
                 outcome_source: str | None = None, error_is_failure: bool = False) -> None:
        super().__init__()
        self.task_id = task_id
        self.agent_name = agent_name
        self.outcome = outcome
        self.confidence = confidence
        self.outcome_source = outcome_source
        self.error_is_failure = error_is_failure
        self._roots: dict[UUID, tuple[dict, str | None]] = {}
        self._trace_ids: dict[UUID, str] = {}
        self._last: str | None = None
        self._lock = threading.Lock()

    # ---- LangChain callbacks -------------------------------------------------------------------
    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                       metadata: dict | None = None, **kwargs: Any) -> None:
        if parent_run_id is not None:
            return
        name = kwargs.get("name") or (serialized.get("name") if isinstance(serialized, dict) else None)
        with self._lock:
            self._roots[run_id] = (dict(metadata or {}), name)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._finish(run_id, outputs=outputs, error=None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any) -> None:
        self._finish(run_id, outputs=None, error=error)

    # ---- for the application -------------------------------------------------------------------
    def trace_id_of(self, run_id: UUID | str) -> str | None:
        """OTel trace id (32 hex) of the root run ``run_id`` (``config["run_id"]``), once ended."""
        with self._lock:
            return self._trace_ids.get(UUID(str(run_id)))

    @property
    def last_trace_id(self) -> str | None:
        """OTel trace id of the root run that ended last (in any thread)."""
        return self._last

    # ---- internals -----------------------------------------------------------------------------
    def _finish(self, run_id: UUID, *, outputs: Any, error: BaseException | None) -> None:
        with self._lock:
            root = self._roots.pop(run_id, None)
        if root is None:
            return
        metadata, name = root
        span = LangChainInstrumentor().get_span(run_id)
        if span is None or not span.is_recording():
            log.warning("relyscope: no open OpenInference span for LangChain run %s "
                        "(is LangChainInstrumentor().instrument() called?)", run_id)
            return
        tid = format(span.get_span_context().trace_id, "032x")
        with self._lock:
            self._trace_ids[run_id] = tid
            while len(self._trace_ids) > _MAX_REMEMBERED:
                self._trace_ids.pop(next(iter(self._trace_ids)))
            self._last = tid
        task = metadata.get(sc.RS_TASK_ID, self.task_id)
        if task is not None:
            span.set_attribute(sc.RS_TASK_ID, str(task))
        if metadata.get(sc.RS_RUN_KIND) is not None:
            span.set_attribute(sc.RS_RUN_KIND, str(metadata[sc.RS_RUN_KIND]))
        agent = self.agent_name or metadata.get(sc.GEN_AI_AGENT_NAME) or name
        if agent:
            span.set_attribute(sc.GEN_AI_AGENT_NAME, str(agent))
        if error is not None:
            if self.error_is_failure:
                span.set_attribute(sc.RS_OUTCOME, "failure")
            return
        if self.outcome is not None:
            ok = _safely(self.outcome, outputs, "outcome")
            if ok is not _FAILED:
                span.set_attribute(sc.RS_OUTCOME, "unknown" if ok is None else ("success" if ok else "failure"))
                if self.outcome_source:
                    span.set_attribute(sc.RS_OUTCOME_SOURCE, self.outcome_source)
        if self.confidence is not None:
            q = _safely(self.confidence, outputs, "confidence")
            if isinstance(q, (int, float)) and not isinstance(q, bool) and not math.isnan(q) and 0 <= q <= 1:
                span.set_attribute(sc.RS_CONFIDENCE, float(q))
            elif q is not None and q is not _FAILED:
                log.warning("relyscope: confidence %r is not in [0, 1]; not recorded", q)


_FAILED = object()


def _safely(fn: Callable[[Any], Any], value: Any, what: str) -> Any:
    try:
        return fn(value)
    except Exception:  # noqa: BLE001 - the application's helper must not break its run
        log.exception("relyscope: the %s function raised; %s not recorded", what, what)
        return _FAILED
