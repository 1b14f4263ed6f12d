"""The real OpenAI Agents SDK (``openai-agents``) run with a scripted fake model (no network),
traced by each OTel bridge — OpenInference's (``openinference-instrumentation-openai-agents``) and
the OpenTelemetry contrib one (``opentelemetry-instrumentation-openai-agents-v2``) — through the
OTel SDK's OTLP exporter to a real sidecar: one trial per run with the entry agent's name, steps in
order (model call, tool, handoff, the next agent's model call), the tool error, and the tokens the
fake model reported.

The script is the whole oracle: agent ``triage`` (tool ``lookup_order``, handoff to ``billing``)
is answered first with a call of ``lookup_order``, then with the transfer call; ``billing`` is
answered with a call of ``refund`` (which raises), then with a final message. Each model response
reports 10 input / 3 output tokens.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from conftest import start_sidecar

IN_TOK, OUT_TOK = 10, 3

# tests/agents (a test package) shadows the SDK's ``agents`` module inside this process, so the
# agent runs in a child process of its own
try:
    importlib.metadata.distribution("openai-agents")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    pytest.skip("openai-agents not installed", allow_module_level=True)

SCRIPT = textwrap.dedent(f"""
    import asyncio, sys
    from agents import Agent, Runner, function_tool, generation_span, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    class ScriptedModel(Model):
        # answers each call with the next scripted item: ("call", tool, call id) or ("say", text)
        def __init__(self, script):
            self.script, self.i = script, 0

        async def get_response(self, *args, **kwargs):
            step = self.script[self.i]
            self.i += 1
            # as the SDK's own chat-completions model does: a generation span with the usage
            with generation_span(model="scripted-model", usage={{"input_tokens": {IN_TOK},
                                                                "output_tokens": {OUT_TOK}}}):
                return self._answer(step)

        def _answer(self, step):
            if step[0] == "call":
                out = [ResponseFunctionToolCall(arguments="{{}}", call_id=step[2], name=step[1],
                                                type="function_call", id="fc_%d" % self.i, status="completed")]
            else:
                out = [ResponseOutputMessage(id="msg_%d" % self.i, role="assistant", status="completed",
                                             type="message", content=[ResponseOutputText(
                                                 text=step[1], type="output_text", annotations=[])])]
            return ModelResponse(output=out, usage=Usage(requests=1, input_tokens={IN_TOK},
                                 output_tokens={OUT_TOK}, total_tokens={IN_TOK + OUT_TOK}),
                                 response_id="resp_%d" % self.i)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    tp = TracerProvider(resource=Resource.create({{"service.name": "support-service"}}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1], insecure=True)))
    set_tracing_disabled(False)
    if sys.argv[2] == "openinference":
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    else:  # the OpenTelemetry contrib bridge
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    OpenAIAgentsInstrumentor().instrument(tracer_provider=tp)

    @function_tool
    def lookup_order() -> str:
        \"\"\"Look the order up.\"\"\"
        return "order 42: paid twice"

    @function_tool
    def refund() -> str:
        \"\"\"Refund the order.\"\"\"
        raise RuntimeError("payment provider down")

    billing = Agent(name="billing", tools=[refund],
                    model=ScriptedModel([("call", "refund", "call_r1"), ("say", "Refund failed, sorry.")]))
    triage = Agent(name="triage", tools=[lookup_order], handoffs=[billing],
                   model=ScriptedModel([("call", "lookup_order", "call_l1"),
                                        ("call", "transfer_to_billing", "call_t1")]))
    result = asyncio.run(Runner.run(triage, input="I was charged twice for order 42"))
    tp.force_flush()
    tp.shutdown()
    print(result.final_output)
""")


BRIDGES = [b for b, mod in (("openinference", "openinference.instrumentation.openai_agents"),
                             ("contrib", "opentelemetry.instrumentation.openai_agents"))
           if importlib.util.find_spec(mod) is not None]


@pytest.fixture(scope="module", params=BRIDGES)
def run(request, tmp_path_factory) -> dict:
    s = start_sidecar(tmp_path_factory.mktemp("oai-agents"))
    try:
        r = subprocess.run([sys.executable, "-c", SCRIPT, f"127.0.0.1:{s.grpc_port}", request.param],
                           capture_output=True,
                           text=True, timeout=120, cwd=str(tmp_path_factory.getbasetemp()))
        assert r.returncode == 0, r.stderr[-3000:]
        assert s.post("/api/v1/flush").status_code == 200
        return {"final": r.stdout.strip(), "trials": s.trials(),
                "groups": {g["agent"] for g in s.report()["groups"]}}
    finally:
        s.kill()


def test_one_trial_named_after_the_entry_agent(run):
    assert run["final"] == "Refund failed, sorry."
    assert len(run["trials"]) == 1, [(t["agent_name"], t["actions"]) for t in run["trials"]]
    [t] = run["trials"]
    assert t["agent_name"] == "triage"  # not service.name
    assert run["groups"] == {"triage"}


def test_steps_in_order_with_the_handoff_and_the_tool_error(run):
    [t] = run["trials"]
    # triage: model → lookup_order → model → handoff; billing: model → refund (raises) → model
    assert t["actions"] == ["llm", "lookup_order", "llm", "handoff:billing", "llm", "refund", "llm"]
    [refund] = [s for s in t["steps"] if s["action"] == "refund"]
    assert refund["error"] is not None
    assert (t["model_calls"], t["tool_calls"], t["tool_errors"]) == (4, 2, 1)
    assert "missing_tool_span" not in t["flags"]


def test_tokens_are_what_the_model_reported(run):
    [t] = run["trials"]
    assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == (4 * IN_TOK, 4 * OUT_TOK,
                                                                          4 * (IN_TOK + OUT_TOK))
