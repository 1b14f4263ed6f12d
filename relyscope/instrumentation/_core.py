"""Span wrappers and record_* helpers of the instrumentation API (conventions.md §1–2).

Uses ONLY the OpenTelemetry API (``opentelemetry.trace`` / ``opentelemetry.context``): an agent that
never configures an SDK gets no-op spans at near-zero cost (style.md lesson 1).

Tracer-provider resolution (one rule, applied by every wrapper when it opens its span):

1. the wrapper's explicit ``tracer_provider=`` argument, else
2. the provider of the innermost open :func:`agent_run` (so children of a run started with an
   explicit provider land in the same provider without repeating it), else
3. the process default set by :func:`use_tracer_provider`, else
4. the global OTel provider (``opentelemetry.trace.get_tracer_provider()``).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import time
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from relyscope import semconv as sc
from relyscope.instrumentation import replay as _replay

__all__ = [
    "AgentRunHandle",
    "LlmCallHandle",
    "Redactor",
    "SpanHandle",
    "ToolCallHandle",
    "agent_run",
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

_log = logging.getLogger("relyscope.instrumentation")

TRACER_NAME = "relyscope.instrumentation"

F = TypeVar("F", bound=Callable[..., Any])

Redactor = Callable[[str, str], "str | None"]
"""``fn(attribute_name, value) -> value | None``; ``None`` drops the attribute."""

_CONTENT_ATTRIBUTES = frozenset(
    {
        sc.GEN_AI_TOOL_CALL_ARGUMENTS,
        sc.GEN_AI_TOOL_CALL_RESULT,
        sc.GEN_AI_INPUT_MESSAGES,
        sc.GEN_AI_OUTPUT_MESSAGES,
        sc.GEN_AI_SYSTEM_INSTRUCTIONS,
    }
)

_default_provider: TracerProvider | None = None
_redactor: Redactor | None = None


@dataclass(frozen=True, slots=True)
class _RunFrame:
    span: Span
    provider: TracerProvider | None


# Stack of open agent runs in this context (innermost last); contextvars make it per thread / task.
_RUNS: ContextVar[tuple[_RunFrame, ...]] = ContextVar("relyscope_agent_runs", default=())


# --------------------------------------------------------------------------------------------------
# configuration hooks
# --------------------------------------------------------------------------------------------------
def use_tracer_provider(provider: TracerProvider | None) -> TracerProvider | None:
    """Set the process-default tracer provider for the wrappers (``None`` = the global OTel one).

    Does not touch the global OTel provider. Returns the previous default. Safe from any thread.
    """
    global _default_provider
    previous, _default_provider = _default_provider, provider
    return previous


def set_redactor(fn: Redactor | None) -> Redactor | None:
    """Install ``fn(attribute_name, value) -> value | None`` applied to every content attribute.

    Content attributes are tool arguments/results and message attributes
    (``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``, ``gen_ai.input.messages``,
    ``gen_ai.output.messages``, ``gen_ai.system_instructions``). ``value`` is the string that would
    be set (already JSON-encoded); returning ``None`` drops the attribute. If ``fn`` raises, the
    attribute is dropped (fail closed) and a warning is logged. ``None`` removes the hook.
    Returns the previous redactor.
    """
    global _redactor
    previous, _redactor = _redactor, fn
    return previous


def get_redactor() -> Redactor | None:
    """The redactor installed by :func:`set_redactor`, or ``None``."""
    return _redactor


def _encode_content(value: Any) -> str:
    """Strings pass through unchanged; anything else is JSON (compact, UTF-8; ``repr`` if it cannot)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    except (TypeError, ValueError):  # e.g. a circular structure: never raise into the agent
        return repr(value)


def _reads_as_json(text: str) -> bool:
    """Would the collector decode ``text`` (it decodes strings opening with ``{``, ``[`` or ``"``
    that parse as JSON, :func:`relyscope.collector.normalize._values.decode_json_once`)?"""
    stripped = text.lstrip()  # str.lstrip, as the collector: any Unicode whitespace
    if stripped[:1] not in ('{', '[', '"'):
        return False
    try:
        json.loads(stripped)
    except ValueError:
        return False
    return True


def _content_value(name: str, value: Any) -> str | None:
    encoded = _encode_content(value)
    fn = _redactor
    if fn is None:
        return encoded
    try:
        out = fn(name, encoded)
    except Exception:  # fail closed: never leak content because the hook broke
        _log.warning("redactor raised for %s; attribute dropped", name, exc_info=True)
        return None
    if out is None:
        return None
    return out if isinstance(out, str) else _encode_content(out)


def _set_content(span: Span, name: str, value: Any) -> None:
    v = _content_value(name, value)
    if v is not None:
        span.set_attribute(name, v)


def _tracer(explicit: TracerProvider | None) -> trace.Tracer:
    provider = explicit
    if provider is None:
        runs = _RUNS.get()
        if runs:
            provider = runs[-1].provider
    if provider is None:
        provider = _default_provider
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider):  # no global provider yet: resolve per call
            return provider.get_tracer(TRACER_NAME)
    # SDK providers build a new Tracer (and instrumentation scope) per get_tracer call: one per
    # provider is enough, and it is most of a wrapper's cost (bench/bench_instrumentation.py)
    tracer = _TRACERS.get(provider)
    if tracer is None:
        tracer = _TRACERS[provider] = trace.get_tracer(TRACER_NAME, tracer_provider=provider)
    return tracer


_TRACERS: "weakref.WeakKeyDictionary[TracerProvider, trace.Tracer]" = weakref.WeakKeyDictionary()


def _resolved_provider(explicit: TracerProvider | None) -> TracerProvider | None:
    if explicit is not None:
        return explicit
    runs = _RUNS.get()
    if runs and runs[-1].provider is not None:
        return runs[-1].provider
    return _default_provider


def _mark_error(span: Span, error_type: str, message: str | None) -> None:
    span.set_attribute(sc.ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, message))


def _unit_interval(name: str, value: float) -> float:
    v = float(value)
    if math.isnan(v) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return v


# --------------------------------------------------------------------------------------------------
# handles
# --------------------------------------------------------------------------------------------------
class SpanHandle:
    """What a wrapper's context manager yields: the open span plus typed setters.

    Not thread-safe across threads for the same handle (one handle belongs to one span).
    """

    __slots__ = ("_end_time", "_error_set", "_span")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._end_time: int | None = None
        self._error_set = False

    @property
    def span(self) -> Span:
        """The underlying OTel API span (for attributes this API does not cover)."""
        return self._span

    def set_attribute(self, key: str, value: Any) -> None:
        """Set any attribute on the span (no redaction: use the typed setters for content)."""
        self._span.set_attribute(key, value)

    def set_end_time(self, end_time_ns: int) -> None:
        """End the span at this time (ns since the Unix epoch) instead of the wall clock on exit.

        For importers replaying historical data with synthesized timestamps.
        """
        self._end_time = int(end_time_ns)

    def set_error(self, error_type: str, message: str | None = None) -> None:
        """Mark the span failed: status ERROR (description ``message``) and ``error.type``."""
        if not error_type:
            raise ValueError("error_type must be a non-empty string")
        self._error_set = True
        _mark_error(self._span, error_type, message)


class AgentRunHandle(SpanHandle):
    """Handle of an open :func:`agent_run` root span."""

    __slots__ = ()

    @property
    def trace_id(self) -> str:
        """Trace id, 32 lowercase hex chars (all zeros for a no-op span)."""
        return format(self._span.get_span_context().trace_id, "032x")

    @property
    def span_id(self) -> str:
        """Span id of the root, 16 lowercase hex chars."""
        return format(self._span.get_span_context().span_id, "016x")

    @property
    def default_trial_id(self) -> str:
        """``{trace_id}:{root span_id}``, the collector's default trial id (conventions.md §2)."""
        return f"{self.trace_id}:{self.span_id}"


class ToolCallHandle(SpanHandle):
    """Handle of an open :func:`tool_call` span."""

    __slots__ = ("_arguments", "_tool")

    def __init__(self, span: Span) -> None:
        super().__init__(span)
        self._arguments: Any = None
        self._tool: tuple[str, str | None, str | None] = ("", None, None)  # name, side effect, call id

    def set_arguments(self, arguments: Any) -> None:
        """``gen_ai.tool.call.arguments``: str unchanged, else JSON; passes the redactor."""
        self._arguments = arguments
        _set_content(self._span, sc.GEN_AI_TOOL_CALL_ARGUMENTS, arguments)

    def _sandbox(self) -> tuple[str, Any]:
        """In a replay: ask the tool proxy (``relyscope.instrumentation.replay``) and tag the span.
        Returns ``("result" | "body", value)`` or ``("live", None)``; raises the ToolFault the
        agent must see."""
        name, side_effect, call_id = self._tool
        try:
            kind, value, answer = _replay.sandbox_answer(name, self._arguments, call_id, side_effect)
        except _replay.ToolFault as e:
            if e.fault_type:
                self._span.set_attribute(sc.RS_FAULT_TYPE, e.fault_type)
            self._span.set_attribute(sc.RS_SANDBOX_MATCH, "none" if isinstance(e, _replay.SandboxMiss) else "fault")
            # the span fails even when the agent catches the fault inside the with-block
            self.set_error(e.error_type, str(e))
            raise
        self._span.set_attribute(sc.RS_SANDBOX_MATCH, str(answer.get("match") or kind))
        if answer.get("recorded"):
            self._span.set_attribute(sc.RS_SANDBOX_RECORDED, True)
        if kind == "body":
            self._span.set_attribute(sc.RS_FAULT_TYPE, str((answer.get("fault") or {}).get("type")))
        return kind, value

    def execute(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run the tool ``fn(*args, **kwargs)`` and record its result — except during a shadow
        replay, where the tool proxy answers instead and ``fn`` is not called (unless the operator
        allows this read-only tool live). Returns the result the agent must use; raises what the
        tool raised, or the injected :class:`~relyscope.instrumentation.replay.ToolFault`."""
        if _replay.current_replay() is not None:
            kind, value = self._sandbox()
            if kind != "live":
                self.set_result(value)
                return value
        result = fn(*args, **kwargs)
        if result is not None:
            self.set_result(result)
        return result

    async def execute_async(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`execute` for an async tool (the proxy call runs in a worker thread)."""
        if _replay.current_replay() is not None:
            import asyncio
            import contextvars

            ctx = contextvars.copy_context()
            kind, value = await asyncio.get_running_loop().run_in_executor(None, ctx.run, self._sandbox)
            if kind != "live":
                self.set_result(value)
                return value
        result = await fn(*args, **kwargs)
        if result is not None:
            self.set_result(result)
        return result

    def set_result(self, value: Any) -> None:
        """``gen_ai.tool.call.result``: a str unchanged, anything else as JSON; passes the redactor.

        A str that itself reads as JSON (``'{"a": 1}'``, text an HTTP tool returned) is written as
        a JSON string literal, so that the collector, which decodes JSON-looking results once,
        gets the str back rather than the object: a shadow replay must hand the agent the same
        type its tool returned in production (the agent may well ``json.loads`` it)."""
        if isinstance(value, str) and _reads_as_json(value):
            value = json.dumps(value, ensure_ascii=False)
        _set_content(self._span, sc.GEN_AI_TOOL_CALL_RESULT, value)


class LlmCallHandle(SpanHandle):
    """Handle of an open :func:`llm_call` span."""

    __slots__ = ()

    def set_usage(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cache_read_tokens: int | None = None,
    ) -> None:
        """Token usage (tokens, non-negative ints); ``None`` leaves the attribute unset.

        Raises ValueError on a negative count.
        """
        for key, val in (
            (sc.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
            (sc.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens),
            (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, cache_read_tokens),
        ):
            if val is None:
                continue
            n = int(val)
            if n < 0:
                raise ValueError(f"{key} must be >= 0, got {val!r}")
            self._span.set_attribute(key, n)

    def set_response(
        self, model: str | None = None, finish_reasons: Sequence[str] | str | None = None
    ) -> None:
        """``gen_ai.response.model`` and ``gen_ai.response.finish_reasons`` (string array)."""
        if model is not None:
            self._span.set_attribute(sc.GEN_AI_RESPONSE_MODEL, model)
        if finish_reasons is not None:
            reasons = [finish_reasons] if isinstance(finish_reasons, str) else list(finish_reasons)
            self._span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, [str(r) for r in reasons])

    def set_input_messages(self, messages: Any) -> None:
        """``gen_ai.input.messages`` (opt-in content; JSON unless a str; passes the redactor)."""
        _set_content(self._span, sc.GEN_AI_INPUT_MESSAGES, messages)

    def set_output_messages(self, messages: Any) -> None:
        """``gen_ai.output.messages`` (opt-in content; JSON unless a str; passes the redactor)."""
        _set_content(self._span, sc.GEN_AI_OUTPUT_MESSAGES, messages)

    def set_system_instructions(self, instructions: Any) -> None:
        """``gen_ai.system_instructions`` (opt-in content; passes the redactor)."""
        _set_content(self._span, sc.GEN_AI_SYSTEM_INSTRUCTIONS, instructions)


# --------------------------------------------------------------------------------------------------
# the shared context-manager / decorator machinery
# --------------------------------------------------------------------------------------------------
class _Scope:
    """One span: used once as ``with``/``async with``, or as a decorator (fresh scope per call)."""

    _handle_cls: type[SpanHandle] = SpanHandle

    def __init__(self, tracer_provider: TracerProvider | None, start_time: int | None) -> None:
        self._provider = tracer_provider
        self._start_time = start_time
        self._handle: SpanHandle | None = None
        self._token: object | None = None

    # subclasses ---------------------------------------------------------------------------------
    def _span_name(self) -> str:
        raise NotImplementedError

    def _kind(self) -> SpanKind:
        return SpanKind.INTERNAL

    def _attributes(self) -> dict[str, Any]:
        raise NotImplementedError

    def _after_start(self, handle: SpanHandle) -> None:
        """Hook run after the span is current (content attributes, run stack push)."""

    def _before_end(self) -> None:
        """Hook run before the span ends (run stack pop)."""

    def _fresh(self) -> _Scope:
        raise NotImplementedError

    def _bind_call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        """Decorator hook: see the call's arguments before the span opens."""

    def _on_return(self, handle: SpanHandle, result: Any) -> None:
        """Decorator hook: see the function's return value before the span closes."""

    def _invoke(self, handle: SpanHandle, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Decorator hook: call the wrapped function (a tool call may be answered by the sandbox)."""
        return fn(*args, **kwargs)

    async def _invoke_async(self, handle: SpanHandle, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        return await fn(*args, **kwargs)

    # context manager ----------------------------------------------------------------------------
    def __enter__(self) -> Any:
        if self._handle is not None:
            raise RuntimeError("this scope is already open; create a new one per use")
        tracer = _tracer(self._provider)
        span = tracer.start_span(
            self._span_name(),
            kind=self._kind(),
            attributes=self._attributes(),
            start_time=self._start_time,
        )
        self._token = otel_context.attach(trace.set_span_in_context(span))
        handle = self._handle_cls(span)
        self._handle = handle
        try:
            self._after_start(handle)
        except BaseException:
            self._close(None)
            raise
        return handle

    def __exit__(self, exc_type, exc, tb) -> None:
        self._close(exc)

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._close(exc)

    def _close(self, exc: BaseException | None) -> None:
        handle = self._handle
        if handle is None:
            return
        span = handle.span
        try:
            if exc is not None and not isinstance(exc, GeneratorExit):
                span.record_exception(exc)
                etype = getattr(exc, "error_type", None)
                etype = etype if isinstance(etype, str) and etype else type(exc).__qualname__
                _mark_error(span, etype, f"{type(exc).__qualname__}: {exc}")
            self._before_end()
        finally:
            if self._token is not None:
                try:
                    otel_context.detach(self._token)  # type: ignore[arg-type]
                finally:
                    self._token = None
            span.end(end_time=handle._end_time)
            self._handle = None

    # decorator ----------------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError("relyscope wrappers decorate plain or async functions, not generators")
        template = self

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                scope = template._fresh()
                scope._bind_call(fn, args, kwargs)
                with scope as handle:
                    result = await scope._invoke_async(handle, fn, args, kwargs)
                    scope._on_return(handle, result)
                    return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            scope = template._fresh()
            scope._bind_call(fn, args, kwargs)
            with scope as handle:
                result = scope._invoke(handle, fn, args, kwargs)
                scope._on_return(handle, result)
                return result

        return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------
# agent_run
# --------------------------------------------------------------------------------------------------
class _AgentRun(_Scope):
    _handle_cls = AgentRunHandle

    def __init__(
        self,
        name: str,
        task_id: str | None,
        version: str | None,
        run_kind: str | None,
        conversation_id: str | None,
        agent_id: str | None,
        tracer_provider: TracerProvider | None,
        start_time: int | None,
        input: str | None = None,
    ) -> None:
        super().__init__(tracer_provider, start_time)
        self._input = input
        if run_kind is not None and run_kind not in sc.RUN_KINDS:
            raise ValueError(f"run_kind must be one of {sc.RUN_KINDS}, got {run_kind!r}")
        self._name = name
        self._task_id = task_id
        self._version = version
        self._run_kind = run_kind
        self._conversation_id = conversation_id
        self._agent_id = agent_id
        self._run_token: object | None = None

    def _fresh(self) -> _AgentRun:
        return _AgentRun(
            self._name,
            self._task_id,
            self._version,
            self._run_kind,
            self._conversation_id,
            self._agent_id,
            self._provider,
            self._start_time,
            self._input,
        )

    def _span_name(self) -> str:
        return f"{sc.OP_INVOKE_AGENT} {self._name}"

    def _attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
            sc.GEN_AI_AGENT_NAME: self._name,
            sc.GEN_AI_INVOCATION_IS_NESTED: bool(_RUNS.get()),
        }
        optional = {
            sc.GEN_AI_AGENT_ID: self._agent_id,
            sc.GEN_AI_AGENT_VERSION: self._version,
            sc.GEN_AI_CONVERSATION_ID: self._conversation_id,
            sc.RS_TASK_ID: self._task_id,
            sc.RS_RUN_KIND: self._run_kind,
        }
        attrs.update({k: str(v) for k, v in optional.items() if v is not None})
        if not _RUNS.get():  # the outermost run of a shadow replay says what it replays
            extra = _replay.replay_root_attributes()
            if sc.GEN_AI_AGENT_VERSION in attrs:  # the agent's own version wins over the target's key
                extra.pop(sc.GEN_AI_AGENT_VERSION, None)
            attrs.update(extra)
        return attrs

    def _after_start(self, handle: SpanHandle) -> None:
        if self._input is not None:
            _set_content(handle.span, sc.GEN_AI_INPUT_MESSAGES,
                         [{"role": "user", "parts": [{"type": "text", "content": self._input}]}])
        frame = _RunFrame(handle.span, _resolved_provider(self._provider))
        self._run_token = _RUNS.set(_RUNS.get() + (frame,))

    def _before_end(self) -> None:
        if self._run_token is not None:
            try:
                _RUNS.reset(self._run_token)  # type: ignore[arg-type]
            except ValueError:  # exited in another context (rare async misuse): pop by identity
                span = self._handle.span if self._handle else None
                _RUNS.set(tuple(f for f in _RUNS.get() if f.span is not span))
            self._run_token = None


def agent_run(
    name: str,
    *,
    task_id: str | None = None,
    version: str | None = None,
    run_kind: str | None = None,
    conversation_id: str | None = None,
    agent_id: str | None = None,
    tracer_provider: TracerProvider | None = None,
    start_time: int | None = None,
    input: str | None = None,
) -> Any:
    """Open the root span of one agent run (one trial): ``invoke_agent {name}``, kind INTERNAL.

    Use as ``with agent_run("support") as run:`` (yields an :class:`AgentRunHandle`),
    ``async with``, or as a decorator on a sync or async function (a fresh span per call).

    Attributes: ``gen_ai.operation.name=invoke_agent``, ``gen_ai.agent.name``, and when given
    ``gen_ai.agent.id``, ``gen_ai.agent.version``, ``gen_ai.conversation.id``,
    ``relyscope.task.id``, ``relyscope.run.kind``; ``gen_ai.invocation.is_nested`` is false unless
    another ``agent_run`` is open in the current context. An exception escaping the block sets
    status ERROR and ``error.type`` (exception class qualname), records it, and is re-raised.

    ``input``: the user's request, recorded as ``gen_ai.input.messages`` (opt-in content; passes
    the redactor) — the task input a shadow replay sends again, and the task fingerprint.
    Inside a shadow replay (:mod:`relyscope.instrumentation.replay`) the outermost run carries the
    replay's run kind, task id, ``relyscope.shadow.of``, ``relyscope.replay.id`` and
    ``relyscope.perturbation.*`` instead of its own run kind and task id.

    ``start_time`` (ns since the Unix epoch) overrides the wall clock, for importers.
    Raises ValueError if ``run_kind`` is not one of production, shadow, canary, offline.
    """
    return _AgentRun(
        name, task_id, version, run_kind, conversation_id, agent_id, tracer_provider, start_time, input
    )


# --------------------------------------------------------------------------------------------------
# tool_call
# --------------------------------------------------------------------------------------------------
class _ToolCall(_Scope):
    _handle_cls = ToolCallHandle

    def __init__(
        self,
        name: str,
        side_effect: str | None,
        call_id: str | None,
        arguments: Any,
        tool_type: str | None,
        tracer_provider: TracerProvider | None,
        start_time: int | None,
    ) -> None:
        super().__init__(tracer_provider, start_time)
        if side_effect is not None and side_effect not in sc.SIDE_EFFECTS:
            raise ValueError(f"side_effect must be one of {sc.SIDE_EFFECTS}, got {side_effect!r}")
        self._name = name
        self._side_effect = side_effect
        self._call_id = call_id
        self._arguments = arguments
        self._tool_type = tool_type

    def _fresh(self) -> _ToolCall:
        return _ToolCall(
            self._name,
            self._side_effect,
            self._call_id,
            self._arguments,
            self._tool_type,
            self._provider,
            self._start_time,
        )

    def _span_name(self) -> str:
        return f"{sc.OP_EXECUTE_TOOL} {self._name}"

    def _attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: self._name,
        }
        optional = {
            sc.GEN_AI_TOOL_CALL_ID: self._call_id,
            sc.GEN_AI_TOOL_TYPE: self._tool_type,
            sc.RS_TOOL_SIDE_EFFECT: self._side_effect,
        }
        attrs.update({k: str(v) for k, v in optional.items() if v is not None})
        return attrs

    def _after_start(self, handle: SpanHandle) -> None:
        assert isinstance(handle, ToolCallHandle)
        handle._tool = (self._name, self._side_effect, self._call_id)
        if self._arguments is not None:
            handle.set_arguments(self._arguments)

    def _invoke(self, handle: SpanHandle, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        assert isinstance(handle, ToolCallHandle)
        if _replay.current_replay() is None:
            return fn(*args, **kwargs)
        return handle.execute(fn, *args, **kwargs)

    async def _invoke_async(self, handle: SpanHandle, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        assert isinstance(handle, ToolCallHandle)
        if _replay.current_replay() is None:
            return await fn(*args, **kwargs)
        return await handle.execute_async(fn, *args, **kwargs)

    def _bind_call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        if self._arguments is not None:
            return  # explicit arguments given to the decorator win
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
            params = dict(bound.arguments)
        except (TypeError, ValueError):
            params = dict(kwargs)
        params.pop("self", None)
        params.pop("cls", None)
        self._arguments = params

    def _on_return(self, handle: SpanHandle, result: Any) -> None:
        if result is not None:
            _set_content(handle.span, sc.GEN_AI_TOOL_CALL_RESULT, result)


def tool_call(
    name: str,
    *,
    side_effect: str | None = None,
    call_id: str | None = None,
    arguments: Any = None,
    tool_type: str | None = "function",
    tracer_provider: TracerProvider | None = None,
    start_time: int | None = None,
) -> Any:
    """Open a tool-execution span ``execute_tool {name}`` (kind INTERNAL).

    Attributes: ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``, and when given
    ``gen_ai.tool.call.id``, ``gen_ai.tool.type``, ``relyscope.tool.side_effect`` (none, read,
    write, irreversible), ``gen_ai.tool.call.arguments`` (opt-in content: a str is passed through
    unchanged, a dict/list/other is JSON-encoded; passes the redactor).

    As a context manager it yields a :class:`ToolCallHandle` (``set_result(value)``,
    ``set_error(error_type, message=None)``). As a decorator (sync or async) the arguments are the
    call's bound parameters by name (``self``/``cls`` dropped) and the result is the return value
    (unless ``None``). An exception escaping sets status ERROR + ``error.type`` and is re-raised.
    Raises ValueError for an unknown ``side_effect``.
    """
    return _ToolCall(name, side_effect, call_id, arguments, tool_type, tracer_provider, start_time)


# --------------------------------------------------------------------------------------------------
# llm_call
# --------------------------------------------------------------------------------------------------
class _LlmCall(_Scope):
    _handle_cls = LlmCallHandle

    def __init__(
        self,
        model: str,
        provider: str | None,
        operation: str,
        tracer_provider: TracerProvider | None,
        start_time: int | None,
    ) -> None:
        super().__init__(tracer_provider, start_time)
        self._model = model
        self._provider_name = provider
        self._operation = operation

    def _fresh(self) -> _LlmCall:
        return _LlmCall(
            self._model, self._provider_name, self._operation, self._provider, self._start_time
        )

    def _span_name(self) -> str:
        return f"{self._operation} {self._model}"

    def _kind(self) -> SpanKind:
        return SpanKind.CLIENT

    def _attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: self._operation,
            sc.GEN_AI_REQUEST_MODEL: self._model,
        }
        if self._provider_name is not None:
            attrs[sc.GEN_AI_PROVIDER_NAME] = self._provider_name
        return attrs


def llm_call(
    model: str,
    *,
    provider: str | None = None,
    operation: str = "chat",
    tracer_provider: TracerProvider | None = None,
    start_time: int | None = None,
) -> Any:
    """Open a model-call span ``{operation} {model}`` (kind CLIENT).

    Attributes: ``gen_ai.operation.name`` (default chat), ``gen_ai.request.model``, and
    ``gen_ai.provider.name`` when given. Yields an :class:`LlmCallHandle` with ``set_usage``,
    ``set_response``, ``set_error`` and the opt-in message setters. Usable as a decorator (sync or
    async). An exception escaping sets status ERROR + ``error.type`` and is re-raised.
    """
    return _LlmCall(model, provider, operation, tracer_provider, start_time)


# --------------------------------------------------------------------------------------------------
# record_* helpers
# --------------------------------------------------------------------------------------------------
def _run_span() -> Span:
    """Innermost open agent_run root; if none is open, the current span (no-op if none)."""
    runs = _RUNS.get()
    return runs[-1].span if runs else trace.get_current_span()


def record_outcome(
    success: bool | None,
    *,
    score: float | None = None,
    source: str | None = None,
    trace_id: str | None = None,
    trial_id: str | None = None,
    api: str | None = None,
    token: str | None = None,
) -> dict | None:
    """Record the verified outcome on the innermost open :func:`agent_run` root span.

    ``relyscope.outcome`` = success (True) | failure (False) | unknown (None);
    ``relyscope.outcome.score`` (0–1) and ``relyscope.outcome.source`` when given. Works from inside
    nested tool/LLM spans. With no open agent_run it writes to the current span (a no-op if there
    is none). Raises ValueError if ``score`` is outside [0, 1] or NaN.

    After the run has ended, pass ``trace_id=`` (``run.trace_id`` of the :class:`AgentRunHandle`,
    ``scope.trace_id`` of :func:`~relyscope.instrumentation.baggage.task_baggage`) or
    ``trial_id=``: the outcome is then posted to the sidecar's outcome API at ``api`` (default
    ``http://127.0.0.1:9464``) as the application's verified outcome (``verifier: true``), and the
    sidecar's reply is returned (see :func:`relyscope.instrumentation.outcomes.post_outcome`, which
    raises ``OutcomePostError`` when the sidecar refuses or cannot be reached).
    """
    outcome = "unknown" if success is None else ("success" if bool(success) else "failure")
    checked = None if score is None else _unit_interval("score", score)
    if trace_id is not None or trial_id is not None:
        from relyscope.instrumentation.outcomes import DEFAULT_API, post_outcome

        return post_outcome(outcome=outcome, trace_id=trace_id, trial_id=trial_id, score=checked,
                            source=source or "record_outcome", verifier=True, api=api or DEFAULT_API,
                            token=token)
    span = _run_span()
    span.set_attribute(sc.RS_OUTCOME, outcome)
    if checked is not None:
        span.set_attribute(sc.RS_OUTCOME_SCORE, checked)
    if source is not None:
        span.set_attribute(sc.RS_OUTCOME_SOURCE, str(source))
    return None


def record_confidence(q: float) -> None:
    """Record the agent's self-assessed confidence (0–1) as ``relyscope.confidence`` on the root.

    Raises ValueError if ``q`` is outside [0, 1] or NaN.
    """
    span = _run_span()
    span.set_attribute(sc.RS_CONFIDENCE, _unit_interval("confidence", q))


def record_claimed_success(claimed: bool) -> None:
    """Record what the agent claims it achieved as ``relyscope.claimed_success`` on the run root."""
    _run_span().set_attribute(sc.RS_CLAIMED_SUCCESS, bool(claimed))


def record_decision(kind: str, *, reason: str | None = None) -> None:
    """Record a control decision (metrics.md §8).

    Inside a tool or model span it is set on that span (``relyscope.decision``,
    ``relyscope.decision.reason``). Directly inside an :func:`agent_run` (the current span is the
    run's root) it becomes a zero-length child span ``decision {kind}`` carrying the attributes, so
    the decision keeps its place among the run's steps. Raises ValueError for a ``kind`` not in
    act, ask, refuse, stop, confirm, recover.
    """
    if kind not in sc.DECISIONS:
        raise ValueError(f"decision must be one of {sc.DECISIONS}, got {kind!r}")
    span = trace.get_current_span()
    runs = _RUNS.get()
    attrs = {sc.RS_DECISION: kind}
    if reason is not None:
        attrs[sc.RS_DECISION_REASON] = str(reason)
    if runs and runs[-1].span is span:
        # zero length by an explicit start and end: a non-recording span (no SDK configured, or
        # OTEL_SDK_DISABLED=true) has no start_time to read back, and must not break the agent
        now = time.time_ns()
        child = _tracer(None).start_span(f"decision {kind}", attributes=attrs, start_time=now)
        child.end(end_time=now)
        return
    for k, v in attrs.items():
        span.set_attribute(k, v)