"""The wrappers never break the agent when nothing records: no SDK provider configured at all
(the OTel API's proxy gives non-recording spans), or the SDK switched off by the standard
``OTEL_SDK_DISABLED=true``. Each case runs in a fresh interpreter (the global provider is
process state). Bug: ``record_decision`` directly under a run read ``start_time`` back from the
child span, which a non-recording span does not have (AttributeError in the agent)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SURFACE = textwrap.dedent("""
    import asyncio
    from relyscope.instrumentation import (agent_run, configure, llm_call, record_claimed_success,
        record_confidence, record_decision, record_outcome, tool_call)
    tp = configure("http://127.0.0.1:9", protocol="http/protobuf") if {configure!r} else None
    with agent_run("a", version="1", task_id="t", tracer_provider=tp) as run:
        record_decision("act", reason="plan")
        with tool_call("search", arguments={{"q": 1}}) as t:
            t.set_result("x")
            record_decision("ask")
        with llm_call(model="m") as llm:
            llm.set_usage(input_tokens=1, output_tokens=2)
        record_confidence(0.5)
        record_claimed_success(True)
        record_outcome("success")
    async def main():
        async with agent_run("a", task_id="t2", tracer_provider=tp):
            record_decision("stop")
            async with tool_call("s") as t:
                t.set_result(1)
    asyncio.run(main())
    if tp is not None:
        tp.shutdown()
    print("trace", run.trace_id)
""")


@pytest.mark.parametrize("case", ["no provider", "OTEL_SDK_DISABLED"])
def test_wrappers_work_when_nothing_records(case):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if case == "OTEL_SDK_DISABLED":
        env["OTEL_SDK_DISABLED"] = "true"
    code = _SURFACE.format(configure=case == "OTEL_SDK_DISABLED")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    # nothing recorded: the all-zero (invalid) trace id of the OTel API, not a crash
    assert p.stdout.strip().splitlines()[-1] == "trace " + "0" * 32


def test_configure_names_the_variables_of_an_inconsistent_batch_setting(monkeypatch):
    from relyscope.instrumentation import configure

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "10")
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", raising=False)
    with pytest.raises(ValueError, match="OTEL_BSP_MAX_EXPORT_BATCH_SIZE.*OTEL_BSP_MAX_QUEUE_SIZE"):
        configure("http://127.0.0.1:9", protocol="http/protobuf")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
    configure("http://127.0.0.1:9", protocol="http/protobuf").shutdown()  # consistent: accepted


@pytest.mark.parametrize("env, names, not_named", [
    # each SDK refusal names the variable it was read from (not the batch/queue advice of another)
    ({"OTEL_BSP_SCHEDULE_DELAY": "0"}, ["OTEL_BSP_SCHEDULE_DELAY (now '0')", "milliseconds"],
     ["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"]),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, ["OTEL_BSP_MAX_QUEUE_SIZE (now '0')", "positive integer"],
     ["at most"]),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "0", "OTEL_BSP_SCHEDULE_DELAY": "10"},
     ["OTEL_BSP_MAX_EXPORT_BATCH_SIZE (now '0')", "also set: OTEL_BSP_SCHEDULE_DELAY (now '10')"],
     ["QUEUE"]),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"},  # the SDK's default queue is 2048
     ["OTEL_BSP_MAX_EXPORT_BATCH_SIZE (now '4096') at most OTEL_BSP_MAX_QUEUE_SIZE (now unset: 2048)"], []),
])
def test_configure_names_the_variable_each_refusal_is_about(monkeypatch, env, names, not_named):
    from relyscope.instrumentation import configure

    for k in ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
              "OTEL_BSP_EXPORT_TIMEOUT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as e:
        configure("http://127.0.0.1:9", protocol="http/protobuf")
    for n in names:
        assert n in str(e.value)
    for n in not_named:
        assert n not in str(e.value)
