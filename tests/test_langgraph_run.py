"""A real LangGraph ReAct agent (``langgraph.prebuilt.create_react_agent``) on LangChain's fake chat
model (no network), traced by OpenInference's LangChain instrumentation through the OTel SDK's
OTLP exporter to a real sidecar. Two graphs of one service are two agents, named after the graph
(the instrumentation names the root AGENT span after it; the nested AGENT spans are graph nodes
named ``agent``); a graph left with LangGraph's default name falls back to ``service.name``.

The script is the oracle: the model first asks for ``get_weather`` (10 in / 3 out tokens), then
answers (12 in / 4 out).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import start_sidecar

if importlib.util.find_spec("openinference.instrumentation.langchain") is None:  # pragma: no cover
    pytest.skip("openinference-instrumentation-langchain not installed", allow_module_level=True)

SCRIPT = r'''
import sys
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

tp = TracerProvider(resource=Resource.create({"service.name": "graph-service"}))
tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1], insecure=True)))
LangChainInstrumentor().instrument(tracer_provider=tp)


@tool
def get_weather(city: str) -> str:
    """Weather of a city."""
    return "sunny in " + city


class ScriptedChat(GenericFakeChatModel):
    def bind_tools(self, tools, **kw):  # the fake model takes no tools; the script holds the calls
        return self


for name in sys.argv[2:]:
    msgs = iter([
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_w1"}],
                  usage_metadata={"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}),
        AIMessage(content="It is sunny.", usage_metadata={"input_tokens": 12, "output_tokens": 4, "total_tokens": 16}),
    ])
    graph = create_react_agent(ScriptedChat(messages=msgs), [get_weather], name=None if name == "-" else name)
    graph.invoke({"messages": [("user", "weather in Paris?")]})
tp.force_flush()
tp.shutdown()
'''


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> list[dict]:
    s = start_sidecar(tmp_path_factory.mktemp("langgraph"))
    try:
        r = subprocess.run([sys.executable, "-c", SCRIPT, f"127.0.0.1:{s.grpc_port}", "weather-agent",
                            "news-agent", "-"], capture_output=True, text=True, timeout=180,
                           cwd=str(tmp_path_factory.getbasetemp()))
        assert r.returncode == 0, r.stderr[-3000:]
        assert s.post("/api/v1/flush").status_code == 200
        return sorted(s.trials(), key=lambda t: t["start_ns"])
    finally:
        s.kill()


def test_each_graph_is_its_own_agent(trials):
    assert [t["agent_name"] for t in trials] == ["weather-agent", "news-agent", "graph-service"]


def test_steps_and_tokens_of_a_react_run(trials):
    for t in trials:
        assert t["actions"] == ["llm", "get_weather", "llm"]
        assert (t["model_calls"], t["tool_calls"], t["tool_errors"]) == (2, 1, 0)
        assert (t["input_tokens"], t["output_tokens"], t["total_tokens"]) == (22, 7, 29)
        assert t["status"] == "complete" and "missing_tool_span" not in t["flags"]
