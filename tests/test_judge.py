"""Issue 5: the optional LLM judge — off by default, consulted last through an OpenAI-compatible
endpoint. There is no LLM here, so the endpoint is a loopback stand-in that speaks the real
chat-completions wire format and decides by a rule the test states."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import start_sidecar

from relyscope.model import Op, Step, Trial
from relyscope.scorers.judge import judge_request, parse_judge_reply

TRACE = "{:032x}"


def _reply(content: str) -> dict:
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def test_parse_judge_reply_cases():
    ev = parse_judge_reply(_reply('Sure: {"success": true, "score": 0.9, "explanation": "done"}'))
    assert (ev.label, ev.score, ev.explanation) == ("pass", 0.9, "done")
    assert parse_judge_reply(_reply('{"success": false}')).label == "fail"
    assert parse_judge_reply(_reply('{"score": 0.2}')).score == 0.2
    for bad in (_reply("no json"), _reply('{"score": 7}'), _reply("[1]"), {"choices": []}, {}):
        assert parse_judge_reply(bad) is None


def test_judge_request_lists_the_trajectory():
    t = Trial(trial_id="t", trace_id="a", root_span_id="r", task_id="refund-1", task_id_source="attribute",
              agent_name="ag", agent_version="1", run_kind="production", outcome="unknown", outcome_source=None,
              outcome_score=None, claimed_success=None, confidence=None, conversation_id=None, start_ns=0,
              end_ns=1, steps=(Step(span_id="s", parent_span_id="r", action="issue_refund", op=Op.TOOL,
                                    name="execute_tool issue_refund", start_ns=0, end_ns=1,
                                    arguments={"amount": 30}, error="timeout"),))
    body = judge_request(t, "m")
    text = body["messages"][1]["content"]
    assert body["model"] == "m" and "task: refund-1" in text
    assert '1. issue_refund args={"amount": 30} error=timeout' in text


class _Judge(BaseHTTPRequestHandler):
    calls: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Judge.calls.append((self.path, self.headers.get("authorization"), body))
        prompt = body["messages"][1]["content"]
        verdict = {"success": "task: good" in prompt, "explanation": "rule of the stand-in"}
        data = json.dumps(_reply(json.dumps(verdict))).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def judge_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    _Judge.calls = []
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _runs():
    spans = []
    for i, (task, outcome) in enumerate([("good", None), ("bad", None), ("bad", "success")]):
        attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                 {"key": "gen_ai.agent.name", "value": {"stringValue": "judged"}},
                 {"key": "relyscope.task.id", "value": {"stringValue": task}}]
        if outcome:
            attrs.append({"key": "relyscope.outcome", "value": {"stringValue": outcome}})
        t0 = 1_760_000_000_000_000_000 + i * 10**10
        spans.append({"traceId": TRACE.format(i + 1), "spanId": "{:016x}".format(i + 1), "name": "invoke_agent judged",
                      "kind": 1, "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 10**9), "attributes": attrs})
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}


def test_judge_decides_only_undecided_trials(tmp_path, judge_server):
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_JUDGE_URL": judge_server, "RELYSCOPE_JUDGE_API_KEY": "k1"})
    try:
        assert httpx.post(sc.otlp_http + "/v1/traces", json=_runs(), timeout=30).status_code == 200
        sc.flush()
        trials = {t["trace_id"]: t for t in sc.trials(agent="judged")}
    finally:
        sc.kill()
    assert trials[TRACE.format(1)]["outcome"] == "success"
    assert trials[TRACE.format(2)]["outcome"] == "failure"
    assert trials[TRACE.format(1)]["outcome_source"] == "evaluation:relyscope.judge"
    assert trials[TRACE.format(3)]["outcome_source"] != "evaluation:relyscope.judge"  # verified: never judged
    assert len(_Judge.calls) == 2  # only the two undecided trials
    assert all(c[0] == "/v1/chat/completions" and c[1] == "Bearer k1" for c in _Judge.calls)


def test_judge_is_off_by_default(sidecar, judge_server):
    assert httpx.post(sidecar.otlp_http + "/v1/traces", json=_runs(), timeout=30).status_code == 200
    sidecar.flush()
    trials = {t["trace_id"]: t for t in sidecar.trials(agent="judged")}
    assert trials[TRACE.format(1)]["outcome"] == "unknown"
    assert _Judge.calls == []
