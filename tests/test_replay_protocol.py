"""The agent's side of the replay protocol (relyscope.instrumentation.replay) with a real proxy
process speaking the envelope, real OTel SDK spans, and ReplayApp over ASGI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from relyscope.instrumentation import agent_run, tool_call
from relyscope.instrumentation.replay import (PROTOCOL, ReplayApp, SandboxMiss, ToolFault, ToolHTTPError,
                                              ToolTimeout, run_replay)

# a proxy stub: answers each call with the next envelope of argv[1] (JSON list); bounded lifetime
_PROXY = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
answers = json.loads(sys.argv[1]); calls = []
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        calls.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
        body = json.dumps(answers[min(len(calls), len(answers)) - 1]).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        body = json.dumps(calls).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
threading.Timer(60, srv.shutdown).start()
srv.serve_forever()
"""


@pytest.fixture
def proxy():
    procs = []

    def start(answers):
        p = subprocess.Popen([sys.executable, "-c", _PROXY, json.dumps(answers)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return f"http://127.0.0.1:{int(p.stdout.readline())}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def request(url, **kw):
    return {"protocol": PROTOCOL, "replay_id": "rep-1", "shadow_of": "prod-trial", "run_kind": "shadow",
            "task": {"task_id": "refund-7", "input": "refund ORD-7"},
            "perturbation": {"family": kw.get("family", "fault"), "strength": None, "seed": 11},
            "traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "tool_proxy": {"url": url + "/calls"}}


def provider():
    exp = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exp))
    return tp, exp


def test_caught_fault_still_fails_the_span_and_the_tool_never_runs(proxy):
    """Bug: a fault caught inside `with tool_call()` left the span looking successful, so the
    replay's side effects counted a call that never happened."""
    url = proxy([{"outcome": "error", "error": {"type": "timeout", "message": "recorded"}},
                 {"outcome": "result", "match": "exact", "result": {"ok": True}, "recorded": True}])
    tp, exp = provider()
    ran = []

    def agent(task):
        with agent_run("refund-agent", task_id="ignored", run_kind="production", tracer_provider=tp):
            for _ in range(2):
                with tool_call("issue_refund", side_effect="irreversible", arguments={"id": 7}) as t:
                    try:
                        return t.execute(lambda: ran.append(1))
                    except ToolFault:
                        continue

    reply = run_replay(request(url), agent, tracer_provider=tp)
    assert reply == {"replay_id": "rep-1", "status": "completed", "trace_id": "ab" * 16, "error": None}
    assert ran == []  # the real tool never ran
    spans = {s.name: s for s in exp.get_finished_spans() if s.name.startswith("invoke")}
    tools = [s for s in exp.get_finished_spans() if s.name.startswith("execute_tool")]
    assert tools[0].attributes["error.type"] == "timeout" and tools[0].status.is_ok is False
    assert "error.type" not in tools[1].attributes and tools[1].attributes["relyscope.sandbox.recorded"] is True
    root = spans["invoke_agent refund-agent"]
    a = root.attributes
    assert (a["relyscope.run.kind"], a["relyscope.task.id"], a["relyscope.shadow.of"], a["relyscope.replay.id"],
            a["relyscope.perturbation.family"], a["relyscope.perturbation.seed"]) == \
        ("shadow", "refund-7", "prod-trial", "rep-1", "fault", 11)
    # the root continues the sidecar's trace (W3C traceparent)
    assert format(root.context.trace_id, "032x") == "ab" * 16 and format(root.parent.span_id, "016x") == "cd" * 8


def test_decorated_tool_gets_each_fault_kind(proxy):
    url = proxy([{"outcome": "fault", "fault": {"type": "rate_limit", "status": 429, "retry_after_s": 2,
                                                "message": "429 Too Many Requests"}},
                 {"outcome": "fault", "fault": {"type": "timeout", "message": "timed out"}},
                 {"outcome": "fault", "fault": {"type": "partial_response", "body": '{"ok": tr'}},
                 {"outcome": "sandbox_miss", "message": "no recording"}])
    tp, exp = provider()
    seen = []

    @tool_call("get_order", side_effect="read")
    def get_order(order_id):
        raise AssertionError("the real tool must not run in a replay")

    def agent(task):
        with agent_run("a", tracer_provider=tp):
            for _ in range(4):
                try:
                    seen.append(get_order("ORD-7"))
                except ToolFault as e:
                    seen.append(e)

    run_replay(request(url), agent, tracer_provider=tp)
    assert isinstance(seen[0], ToolHTTPError) and seen[0].status == 429 and seen[0].retry_after_s == 2
    assert isinstance(seen[1], ToolTimeout) and isinstance(seen[1], TimeoutError)
    assert seen[2] == '{"ok": tr'  # a cut-off body is what the agent gets, as from a real service
    assert isinstance(seen[3], SandboxMiss)
    tools = [s for s in exp.get_finished_spans() if s.name.startswith("execute_tool")]
    assert [s.attributes.get("error.type") for s in tools] == ["rate_limit", "timeout", None, "sandbox_miss"]
    assert [s.attributes.get("relyscope.fault.type") for s in tools] == ["rate_limit", "timeout", "partial_response", None]
    calls = httpx.get(url).json()
    assert [c["index"] for c in calls] == [0, 1, 2, 3] and calls[0]["arguments"] == {"order_id": "ORD-7"}


def test_outside_a_replay_tools_run_for_real():
    tp, exp = provider()

    @tool_call("get_order")
    def get_order(order_id):
        return {"id": order_id}

    with agent_run("a", tracer_provider=tp):
        assert get_order("X") == {"id": "X"}
        with tool_call("t") as t:
            assert t.execute(lambda: 5) == 5


def test_unreachable_proxy_is_a_sandbox_miss_not_a_live_call():
    tp, _ = provider()
    ran = []

    @tool_call("write_file", side_effect="write")
    def write_file():
        ran.append(1)

    def agent(task):
        with agent_run("a", tracer_provider=tp):
            write_file()

    reply = run_replay(request("http://127.0.0.1:9"), agent, tracer_provider=tp)
    assert reply["status"] == "failed" and "SandboxMiss" in reply["error"] and ran == []


def test_replay_app_over_asgi():
    tp, _ = provider()
    app = ReplayApp(lambda task: None, tracer_provider=tp, exclusive=False)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            ok = await c.post("/relyscope/replay", json={**request("http://127.0.0.1:9"), "tool_proxy": {}})
            bad = await c.post("/relyscope/replay", json={"replay_id": "x"})
            garbage = await c.post("/relyscope/replay", content=b"{nope")
            health = await c.get("/relyscope/healthz")
            return ok, bad, garbage, health

    ok, bad, garbage, health = asyncio.run(go())
    assert ok.status_code == 200 and ok.json()["status"] == "completed"
    assert bad.status_code == 400 and "task" in bad.json()["error"]
    assert garbage.status_code == 400
    assert health.json()["protocol"] == PROTOCOL


def test_threads_the_agent_starts_cannot_escape_the_sandbox(proxy):
    """Bug: a tool called from a thread the agent started (thread pool, run_in_executor) lost the
    replay context and ran for real. In a sandbox process (ReplayApp's default) such a call is
    answered by the one running replay's proxy."""
    import concurrent.futures
    import threading

    from relyscope.instrumentation import replay as R

    url = proxy([{"outcome": "result", "match": "exact", "result": {"ok": True}, "recorded": True}])
    tp, _ = provider()
    ran = []

    @tool_call("issue_refund", side_effect="irreversible")
    def issue_refund(amount):
        ran.append(amount)
        return {"ok": "for real"}

    def agent(task):
        with agent_run("a", tracer_provider=tp):
            with concurrent.futures.ThreadPoolExecutor(2) as pool:  # no context copied
                out = list(pool.map(issue_refund, [1, 2]))
            t = threading.Thread(target=lambda: out.append(issue_refund(3)))
            t.start()
            t.join()
            return out

    R.sandbox_process(True)
    try:
        run_replay(request(url), agent, tracer_provider=tp)
        assert ran == []
        # no replay running at all: a tool call in a sandbox process is refused, not run
        with pytest.raises(SandboxMiss):
            issue_refund(4)
        assert ran == []
    finally:
        R.sandbox_process(False)
    # a normal process: tools run for real outside replays
    assert issue_refund(5) == {"ok": "for real"} and ran == [5]


def test_replay_app_makes_its_process_a_sandbox():
    from relyscope.instrumentation import replay as R

    try:
        ReplayApp(lambda task: None)
        assert R._SANDBOX_PROCESS is True
    finally:
        R.sandbox_process(False)
    ReplayApp(lambda task: None, exclusive=False)
    assert R._SANDBOX_PROCESS is False
