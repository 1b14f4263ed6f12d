"""Instrumentation overhead: relyscope's wrappers against a bare OTel SDK span and a peer's decorators.

One *run* = one agent span with five tool spans under it, the shape of a small agent run. Every
variant exports through the same pipeline (one SDK ``TracerProvider``, ``SimpleSpanProcessor``,
``InMemorySpanExporter``, cleared after every batch), so the figures differ only by what the
instrumentation itself does:

- ``bare``: ``tracer.start_as_current_span`` with the same GenAI attributes relyscope sets;
- ``relyscope``: ``agent_run`` + 5 × ``tool_call`` (no arguments) — and ``relyscope+args``, each
  tool call with arguments and a result (JSON-encoded content attributes, redaction hook unset);
- ``bare+args``: the bare spans with the same arguments/result JSON-encoded by hand;
- ``openinference``: OpenInference's ``OITracer`` decorators (``@tracer.agent`` / ``@tracer.tool``,
  openinference-instrumentation 0.1.72, the `frameworks` extra), arguments passed to the tool.

Each repetition times every variant once (interleaved, so drift hits all alike) over ``--runs``
runs; the figure is the median over ``--reps`` repetitions, in µs per run, and its ratio to
``bare`` (``relyscope+args`` and ``openinference`` to ``bare+args``).

Run: ``.venv/bin/python bench/bench_instrumentation.py [--runs 2000 --reps 7]`` (about 30 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relyscope.instrumentation import agent_run, tool_call

ARGS = {"order_id": 42, "amount": 30.0, "currency": "EUR"}
RESULT = {"ok": True, "refund_id": "r-1"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("bench")

    def bare() -> None:
        with tracer.start_as_current_span("invoke_agent support", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support",
                "gen_ai.invocation.is_nested": False, "relyscope.task.id": "t"}):
            for i in range(5):
                with tracer.start_as_current_span("execute_tool lookup", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                        "gen_ai.tool.type": "function"}):
                    pass

    def bare_args() -> None:
        with tracer.start_as_current_span("invoke_agent support", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support",
                "gen_ai.invocation.is_nested": False, "relyscope.task.id": "t"}):
            for i in range(5):
                with tracer.start_as_current_span("execute_tool lookup", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                        "gen_ai.tool.type": "function",
                        "gen_ai.tool.call.arguments": json.dumps(ARGS)}) as s:
                    s.set_attribute("gen_ai.tool.call.result", json.dumps(RESULT))

    def rs() -> None:
        with agent_run("support", task_id="t", tracer_provider=tp):
            for i in range(5):
                with tool_call("lookup"):
                    pass

    def rs_args() -> None:
        with agent_run("support", task_id="t", tracer_provider=tp):
            for i in range(5):
                with tool_call("lookup", arguments=ARGS) as t:
                    t.set_result(RESULT)

    variants = {"bare": bare, "bare+args": bare_args, "relyscope": rs, "relyscope+args": rs_args}
    try:
        from openinference.instrumentation import OITracer, TraceConfig

        oi = OITracer(tp.get_tracer("bench-oi"), config=TraceConfig())

        @oi.tool
        def lookup(order_id: int, amount: float, currency: str) -> dict:
            return RESULT

        @oi.agent
        def support_agent(task: str) -> None:
            for i in range(5):
                lookup(**ARGS)

        variants["openinference"] = lambda: support_agent("t")
    except ImportError:
        print("openinference-instrumentation not installed (frameworks extra): skipped")

    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm-up
        for _ in range(200):
            fn()
        exporter.clear()
    for _ in range(a.reps):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for i in range(a.runs):
                fn()
                if i % 100 == 99:
                    exporter.clear()
            times[name].append((time.perf_counter() - t0) / a.runs * 1e6)
            exporter.clear()
    med = {k: statistics.median(v) for k, v in times.items()}
    base = {"bare": "bare", "relyscope": "bare", "bare+args": "bare+args", "relyscope+args": "bare+args",
            "openinference": "bare+args"}
    print(f"{a.runs} runs × {a.reps} repetitions; one run = 1 agent span + 5 tool spans")
    print(f"{'variant':<16}{'µs/run (median)':>18}{'ratio':>10}  (to)")
    for k, v in med.items():
        print(f"{k:<16}{v:>18.1f}{v / med[base[k]]:>10.2f}  {base[k]}")
    trace.get_tracer_provider()  # keep the global provider untouched


if __name__ == "__main__":
    main()
