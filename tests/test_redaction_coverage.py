"""Redaction covers everything stored or served (issue 10 item 7), over a real sidecar process.

30 secrets are planted: 25 that the mask pattern matches, in the content attributes of every
convention relyscope reads (GenAI, OpenInference, Vercel AI SDK, Google ADK, Langfuse, Genkit,
OpenAI Agents), in span and event names, a status message, event attributes, plain attributes,
nested maps and arrays, resource values and the scope name; and 5 that only the deny list
catches, under keys whose case differs from the configured entries. None may come back from the
store, from ``/api/v1/trials`` / ``/api/v1/sessions``, or remain in the spool once it is committed.
"""

from __future__ import annotations

import base64
import json
import signal

import httpx

from relyscope.store import Store
from relyscope.testing import start_sidecar
from test_durability import wait_until

TID = "5e" * 16
SECRETS = [f"sk-PLANTED{i:02d}xyzw" for i in range(25)]
DENIED = [f"hunter2-denied-{i}" for i in range(5)]
# h-break: places the first 30 missed — the W3C trace state, a bytes value (stored as hex), an
# attribute key (span, event, resource, nested map), and denied keys inside nested maps
UNUSUAL = [f"sk-UNUSUAL{i:02d}abcd" for i in range(7)]
NESTED_DENIED = [f"hunter2-nested-{i}" for i in range(3)]


def _v(x):
    if isinstance(x, bytes):
        return {"bytesValue": base64.b64encode(x).decode()}
    if isinstance(x, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _v(v)} for k, v in x.items()]}}
    if isinstance(x, list):
        return {"arrayValue": {"values": [_v(v) for v in x]}}
    return {"stringValue": x}


def _attrs(d: dict) -> list[dict]:
    return [{"key": k, "value": _v(v)} for k, v in d.items()]


def _span(sid: int, name: str, attrs: dict, parent: int | None = 1, **extra) -> dict:
    return {"traceId": TID, "spanId": f"{sid:016x}", "parentSpanId": f"{parent:016x}" if parent else "",
            "name": name, "kind": 1, "startTimeUnixNano": str(1_760_000_000_000_000_000 + sid * 1000),
            "endTimeUnixNano": str(1_760_000_000_000_000_000 + sid * 1000 + 500), "attributes": _attrs(attrs),
            **extra}


def _body() -> dict:
    s, u = SECRETS, UNUSUAL
    spans = [
        _span(1, f"invoke_agent support {s[12]}", {"gen_ai.operation.name": "invoke_agent",
                                                  "gen_ai.agent.name": "redact-agent", "relyscope.task.id": "t1",
                                                  "gen_ai.input.messages": f"my key is {s[0]}",
                                                  "gen_ai.output.messages": f"ok {s[24]}",
                                                  "user.email": DENIED[0]}, parent=None,
              status={"code": 2, "message": f"failed with {s[13]}"},
              events=[{"name": f"note {s[15]}", "timeUnixNano": "1760000000000000001",
                       "attributes": _attrs({"exception.message": f"boom {s[14]}", "USER.EMAIL": DENIED[3]})}]),
        _span(2, "execute_tool lookup", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                                         "gen_ai.tool.call.arguments": json.dumps({"q": s[22]}),
                                         "gen_ai.tool.call.result": f"found {s[23]}",
                                         "http.url": f"https://api.example.com/?token={s[16]}",
                                         "nested": {"inner": {"deep": s[17]}}, "listy": ["a", s[18]],
                                         "USER.EMAIL": DENIED[1]}),
        _span(3, "lookup", {"openinference.span.kind": "TOOL", "tool.name": "lookup",
                            "tool_call.function.arguments": json.dumps({"q": s[1]}),
                            "input.value": f"in {s[20]}", "output.value": f"out {s[21]}", "X-Api-Key": DENIED[2]}),
        _span(4, "ai.toolCall", {"ai.toolCall.name": "lookup", "ai.toolCall.args": json.dumps({"q": s[2]}),
                                 "ai.toolCall.result": f"r {s[3]}", "ai.prompt": f"p {s[4]}"}),
        _span(5, "execute_tool lookup", {"gcp.vertex.agent.tool_call_args": json.dumps({"q": s[5]}),
                                         "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}),
        _span(6, "generation", {"langfuse.observation.input": f"i {s[6]}", "langfuse.observation.output": f"o {s[7]}"}),
        _span(7, "genkit step", {"genkit:input": f"i {s[8]}", "genkit:output": f"o {s[9]}"}),
        _span(8, "function lookup", {"tool_arguments": json.dumps({"q": s[10]}), "tool_name": "lookup"}),
        _span(9, "chat m", {"gen_ai.operation.name": "chat", "gen_ai.prompt.0.content": f"c {s[11]}"}),
        _span(10, "unusual", {"auth": f"token {u[0]}".encode(), "binary": b"\xff\x00" + u[1].encode(),
                              f"header.{u[2]}": "x", "map": {f"k-{u[3]}": "v", "ok": ["a", {f"{u[4]}": 1}]},
                              "headers": {"X-Api-Token": NESTED_DENIED[0],
                                          "list": [{"x-api-key": NESTED_DENIED[1]}]},
                              "user": {"email": NESTED_DENIED[2]}},
              traceState=f"vendor={u[5]}",
              events=[{"name": "e", "timeUnixNano": "1760000000000000002",
                       "attributes": _attrs({f"ev.{u[6]}": "v"})}]),
    ]
    return {"resourceSpans": [{
        "resource": {"attributes": _attrs({"service.name": "redact-agent", "deployment.note": f"r {s[19]}",
                                           "User.Email": DENIED[4], f"res.{u[0]}": "r"})},
        "scopeSpans": [{"scope": {"name": f"scope-{s[19]}-x"}, "spans": spans}]}]}


def _leaks(text: str) -> list[str]:
    """Planted secrets in ``text``: as sent, as hex (how a bytes value is stored) or as base64."""
    return [x for x in SECRETS + DENIED + UNUSUAL + NESTED_DENIED
            if x in text or x.encode().hex() in text or base64.b64encode(x.encode()).decode()[:-4] in text]


def test_no_planted_secret_is_stored_served_or_left_in_the_spool(tmp_path):
    sc = start_sidecar(tmp_path, extra_env={
        "RELYSCOPE_REDACT_DENY": json.dumps(["user.email", "x-api-*"]),
        "RELYSCOPE_REDACT_PATTERNS": json.dumps([r"sk-[A-Za-z0-9]{8,}"])})
    try:
        r = httpx.post(sc.otlp_http + "/v1/traces", json=_body(), timeout=30)
        assert r.status_code == 200, r.text
        assert int(r.json().get("partialSuccess", {}).get("rejectedSpans", 0)) == 0
        sc.flush()
        served = sc.get("/api/v1/trials").text + sc.get("/api/v1/sessions").text
        assert _leaks(served) == []
        assert "[REDACTED]" in sc.get("/api/v1/trials").text  # the trial was built from redacted spans
        wait_until(lambda: "relyscope_spool_pending_records 0.0" in sc.get("/metrics").text, what="spool committed")
        spooled = b"".join(p.read_bytes() for p in (tmp_path / "spool").glob("*.seg")).decode("latin-1")
        assert _leaks(spooled) == []
    finally:
        sc.kill(signal.SIGTERM)
    st = Store(f"chdb://{tmp_path}/data")
    try:
        spans = st.query("SELECT * FROM {db}.otel_traces FINAL")
        trials = st.query("SELECT * FROM {db}.trials FINAL")
    finally:
        st.close()
    assert len(spans) == 10 and trials
    assert _leaks(repr(spans) + repr(trials)) == []
    assert repr(spans).count("[REDACTED]") >= 25
