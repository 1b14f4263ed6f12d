"""The one internal data model (like the Collector's pdata): frozen objects every stage exchanges.

- :class:`CanonicalSpan` — one OTLP span after decoding and validation at the receiver edge
  (ids as lowercase hex, attribute values as plain Python values, flags for repairs made).
- :class:`SpanSemantics` — what a span means for scoring, after convention mapping
  (``relyscope.collector.normalize``): agent run, model call, tool call, …, with tokens, cost,
  tool arguments decoded once.
- :class:`Step` and :class:`Trial` — the trajectory of one agent run (metrics.md §1).

Nothing downstream of the receiver sees protobuf or raw OTLP JSON.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

#: The largest count (tokens, calls, …) the model holds: 2^53 − 1, the largest integer a float64 —
#: and so a JSON reader, a Prometheus sample or a ClickHouse Float64 — holds exactly. A count sent
#: larger is no count (unknown), and a trial's token sum past it is unknown too (flag
#: ``token_count_overflow``): the store's UInt64 columns refused such a sum, and the whole trial was
#: dropped as unstorable.
MAX_COUNT = (1 << 53) - 1

# "use the default factory" marker of the generated __init__ (dataclasses' own, shown as <factory>)
_FACTORY = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", object())


def _fast_init(cls: type) -> type:
    """Give a frozen, slotted dataclass an ``__init__`` ~3.5x cheaper than the generated one, with
    the same signature (defaults, default factories, annotations) and the same result.

    A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__`` (~90 ns a
    field: ~4 us for the 44 of :class:`SpanSemantics`, paid once per span per stage). This one
    turns the new object into a plain twin class with the very same ``__slots__`` (a layout
    CPython lets ``__class__`` move between), stores the fields as ordinary slot writes, and turns
    it back: the instance is then of ``cls`` in every respect (frozen, hashed, compared and
    pickled by the dataclass's own methods). Classes with ``__post_init__``, ``InitVar``s,
    ``init=False`` or keyword-only fields are returned unchanged."""
    fields = dataclasses.fields(cls)
    if (hasattr(cls, "__post_init__") or tuple(f.name for f in fields) != tuple(cls.__dict__.get("__slots__", ()))
            or any(not f.init or f.kw_only for f in fields)):
        return cls
    twin = type(f"_{cls.__name__}Init", (), {"__slots__": cls.__slots__})
    ns: dict[str, Any] = {"_osa": object.__setattr__, "_twin": twin, "_cls": cls, "_FACTORY": _FACTORY}
    params, body = [], ["    _osa(self, '__class__', _twin)"]
    for f in fields:
        if f.default is not dataclasses.MISSING:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            body.append(f"    self.{f.name} = {f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    self.{f.name} = _f_{f.name}() if {f.name} is _FACTORY else {f.name}")
        else:
            params.append(f.name)
            body.append(f"    self.{f.name} = {f.name}")
    body.append("    self.__class__ = _cls")
    exec("def __init__(self, " + ", ".join(params) + "):\n" + "\n".join(body), ns)  # noqa: S102
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls


class SpanKind(enum.IntEnum):
    """OTLP ``Span.SpanKind`` values."""

    UNSPECIFIED = 0
    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(enum.IntEnum):
    """OTLP ``Status.StatusCode`` values."""

    UNSET = 0
    OK = 1
    ERROR = 2


class Op(str, enum.Enum):
    """What a span is, whatever convention it came in (conventions.md §3)."""

    AGENT = "agent"  # an agent run (root of a trial, or a nested agent)
    WORKFLOW = "workflow"  # invoke_workflow / chain / turn
    LLM = "llm"  # a model call
    TOOL = "tool"  # a tool call
    HANDOFF = "handoff"
    GUARDRAIL = "guardrail"
    RETRIEVAL = "retrieval"
    EMBEDDING = "embedding"
    UNKNOWN = "unknown"


@_fast_init
@dataclass(frozen=True, slots=True)
class SpanEvent:
    """An OTLP span event. ``time_ns``: Unix epoch nanoseconds."""

    name: str
    time_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


@_fast_init
@dataclass(frozen=True, slots=True)
class CanonicalSpan:
    """One span as stored and assembled.

    Ids are lowercase hex: ``trace_id`` 32 chars, ``span_id`` 16 chars, ``parent_span_id`` 16 chars
    or ``""`` for none. Times are Unix epoch nanoseconds; ``end_ns >= start_ns`` is guaranteed
    (an end before start is clamped to start and flagged ``end_before_start``; the raw end is kept
    in ``raw_end_ns``). ``dropped_attributes``: how many attributes (span and event) the
    receiver's count limit dropped, never one that scoring reads. Attribute values are ``str | bool | int | float | bytes | list | dict``
    (OTLP arrays become lists, kvlists dicts). ``flags`` names repairs made at decode time
    (``end_before_start``, ``invalid_utf8``, ``empty_attribute``, ``truncated_attribute``,
    ``dropped_attributes``, ``missing_kind`` …).
    """

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int = 0
    status_message: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    resource: Mapping[str, Any] = field(default_factory=dict)
    scope_name: str = ""
    scope_version: str = ""
    events: tuple[SpanEvent, ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (trace_id, span_id)
    trace_state: str = ""
    flags: frozenset[str] = frozenset()
    raw_end_ns: int | None = None
    dropped_attributes: int = 0  # attributes the receiver's count limit dropped (flag dropped_attributes)

    @property
    def duration_ns(self) -> int:
        """Span duration in nanoseconds, never negative."""
        return self.end_ns - self.start_ns

    @property
    def key(self) -> tuple[str, str]:
        """Identity used for deduplication: (trace_id, span_id)."""
        return (self.trace_id, self.span_id)


@_fast_init
@dataclass(frozen=True, slots=True)
class Evaluation:
    """A ``gen_ai.evaluation.result`` event."""

    name: str
    score: float | None = None
    label: str | None = None
    explanation: str | None = None


@_fast_init
@dataclass(frozen=True, slots=True)
class SpanSemantics:
    """The meaning of one span for scoring, independent of the convention it arrived in.

    Units: tokens are counts; ``cost_usd`` in USD. ``tool_arguments`` / ``tool_result`` are decoded
    JSON values when the source carried JSON (a string holding JSON is decoded exactly once), else
    the original string. ``None`` means "not given", never zero.
    """

    op: Op = Op.UNKNOWN
    convention: str = "unknown"  # genai | openinference | openllmetry | relyscope | …
    agent_name: str | None = None
    agent_id: str | None = None
    agent_version: str | None = None
    is_nested: bool | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_type: str | None = None
    tool_arguments: Any = None
    tool_result: Any = None
    side_effect: str | None = None
    model: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    finish_reasons: tuple[str, ...] = ()
    error_type: str | None = None  # error.type, or "exception"/status when only those say so
    conversation_id: str | None = None
    task_id: str | None = None
    trial_id: str | None = None
    run_kind: str | None = None
    outcome: str | None = None  # success | failure | unknown
    outcome_score: float | None = None
    outcome_source: str | None = None
    claimed_success: bool | None = None
    confidence: float | None = None
    decision: str | None = None
    handoff_target: str | None = None
    guardrail_triggered: bool | None = None
    separate_trial: bool = False
    shadow_of: str | None = None
    perturbation_family: str | None = None
    perturbation_strength: str | None = None
    fault_type: str | None = None
    evaluations: tuple[Evaluation, ...] = ()
    first_user_input: str | None = None  # for the task fingerprint (metrics.md §1)
    requested_tool_calls: tuple[str, ...] = ()  # tool call ids a model call asked for
    #: (call id, tool name, arguments) of the calls a model call asked for, where its output says
    requested_tools: tuple[tuple[str, str | None, Any], ...] = ()


@_fast_init
@dataclass(frozen=True, slots=True)
class Step:
    """One step of a trajectory: a model call, tool call, handoff or decision, in start order.

    ``action`` is the action name of metrics.md §3 (tool name, ``llm``, ``handoff:<agent>``,
    ``decision:<state>``). ``depth`` is the distance from the trial root. ``flags`` include
    ``reattached`` (parent missing, attached to nearest known ancestor), ``unended`` (a streamed
    span with no end), ``missing_tool_span`` (a requested tool call with no tool span).
    """

    span_id: str
    parent_span_id: str
    action: str
    op: Op
    name: str
    start_ns: int
    end_ns: int
    depth: int = 1
    tool_name: str | None = None
    tool_call_id: str | None = None
    arguments: Any = None
    result: Any = None
    error: str | None = None
    decision: str | None = None
    side_effect: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    flags: frozenset[str] = frozenset()
    fault_type: str | None = None  # relyscope.fault.type: the result was an injected fault


@_fast_init
@dataclass(frozen=True, slots=True)
class Trial:
    """One attempt of one agent configuration at one task (metrics.md §1).

    ``status`` is ``complete`` (root seen and ended), ``incomplete`` (root never arrived; scored
    for what it has, never mixed into success metrics) or ``superseded`` (a tombstone replacing
    the row of a provisional trial whose identity changed when its real root arrived; never read). ``wall_time_s`` in seconds, ``cost_usd``
    in USD or None when no span reported cost; token counts are sums over model calls (else over
    the wrapping model call, else the agent span, where only those report usage), None when no span
    reported any (flag ``partial_usage`` when only some model calls did: the sums are lower bounds).
    """

    trial_id: str
    trace_id: str
    root_span_id: str
    task_id: str
    task_id_source: str  # attribute | shadow | fingerprint | trace
    agent_name: str
    agent_version: str
    run_kind: str
    outcome: str  # success | failure | unknown
    outcome_source: str | None
    outcome_score: float | None
    claimed_success: bool | None
    confidence: float | None
    conversation_id: str | None
    start_ns: int
    end_ns: int
    steps: tuple[Step, ...]
    input_tokens: int | None = None  # None: no span reported usage (unknown is not zero)
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    model_calls: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    status: str = "complete"
    flags: frozenset[str] = frozenset()
    shadow_of: str | None = None
    perturbation_family: str | None = None
    perturbation_strength: str | None = None
    revision: int = 1  # bumped on re-finalization after late spans
    span_count: int = 0
    evaluations: tuple[Evaluation, ...] = ()  # gen_ai.evaluation.result events of the trial's spans
    task_input: str | None = None  # first user input (what a shadow replay sends again), if recorded

    @property
    def wall_time_s(self) -> float:
        """Root span duration in seconds."""
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def actions(self) -> tuple[str, ...]:
        """Ordered action names (metrics.md §3)."""
        return tuple(s.action for s in self.steps)

    @property
    def success(self) -> int | None:
        """1 / 0 for a known outcome, None for unknown."""
        if self.outcome == "success":
            return 1
        if self.outcome == "failure":
            return 0
        return None
