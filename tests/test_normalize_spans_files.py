"""Normalization of the spans recorded from real emitters (/work/shared/data/spans/).

Every expectation below was written by reading the OTLP/JSON file by hand (attribute values copied
from the file, totals added by hand), not from the code's output. Spans are decoded with
``relyscope.collector.otlp.decode_json``.
"""

from __future__ import annotations


import pytest

from relyscope.collector import otlp
from relyscope.collector.normalize import normalize
from relyscope.model import Op
from conftest import DATA

SPANS_DIR = (DATA / "spans")

# (file, span_id) -> expected SpanSemantics fields (fields not named here must be None / empty,
# see _ALWAYS_EMPTY_UNLESS_GIVEN).
EXPECTED: dict[tuple[str, str], dict] = {
    ("pydantic-ai-tool-call.otlp.json", "1234567890abcdef"): dict(
        op=Op.TOOL,
        convention="pydantic_ai",
        tool_name="roulette_wheel",
        tool_call_id="call_idvalue",
        tool_arguments={"square": 18},  # tool_arguments: "{\"square\": 18}"
        tool_result="winner",  # not JSON: kept as the string
    ),
    ("google-adk-tool-call.otlp.json", "89a16f45ba5e6d36"): dict(
        op=Op.TOOL,
        convention="adk",
        provider="gcp.vertex.agent",
        tool_name="bake_cake",
        tool_call_id="adk-chocolate-caked",
        # ADK's own tool-call attributes win over OpenInference input.value/output.value
        tool_arguments={"query": "much duplo"},
        tool_result={"result": "particularly juicy cake"},
        conversation_id="test-session-333bff8e",  # session.id
    ),
    ("vercel-ai-sdk-v7-genai-semconv.otlp.json", "1234567890abcded"): dict(
        op=Op.LLM,
        convention="genai",
        model="test-model",
        first_user_input="hello",
    ),
    ("vercel-ai-sdk-v7-genai-semconv.otlp.json", "1234567890abcdee"): dict(
        op=Op.TOOL,
        convention="genai",
        tool_name="get_weather",
        tool_arguments={"location": "Berlin"},
        tool_result={"temperature": 21},
    ),
    ("openllmetry-openai-chat.otlp.json", "aabf16e416ae4952"): dict(
        op=Op.LLM,  # llm.request.type = chat
        convention="openllmetry",
        provider="OpenAI",
        model="gpt-3.5-turbo-0125",  # response model (request was gpt-3.5-turbo)
        input_tokens=14,  # gen_ai.usage.prompt_tokens (legacy name)
        output_tokens=173,  # gen_ai.usage.completion_tokens
        total_tokens=187,  # llm.usage.total_tokens (= 14 + 173)
        finish_reasons=("stop",),
        first_user_input="What is LLM Observability?",
    ),
    ("openlit-openai-chat.otlp.json", "b904bffb20be6d7e"): dict(
        op=Op.LLM,
        convention="openlit",
        provider="openai",
        model="gpt-3.5-turbo",
        input_tokens=14,
        output_tokens=96,
        total_tokens=110,
        cost_usd=0.000151,
        finish_reasons=("stop",),
        first_user_input="What is LLM Observability?",  # event text "user: What is ..."
    ),
    ("semantic-kernel-1.55-chat-events.otlp.json", "b904bffb20be6d7e"): dict(
        op=Op.LLM,
        convention="semantic_kernel",
        model="gpt-4-0613",
        finish_reasons=("stop",),
        first_user_input="What is the capital of France?",
    ),
    ("genkit-generation.otlp.json", "0102030405060708"): dict(
        op=Op.LLM,
        convention="genkit",
        model="gpt-5-mini",  # genkit:name "openai/gpt-5-mini"
        provider="openai",
        input_tokens=1618,
        output_tokens=337,
        reasoning_tokens=320,  # thoughtsTokens
        total_tokens=1955,
        finish_reasons=("stop",),
        first_user_input="Output should be in JSON format.",
    ),
    ("langfuse-sdk-generation.otlp.json", "57f02554179741bd"): dict(
        op=Op.LLM,  # observation type "generation"
        convention="langfuse",
        model="gpt-4o",
        input_tokens=123,
        output_tokens=456,
        total_tokens=579,  # 123 + 456
        cost_usd=0.0021,  # 0.0001 + 0.002
        conversation_id="my-session",
        first_user_input="hello",
    ),
    ("langfuse-sdk-generation.otlp.json", "dfe387fea7ef3b02"): dict(
        op=Op.UNKNOWN,  # observation type "span": not a scored step
        convention="langfuse",
    ),
    ("string-encoded-int-resource-attributes.otlp.json", "b904bffb20be6d7e"): dict(
        op=Op.UNKNOWN,  # no attributes at all
        convention="unknown",
    ),
}

_CHECKED = (
    "convention agent_name agent_id agent_version tool_name tool_call_id tool_arguments "
    "tool_result model provider input_tokens output_tokens cache_read_tokens cache_write_tokens "
    "reasoning_tokens total_tokens cost_usd conversation_id first_user_input error_type "
    "handoff_target decision outcome task_id"
).split()
_TUPLES = ("finish_reasons", "requested_tool_calls", "evaluations")


def _load(name: str):
    result = otlp.decode_json((SPANS_DIR / name).read_bytes())
    assert result.rejected == 0, result.errors
    return {s.span_id: s for s in result.spans}


def test_every_file_is_covered():
    files = {p.name for p in SPANS_DIR.glob("*.otlp.json")}
    assert files == {f for f, _ in EXPECTED}


@pytest.mark.parametrize(("file", "span_id"), sorted(EXPECTED), ids=lambda v: str(v))
def test_recorded_span(file, span_id):
    spans = _load(file)
    assert span_id in spans
    sem = normalize(spans[span_id])
    exp = EXPECTED[(file, span_id)]
    assert sem.op is exp["op"]
    for f in _CHECKED:
        want = exp.get(f)
        got = getattr(sem, f)
        if isinstance(want, float):
            assert got == pytest.approx(want), f
        else:
            assert got == want, f
    for f in _TUPLES:
        assert getattr(sem, f) == exp.get(f, ()), f
    # no root spans in these files: nothing is nested/separate, agent name never from resource
    assert sem.separate_trial is False


def test_file_span_counts():
    counts = {f: 0 for f, _ in EXPECTED}
    for f, _ in EXPECTED:
        counts[f] += 1
    for f, n in counts.items():
        assert len(_load(f)) == n, f
