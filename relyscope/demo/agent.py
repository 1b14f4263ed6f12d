"""A simulated customer-service agent (no LLM) instrumented with relyscope's wrappers.

Deterministic given ``seed``: every (task, trial) draws from its own ``random.Random`` seeded with
the string ``"{seed}:{task_id}:{trial}"`` (string seeds are hashed with SHA-512 by ``random``, so
the stream does not depend on PYTHONHASHSEED). Span times come from a simulated clock
(:class:`SimClock`): a run starts at the wall clock and each model and tool call lasts a latency
drawn from the run's own latency stream (sped up 100×), so durations — and every metric read from
them, C_res and the reliability index R — repeat for a seed; only the absolute timestamps move
(and the ids, unless :class:`SeededIdGenerator` is used).

Each task has a tool plan, a per-call transient-fault probability (timeouts, HTTP 500s; retried up
to twice with a ``recover`` decision) and a probability that the final action is right. The catalog
spans always-succeeding tasks (``order-status``), flaky ones (``refund``, ``cancel-order``) and
mostly failing ones (``exchange-item``, ``price-adjustment``), so pass^k differs across tasks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import TracerProvider

from relyscope.instrumentation import (
    agent_run,
    llm_call,
    record_claimed_success,
    record_confidence,
    record_decision,
    record_outcome,
    tool_call,
)

__all__ = ["DEMO_MODEL", "DEMO_PROVIDER", "TASKS", "DemoTask", "SimClock", "ToolStep", "run_demo",
           "task_by_id", "task_entities", "task_request"]

DEMO_MODEL = "sim-support-1"
DEMO_PROVIDER = "relyscope.demo"
OUTCOME_SOURCE = "demo_env_check"
MAX_RETRIES = 2
P_CONFIRM = 0.85
"""Probability the agent asks the user to confirm before an irreversible tool."""


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool of a task's plan: name, side effect (none/read/write/irreversible), arg keys."""

    name: str
    side_effect: str
    arg_keys: tuple[str, ...] = ("order_id",)


@dataclass(frozen=True, slots=True)
class DemoTask:
    """A support task: user request, tool plan, fault rate per call, P(final action right)."""

    task_id: str
    request: str
    steps: tuple[ToolStep, ...]
    p_correct: float
    p_fault: float


_GET_ORDER = ToolStep("get_order", "read")
_GET_CUSTOMER = ToolStep("get_customer", "read", ("customer_id",))

TASKS: tuple[DemoTask, ...] = (
    DemoTask("order-status", "Where is my order?", (_GET_ORDER,), 1.0, 0.0),
    DemoTask(
        "track-shipment",
        "My parcel has not moved for days.",
        (_GET_ORDER, ToolStep("track_shipment", "read", ("tracking_id",))),
        0.97,
        0.04,
    ),
    DemoTask(
        "update-email",
        "Please change my e-mail address.",
        (_GET_CUSTOMER, ToolStep("update_email", "write", ("customer_id", "email"))),
        0.95,
        0.05,
    ),
    DemoTask(
        "address-change",
        "I moved; ship my open order to the new address.",
        (_GET_CUSTOMER, _GET_ORDER, ToolStep("update_address", "write", ("order_id", "address"))),
        0.8,
        0.08,
    ),
    DemoTask(
        "refund",
        "The blender arrived broken, I want my money back.",
        (
            _GET_ORDER,
            ToolStep("check_refund_policy", "read"),
            ToolStep("issue_refund", "irreversible", ("order_id", "amount")),
        ),
        0.6,
        0.12,
    ),
    DemoTask(
        "cancel-order",
        "Cancel the order I placed this morning.",
        (_GET_ORDER, ToolStep("cancel_order", "irreversible", ("order_id", "reason"))),
        0.55,
        0.1,
    ),
    DemoTask(
        "exchange-item",
        "Swap the shoes for one size larger.",
        (
            _GET_ORDER,
            ToolStep("check_inventory", "read", ("sku",)),
            ToolStep("create_exchange", "write", ("order_id", "sku")),
            ToolStep("issue_refund", "irreversible", ("order_id", "amount")),
        ),
        0.3,
        0.15,
    ),
    DemoTask(
        "price-adjustment",
        "It went on sale the day after I bought it; refund the difference.",
        (
            _GET_ORDER,
            ToolStep("lookup_promotions", "read", ("sku",)),
            ToolStep("apply_credit", "irreversible", ("customer_id", "amount")),
        ),
        0.15,
        0.08,
    ),
)

_FAULTS = (
    ("timeout", "upstream timed out after 10 s"),
    ("http_500", "HTTP 500 Internal Server Error"),
)

#: How the final action goes wrong when the agent is wrong: the argument it gets wrong.
_WRONG = {"amount": lambda v: round(v * 0.8, 2), "sku": lambda v: v[:-1] + "0", "reason": lambda v: "other",
          "email": lambda v: "wrong@example.com", "address": lambda v: "1 Wrong Way", "order_id": lambda v: v + "0",
          "customer_id": lambda v: v + "0", "tracking_id": lambda v: v + "0"}


def _arg_value(key: str, rng: random.Random) -> Any:
    makers: dict[str, Callable[[], Any]] = {
        "order_id": lambda: f"ORD-{rng.randint(10000, 99999)}",
        "customer_id": lambda: f"CUST-{rng.randint(1000, 9999)}",
        "tracking_id": lambda: f"TRK{rng.randint(10**8, 10**9 - 1)}",
        "email": lambda: f"user{rng.randint(1, 999)}@example.com",
        "address": lambda: f"{rng.randint(1, 200)} Main St",
        "amount": lambda: round(rng.uniform(5, 250), 2),
        "reason": lambda: rng.choice(["changed_mind", "ordered_by_mistake"]),
        "sku": lambda: f"SKU-{rng.randint(100, 999)}",
    }
    return makers[key]()


class SimClock:
    """The span times of one simulated run, in ns since the Unix epoch.

    Starts at the wall clock (``start_ns``, default ``time.time_ns()``); :meth:`llm` and
    :meth:`tool` advance it by a latency drawn from ``random.Random(f"latency:{key}")`` — a stream
    of its own, so the run's behaviour draws are the same with or without it — and :meth:`gap` by
    the agent's own work between two calls. Modelled latencies: a model call 0.25 s + 18 ms per
    output token + 0.05 ms per input token, ×0.85–1.15; a tool call 40–350 ms, one that timed out
    2–3 s; a gap 1–5 ms. The clock runs :attr:`SPEEDUP` times faster than that: a simulated run
    takes ~1 ms of real time, so at the modelled speed its spans would end up to a minute after
    the wall clock (backends such as Tempo refuse spans that far ahead, and the shadow sampler's
    quiet period counts from a trial's end); sped up, a run ends within ~0.1–1.5 s of it. With
    real clock times instead, a run's durations were its ~1 ms of jitter, so C_res (wall time is
    one of its resources, metrics.md §3) and R differed between two runs of one seed."""

    #: simulated seconds per second of the span clock
    SPEEDUP = 100.0

    def __init__(self, key: str, start_ns: int | None = None):
        self._rng = random.Random(f"latency:{key}")
        self.now = time.time_ns() if start_ns is None else int(start_ns)

    def _advance(self, seconds: float) -> int:
        """Move :attr:`now` on by ``seconds`` of modelled latency (scaled by :attr:`SPEEDUP`)."""
        self.now += int(seconds * 1e9 / self.SPEEDUP)
        return self.now

    def llm(self, input_tokens: int, output_tokens: int) -> int:
        """End of a model call started at :attr:`now` (and the new :attr:`now`)."""
        return self._advance((0.25 + 0.018 * output_tokens + 0.00005 * input_tokens) * self._rng.uniform(0.85, 1.15))

    def tool(self, error_type: str | None) -> int:
        """End of a tool call started at :attr:`now`; ``error_type`` ``timeout`` takes 2–3 s."""
        return self._advance(self._rng.uniform(2.0, 3.0) if error_type == "timeout" else self._rng.uniform(0.04, 0.35))

    def gap(self) -> int:
        """The agent's own work between two calls."""
        return self._advance(self._rng.uniform(0.001, 0.005))


def _model(clock: SimClock, input_tokens: int, output_tokens: int, finish: str, decision: tuple[str, str] | None = None,
           cache_read_tokens: int | None = None) -> None:
    """One simulated model call from :attr:`SimClock.now`, with its usage, finish reason and
    (optional) decision ``(kind, reason)``."""
    with llm_call(DEMO_MODEL, provider=DEMO_PROVIDER, start_time=clock.now) as llm:
        llm.set_usage(input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cache_read_tokens)
        llm.set_response(model=DEMO_MODEL, finish_reasons=[finish])
        if decision is not None:
            record_decision(decision[0], reason=decision[1])
        llm.set_end_time(clock.llm(input_tokens, output_tokens))
    clock.gap()


def _chat(rng: random.Random, context_tokens: int, finish: str, clock: SimClock) -> int:
    """One simulated model call; returns the grown context size (tokens)."""
    out = rng.randint(20, 180)
    _model(clock, context_tokens, out, finish, cache_read_tokens=int(context_tokens * rng.uniform(0.3, 0.8)))
    return context_tokens + out + rng.randint(40, 400)


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))



class ToolServiceError(Exception):
    """A simulated tool service failure (production only): ``error_type`` timeout / http_500."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


def task_entities(task_id: str, seed: int) -> dict[str, Any]:
    """The task's ids and values, the same for every trial of the task (they are in its request)."""
    rng = random.Random(f"{seed}:{task_id}:entities")
    keys = ("order_id", "customer_id", "tracking_id", "email", "address", "amount", "reason", "sku")
    return {k: _arg_value(k, rng) for k in keys}


def task_request(task: DemoTask, entities: dict[str, Any]) -> str:
    """The user's request as the agent receives it (ids inline, as a customer would write them)."""
    return f"{task.request} Order {entities['order_id']}, customer {entities['customer_id']}."


def _parse_entities(text: str, fallback: dict[str, Any]) -> dict[str, Any]:
    """Ids the agent reads from the request (a rewritten prompt keeps them); the rest from context."""
    import re

    out = dict(fallback)
    for key, pat in (("order_id", r"ORD-\d+"), ("customer_id", r"CUST-\d+")):
        m = re.search(pat, text or "")
        if m:
            out[key] = m.group(0)
    return out


def _service(step: ToolStep, args: dict[str, Any], rng: random.Random, p_fault: float) -> Callable[[], Any]:
    """The simulated tool service behind one call: fails with ``p_fault`` (timeout / HTTP 500)."""
    fault = rng.random() < p_fault
    kind = rng.choice(_FAULTS)

    def call() -> Any:
        if fault:
            raise ToolServiceError(*kind)
        if step.name == "get_order":
            return {"order_id": args.get("order_id"), "status": "delivered", "order_total": args.get("amount", 42.0),
                    "placed_at": "2026-11-20T10:00:00Z", "sku": args.get("sku")}
        return {"ok": True, "tool": step.name, **args}

    return call


def _usable(result: Any) -> dict | None:
    """The agent's check of a tool result: a dict (a JSON string is decoded; ``{"status", "data"}``
    wrappers are unwrapped); None for a broken, empty or partial body."""
    import json

    if isinstance(result, str):
        try:
            result = json.loads(result)
        except ValueError:
            return None
    if isinstance(result, dict) and set(result) == {"status", "data"} and isinstance(result["data"], dict):
        result = result["data"]
    return result if isinstance(result, dict) and result else None


def _run_once(
    task: DemoTask,
    task_id: str,
    trial: int,
    *,
    seed: int,
    agent_name: str,
    version: str,
    tracer_provider: TracerProvider | None,
    request: str | None = None,
    quality: float = 0.0,
) -> bool:
    """One run. In a shadow replay (``current_replay()`` set) the tools are answered by the
    sidecar's sandbox, the randomness is drawn from the replay's seed (so two versions replaying
    the same task see the same draws), and the run does not verify its own outcome — the sidecar
    grades it by its side effects. ``quality`` shifts P(final action right) (a worse version)."""
    from relyscope.instrumentation.replay import ToolFault, current_replay

    replay = current_replay()
    ent = task_entities(task_id, seed)
    key = f"{seed}:{task_id}:{trial}" if replay is None else f"{seed}:{task_id}:replay:{replay.seed}"
    rng = random.Random(key)
    request = request if request is not None else task_request(task, ent)
    ent = _parse_entities(request, ent)
    clock = SimClock(key)
    with agent_run(
        agent_name,
        task_id=task_id,
        version=version,
        run_kind="production",
        conversation_id=f"demo-{seed}-{task_id}-{trial}",
        tracer_provider=tracer_provider,
        input=request,
        start_time=clock.now,
    ) as run:
        clock.gap()
        ctx = rng.randint(600, 1200)
        _model(clock, ctx, rng.randint(30, 120), "tool_calls", ("act", f"plan for: {task.request}"))
        ctx += rng.randint(100, 300)
        correct = rng.random() < _clamp01(task.p_correct + quality)

        gave_up = False
        steps = task.steps + (ToolStep("send_reply", "write", ("customer_id", "resolution")),)
        for step in steps:
            if step.side_effect == "irreversible" and rng.random() < P_CONFIRM:
                _model(clock, ctx, rng.randint(15, 60), "stop", ("confirm", f"{step.name} cannot be undone"))
                ctx += rng.randint(30, 90)
            args = {k: (task_id if k == "resolution" else ent[k]) for k in step.arg_keys}
            final = step is steps[-2] if len(steps) > 1 else True
            if not correct and (final or step.name == "send_reply"):
                key = next((k for k in step.arg_keys if k in _WRONG), None)
                if step.name == "send_reply":
                    args["resolution"] = "unresolved"
                elif key is not None:
                    args[key] = _WRONG[key](args[key])
            for attempt in range(MAX_RETRIES + 1):
                error_type = None
                service = _service(step, args, rng, task.p_fault)
                with tool_call(
                    step.name,
                    side_effect=step.side_effect,
                    call_id=f"call_{rng.getrandbits(48):012x}",
                    arguments=args,
                    start_time=clock.now,
                ) as tool:
                    try:
                        got = _usable(tool.execute(service))
                        if got is None:
                            error_type = "bad_response"
                        elif step.name == "get_order" and "order_total" not in got:
                            error_type = "unexpected_schema"  # the agent reads order_total, nothing else
                    except ToolServiceError as e:
                        error_type = e.error_type
                        tool.set_error(e.error_type, str(e))
                    except ToolFault as e:  # what the sandbox injected (or could not answer)
                        error_type = e.error_type
                    tool.set_end_time(clock.tool(error_type))
                clock.gap()
                if error_type is None:
                    break
                if attempt < MAX_RETRIES:
                    # the retry decision sits on the model call that chose it
                    ctx += rng.randint(30, 80)
                    _model(clock, ctx, rng.randint(10, 40), "tool_calls",
                           ("recover", f"retry {step.name} after {error_type}"))
                else:
                    _model(clock, ctx, rng.randint(20, 60), "stop", ("stop", f"{step.name} keeps failing"))
                    gave_up = True
            if gave_up:
                break
            ctx = _chat(rng, ctx, "tool_calls" if step is not steps[-1] else "stop", clock)

        success = (not gave_up) and correct
        # Claims: a successful agent says so; a failing one over-claims sometimes (more often
        # when it did not notice the failure than when it gave up).
        claimed = success or rng.random() < (0.15 if gave_up else 0.6)
        confidence = _clamp01(rng.gauss(0.82, 0.08) if success else rng.gauss(0.58, 0.17))
        record_claimed_success(claimed)
        record_confidence(round(confidence, 4))
        if replay is None:  # the environment check exists in production only
            record_outcome(success, source=OUTCOME_SOURCE)
        run.set_end_time(clock.gap())
    return success


def task_by_id(task_id: str) -> DemoTask:
    """The catalog task of ``task_id`` (``refund``, ``refund-2`` …). Raises KeyError."""
    base = task_id
    for t in TASKS:
        if base == t.task_id or (base.startswith(t.task_id + "-") and base[len(t.task_id) + 1:].isdigit()):
            return t
    raise KeyError(task_id)


class SeededIdGenerator(IdGenerator):
    """Trace and span ids from ``random.Random(f"ids:{seed}")`` (an OTel SDK ``IdGenerator``):
    with it the demo's production trial ids — and so the shadow plan's seeds, derived from them —
    are the same on every run, and the demo's numbers and verdicts repeat exactly. For the demo
    only: real agents keep the SDK's random ids. ``stream``: another sequence for the same seed
    (``relyscope demo-agent`` passes the agent version, so a second version sent with the same
    seed adds its trials instead of replacing the first version's)."""

    def __init__(self, seed: int, stream: str = ""):
        self._rng = random.Random(f"ids:{seed}" + (f":{stream}" if stream else ""))

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


def run_demo(
    tracer_provider: TracerProvider,
    *,
    tasks: int = 8,
    trials: int = 5,
    seed: int = 7,
    agent_name: str = "support-agent",
    version: str = "1.0.0",
    on_run: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run ``tasks`` × ``trials`` simulated agent runs, emitting spans through ``tracer_provider``
    (``on_run(runs done)`` after each run: a progress bar).

    Tasks are taken from :data:`TASKS` in order; beyond its length the catalog repeats with
    ``-2``, ``-3`` … suffixed task ids. Returns
    ``{"runs": int, "successes": int, "by_task": {task_id: {"runs": int, "successes": int}}}``.
    Calls ``tracer_provider.force_flush()`` at the end when available. Raises ValueError for
    ``tasks`` or ``trials`` < 1.
    """
    if tasks < 1 or trials < 1:
        raise ValueError("tasks and trials must be >= 1")
    by_task: dict[str, dict[str, int]] = {}
    done = 0
    for t in range(tasks):
        task = TASKS[t % len(TASKS)]
        lap = t // len(TASKS)
        task_id = task.task_id if lap == 0 else f"{task.task_id}-{lap + 1}"
        counts = by_task.setdefault(task_id, {"runs": 0, "successes": 0})
        for trial in range(trials):
            ok = _run_once(
                task,
                task_id,
                trial,
                seed=seed,
                agent_name=agent_name,
                version=version,
                tracer_provider=tracer_provider,
            )
            counts["runs"] += 1
            counts["successes"] += int(ok)
            done += 1
            if on_run is not None:
                on_run(done)
    flush = getattr(tracer_provider, "force_flush", None)
    if callable(flush):
        flush()
    return {
        "runs": sum(c["runs"] for c in by_task.values()),
        "successes": sum(c["successes"] for c in by_task.values()),
        "by_task": by_task,
    }
