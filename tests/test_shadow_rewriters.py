"""Prompt rewriters (metrics.md §4 "prompt"): the rule rewriter is deterministic, changes the text
at every strength and never touches protected tokens; the LLM rewriter speaks OpenAI
chat-completions to a real HTTP server started here, with its budget, errors and cost."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from relyscope.shadow.rewriters import (
    PROMPT_STRENGTHS,
    LLMRewriter,
    PromptRewriter,
    RewriteBudgetExceeded,
    RewriteRejected,
    RewriteUnavailable,
    RuleRewriter,
    prompt_variants,
    protected_tokens,
)

PROMPTS = [
    "Please find order ORD-1042 for customer jane.doe@example.com and check the delivery of 3 items.",
    "If the parcel is late, cancel the order 55512 and email me at bob@shop.io. Thanks!",
    "Cancel my booking `bk_778` because the flight was delayed by 2 hours.",
    'I want to buy the "Deluxe Plan" quickly, see https://example.com/plans?id=9 for details.',
    "Check if the refund for invoice INV-2026-03 went through before you reply.",
    "Hi, can you tell me about the status of my account? I received a message that something is wrong "
    "with my billing address and I want to fix it soon.",
    "Please run ```SELECT * FROM orders WHERE id = 7``` and send me the wrong rows, user_id 42 only.",
]

# Written independently of the module: code spans, double-quoted strings, URLs and emails (trailing
# sentence punctuation excluded), then any token with a digit, underscore or hyphen.
_TEST_PROTECTED = re.compile(
    r"```.*?```|`[^`]+`|\"[^\"]*\""
    r"|https?://\S+?(?=[.,!?]*(?:\s|$))"
    r"|\S+@\S+?(?=[.,!?]*(?:\s|$))"
    r"|[^\s\"`]*[\d_-][^\s\"`]*?(?=[.,!?]*(?:\s|$))",
    re.DOTALL,
)


def protected(text: str) -> Counter[str]:
    return Counter(_TEST_PROTECTED.findall(text))


def test_test_regex_finds_what_it_should() -> None:
    assert protected(PROMPTS[0]) == Counter(["ORD-1042", "jane.doe@example.com", "3"])
    assert protected(PROMPTS[3]) == Counter(['"Deluxe Plan"', "https://example.com/plans?id=9"])
    assert protected(PROMPTS[6]) == Counter(["```SELECT * FROM orders WHERE id = 7```", "user_id", "42"])


def test_module_protected_tokens_agree() -> None:
    for p in PROMPTS:
        assert Counter(protected_tokens(p)) == protected(p)

# ---------------------------------------------------------------------------- rule rewriter


@pytest.mark.parametrize("strength", PROMPT_STRENGTHS)
def test_every_strength_changes_the_text_and_keeps_protected_tokens(strength: str) -> None:
    r = RuleRewriter()
    for text in PROMPTS:
        for seed in range(30):
            out = r.rewrite(text, seed=seed, strength=strength)
            assert out != text, (strength, seed, text)
            assert protected(out) == protected(text), (strength, seed, out)


@pytest.mark.parametrize("strength", PROMPT_STRENGTHS)
def test_deterministic_per_seed(strength: str) -> None:
    a, b = RuleRewriter(), RuleRewriter()
    for text in PROMPTS:
        outs = [a.rewrite(text, seed=s, strength=strength) for s in range(20)]
        assert outs == [b.rewrite(text, seed=s, strength=strength) for s in range(20)]
    rich = PROMPTS[5]
    assert len({a.rewrite(rich, seed=s, strength=strength) for s in range(20)}) >= 3


def test_mild_is_word_swaps_only() -> None:
    r = RuleRewriter()
    text = "Please find the broken items quickly."
    for seed in range(20):
        out = r.rewrite(text, seed=seed, strength="mild")
        # same number of sentences, same punctuation, swaps from the documented examples only
        assert out.endswith(".") and out.count(".") == 1
        words = set(re.findall(r"[a-z]+", out.lower()))
        assert words <= {"please", "kindly", "find", "locate", "the", "broken", "damaged", "items", "products",
                         "quickly", "promptly", "fast"}


def test_medium_reorders_clauses() -> None:
    r = RuleRewriter()
    outs = {r.rewrite("If the parcel is late, cancel the order.", seed=s, strength="medium") for s in range(10)}
    assert all(o.startswith("Cancel the order") and o.endswith("if the parcel is late.")
               for o in outs), outs
    back = {r.rewrite("Cancel the order if the parcel is late.", seed=s, strength="medium") for s in range(10)}
    assert all(o.startswith("If the parcel is late, ") for o in back), back


def test_medium_never_moves_an_if_that_means_whether() -> None:
    r = RuleRewriter()
    for text in ("Check if the parcel arrived.", "Tell me if the refund went through.",
                 "Let me know if the parcel is lost."):
        for seed in range(10):
            assert not r.rewrite(text, seed=seed, strength="medium").startswith("If")


def test_strong_adds_a_frame_around_the_medium_rewrite() -> None:
    r = RuleRewriter()
    text = "Cancel my booking `bk_778` because the flight was delayed by 2 hours."
    for seed in range(20):
        out = r.rewrite(text, seed=seed, strength="strong")
        assert len(out) > len(text) + 15
        assert "`bk_778`" in out and "2 hours" in out


def test_naturalistic_stays_close() -> None:
    r = RuleRewriter()
    for text in PROMPTS:
        for seed in range(50):
            out = r.rewrite(text, seed=seed, strength="naturalistic")
            d = Levenshtein.distance(out, text)
            assert 1 <= d <= 0.3 * len(text), (d, out)


def test_naturalistic_uses_abbreviations_and_typos() -> None:
    r = RuleRewriter()
    text = "Please tell me because you know my account address before tomorrow."
    outs = [r.rewrite(text, seed=s, strength="naturalistic") for s in range(30)]
    assert any("pls" in o.lower() for o in outs) and any(" u " in o for o in outs)
    words = set(text.lower().rstrip(".").split())
    abbrev = {"pls", "u", "bc", "kno", "acct", "addr", "bfr", "tmrw"}
    assert any(set(o.lower().rstrip(".").split()) - words - abbrev for o in outs)  # a typo somewhere


def test_nothing_rewritable_comes_back_unchanged() -> None:
    r = RuleRewriter()
    for text in ("", "   ", "ORD-1042 12345 jane@example.com", '"quoted only"'):
        for strength in PROMPT_STRENGTHS[:2]:
            assert r.rewrite(text, seed=1, strength=strength) == text


_vocab = st.sampled_from(["please", "find", "the", "order", "check", "if", "late", "cancel", "items", "because",
                          "you", "Thanks", "my", "broken", "delivery", "is", "and", "send", "hi"])
_prot = st.sampled_from(["ORD-77", "12,345.50", "$19.99", "user_id", "ana@x.org", "https://a.io/x?q=1",
                         '"keep me"', "`code x`", "v2", "2026-03-01", "e-mail"])
_sentence = st.lists(st.one_of(_vocab, _vocab, _prot), min_size=1, max_size=14).map(" ".join)
_text = st.lists(_sentence.map(lambda s: s + st_choice(s)), min_size=1, max_size=3).map(" ".join)


def st_choice(s: str) -> str:
    return "." if len(s) % 2 else "?"


@settings(max_examples=200, deadline=None)
@given(text=_text, seed=st.integers(0, 2**40), strength=st.sampled_from(PROMPT_STRENGTHS))
def test_property_protected_tokens_survive(text: str, seed: int, strength: str) -> None:
    out = RuleRewriter().rewrite(text, seed=seed, strength=strength)
    assert protected(out) == protected(text)
    assert out == RuleRewriter().rewrite(text, seed=seed, strength=strength)


def test_rule_rewriter_is_a_prompt_rewriter_and_validates() -> None:
    assert isinstance(RuleRewriter(), PromptRewriter)
    with pytest.raises(ValueError, match="unknown prompt strength"):
        RuleRewriter().rewrite("hi", seed=0, strength="wild")
    with pytest.raises(TypeError):
        RuleRewriter().rewrite(None, seed=0, strength="mild")  # type: ignore[arg-type]

# ---------------------------------------------------------------------------- variants


def test_prompt_variants_distinct_and_different_from_input() -> None:
    r = RuleRewriter()
    for strength in PROMPT_STRENGTHS:
        v = prompt_variants(PROMPTS[5], j=5, seed=3, strength=strength, rewriter=r)
        assert len(v) == 5 and len(set(v)) == 5 and PROMPTS[5] not in v, (strength, v)
        assert v == prompt_variants(PROMPTS[5], j=5, seed=3, strength=strength, rewriter=r)
        assert v != prompt_variants(PROMPTS[5], j=5, seed=4, strength=strength, rewriter=r)


def test_prompt_variants_edges() -> None:
    r = RuleRewriter()
    assert prompt_variants("ORD-1 42", j=3, seed=0, strength="mild", rewriter=r) == ["ORD-1 42"] * 3
    few = prompt_variants("Fix it.", j=4, seed=0, strength="mild", rewriter=r)  # one swappable word
    assert few == ["Repair it."] * 4
    with pytest.raises(ValueError, match="j must"):
        prompt_variants("hi", j=0, seed=0, strength="mild", rewriter=r)

# ---------------------------------------------------------------------------- LLM rewriter


class _Server:
    """A tiny OpenAI chat-completions endpoint on 127.0.0.1 (stdlib http.server in a thread)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                mode = outer.mode
                if mode == "slow":
                    time.sleep(1.0)
                if mode == "500":
                    return self._send(500, b'{"error": {"message": "upstream overloaded"}}')
                if mode == "html":
                    return self._send(200, b"<html><body>Bad Gateway</body></html>", "text/html")
                text = body["messages"][-1]["content"]
                openers = ["Kindly,", "Hello!", "Quick one:", "Hi there,", "Excuse me,", "Dear support,", "Hey,"]
                content = f"{openers[body['seed'] % len(openers)]} {text}"
                if mode == "alter":
                    content = content.replace("1042", "1043")
                reply: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                                         "choices": [{"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant", "content": content}}]}
                if mode != "nousage":
                    reply["usage"] = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
                self._send(200, json.dumps(reply).encode())

            def _send(self, status: int, data: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.stop()


@pytest.fixture
def fresh(server: _Server) -> _Server:
    server.mode = "ok"
    server.requests.clear()
    return server


def test_llm_request_shape_and_reply(fresh: _Server) -> None:
    with LLMRewriter(fresh.base_url + "/", "rewriter-small", api_key="sk-test") as llm:
        out = llm.rewrite(PROMPTS[0], seed=7, strength="strong")
    assert out == "Kindly, " + PROMPTS[0]  # seed 7 % 7 openers -> the first
    (req,) = fresh.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "rewriter-small" and body["seed"] == 7 and body["n"] == 1
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == PROMPTS[0]
    assert "persona" in body["messages"][0]["content"] and "exactly as written" in body["messages"][0]["content"]


def test_llm_usage_and_cost_counted(fresh: _Server) -> None:
    with LLMRewriter(fresh.base_url, "m", price_per_1k_input_tokens=0.5, price_per_1k_output_tokens=1.5) as llm:
        assert (llm.calls, llm.input_tokens, llm.output_tokens) == (0, 0, 0)
        llm.rewrite(PROMPTS[1], seed=1, strength="mild")
        llm.rewrite(PROMPTS[1], seed=2, strength="mild")
        assert (llm.calls, llm.input_tokens, llm.output_tokens) == (2, 80, 24)
        # 80 / 1000 * 0.5 + 24 / 1000 * 1.5 = 0.04 + 0.036
        assert math.isclose(llm.cost_usd, 0.076)
        ended = llm.new_cycle()
        assert (ended.calls, ended.failed_calls, ended.input_tokens) == (2, 0, 80)
        assert math.isclose(ended.cost_usd, 0.076)
        assert (llm.calls, llm.input_tokens, llm.cost_usd) == (0, 0, 0.0)


def test_llm_unknown_stays_unknown(fresh: _Server) -> None:
    with LLMRewriter(fresh.base_url, "m") as llm:  # no prices
        llm.rewrite(PROMPTS[1], seed=1, strength="mild")
        assert llm.input_tokens == 40 and llm.cost_usd is None
    fresh.mode = "nousage"
    with LLMRewriter(fresh.base_url, "m", price_per_1k_input_tokens=0.5, price_per_1k_output_tokens=1.5) as llm:
        llm.rewrite(PROMPTS[1], seed=1, strength="mild")
        assert (llm.calls, llm.input_tokens, llm.output_tokens, llm.cost_usd) == (1, None, None, None)
        fresh.mode = "ok"
        llm.rewrite(PROMPTS[1], seed=2, strength="mild")
        assert llm.input_tokens is None and llm.cost_usd is None  # one unknown call makes the sum unknown


def test_llm_budget_exhaustion(fresh: _Server) -> None:
    with LLMRewriter(fresh.base_url, "m", max_calls_per_cycle=2) as llm:
        llm.rewrite(PROMPTS[0], seed=1, strength="mild")
        llm.rewrite(PROMPTS[0], seed=2, strength="mild")
        with pytest.raises(RewriteBudgetExceeded, match="2 calls per cycle"):
            llm.rewrite(PROMPTS[0], seed=3, strength="mild")
        assert len(fresh.requests) == 2 and llm.calls == 2  # the refused call was never sent
        with pytest.raises(RewriteBudgetExceeded):
            prompt_variants(PROMPTS[0], j=5, seed=0, strength="mild", rewriter=llm)
        llm.new_cycle()
        llm.rewrite(PROMPTS[0], seed=3, strength="mild")
        assert len(fresh.requests) == 3


def test_llm_http_500_is_unavailable_and_counted(fresh: _Server) -> None:
    fresh.mode = "500"
    with LLMRewriter(fresh.base_url, "m", max_calls_per_cycle=1) as llm:
        with pytest.raises(RewriteUnavailable, match="HTTP 500.*upstream overloaded"):
            llm.rewrite(PROMPTS[0], seed=1, strength="mild")
        u = llm.usage()
        assert (u.calls, u.failed_calls) == (1, 1)
        with pytest.raises(RewriteBudgetExceeded):  # a failed request still used the budget
            llm.rewrite(PROMPTS[0], seed=1, strength="mild")


def test_llm_malformed_reply_and_altered_tokens(fresh: _Server) -> None:
    with LLMRewriter(fresh.base_url, "m") as llm:
        fresh.mode = "html"
        with pytest.raises(RewriteUnavailable, match="malformed"):
            llm.rewrite(PROMPTS[0], seed=1, strength="mild")
        fresh.mode = "alter"
        with pytest.raises(RewriteRejected, match=r"lost \['ORD-1042'\], added \['ORD-1043'\]"):
            llm.rewrite(PROMPTS[0], seed=1, strength="mild")


def test_llm_network_error_and_timeout(fresh: _Server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with LLMRewriter(f"http://127.0.0.1:{port}/v1", "m") as llm:
        with pytest.raises(RewriteUnavailable, match="ConnectError"):
            llm.rewrite("hi", seed=0, strength="mild")
    fresh.mode = "slow"
    with LLMRewriter(fresh.base_url, "m", timeout_s=0.2) as llm:
        t0 = time.monotonic()
        with pytest.raises(RewriteUnavailable, match="Timeout"):
            llm.rewrite("hi", seed=0, strength="mild")
        assert time.monotonic() - t0 < 0.9


def test_llm_variants_distinct(fresh: _Server) -> None:
    with LLMRewriter(fresh.base_url, "m") as llm:
        v = prompt_variants(PROMPTS[2], j=5, seed=11, strength="medium", rewriter=llm)
        assert len(set(v)) == 5 and all(x.endswith(PROMPTS[2]) for x in v)
        assert isinstance(llm, PromptRewriter)


@pytest.mark.parametrize("kwargs, match", [
    ({"base_url": "127.0.0.1:8000"}, "base_url"),
    ({"model": ""}, "model"),
    ({"max_calls_per_cycle": -1}, "max_calls_per_cycle"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"price_per_1k_input_tokens": -1.0}, "price_per_1k_input_tokens"),
])
def test_llm_validation(kwargs: dict, match: str) -> None:
    args = {"base_url": "http://127.0.0.1:1/v1", "model": "m"} | kwargs
    with pytest.raises(ValueError, match=match):
        LLMRewriter(**args)


def test_rule_rewriter_is_linear_in_one_long_token():
    """Bug: the e-mail pattern restarted at every character of a long word (32 k characters took
    ~37 s and stalled the shadow thread). Compared with a text of many short words of the same
    length, measured in the same run, not against a clock budget."""
    import time

    from relyscope.shadow.rewriters import RuleRewriter

    rw = RuleRewriter()
    t0 = time.perf_counter()
    rw.rewrite("a" * 32_000, seed=1, strength="strong")
    long_word = time.perf_counter() - t0
    t0 = time.perf_counter()
    rw.rewrite("ab " * 10_667, seed=1, strength="strong")
    words = time.perf_counter() - t0
    assert long_word < 20 * words + 0.05
