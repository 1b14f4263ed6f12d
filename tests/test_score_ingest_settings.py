"""``relyscope score`` stores and reports what the sidecar would: the same redaction
(``RELYSCOPE_REDACT_*``) and the same decoder limits (``RELYSCOPE_MAX_ATTRIBUTES``,
``RELYSCOPE_MAX_ATTRIBUTE_LENGTH``), for both decoders, and it says on stderr what was repaired
or redacted. Real processes: the ``relyscope`` CLI, a sidecar (``relyscope.testing``), chDB.

Expected values are worked out from the inputs: the planted secrets of
``test_redaction_coverage`` (30 of them: 25 the pattern matches, 5 only the deny list catches) plus
one in the first user message of a failing run without a task id (its fingerprinted task is a
worst task, labelled with an excerpt of that message); bug cases D14 and D20 (shared/data/bugcases)
for the limits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from conftest import BIN, DATA, start_sidecar
from test_redaction_coverage import DENIED, NESTED_DENIED, SECRETS, UNUSUAL, _attrs, _body

DENY = json.dumps(["user.email", "x-api-*"])
PATTERNS = json.dumps([r"sk-[A-Za-z0-9]{8,}"])
INPUT_SECRET = "sk-PLANTED99inputxyz"
TID2 = "6f" * 16

DUMP = r"""
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
out = {}
for table in ("otel_traces", "trials"):
    q = c.query(f"SELECT * FROM relyscope.{table} FINAL")
    out[table] = [{k: v for k, v in zip(q.column_names, r) if "Ingested" not in k and k != "stored_at"}
                  for r in q.result_rows]
sys.stdout.buffer.write(json.dumps(out, default=repr, ensure_ascii=False).encode())
"""


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env.update(kw)
    return env


def _dump(data_dir) -> dict:
    r = subprocess.run([sys.executable, "-c", DUMP, str(data_dir)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return json.loads(r.stdout)


def _score(files, store_dir, env: dict, fmt: str = "json") -> subprocess.CompletedProcess:
    r = subprocess.run([str(BIN), "score", "--format", fmt, "--n-boot", "0", "--keep-store", str(store_dir),
                        *map(str, files)], capture_output=True, text=True, timeout=300, env=_env(**env))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _failing_run() -> dict:
    """A run with no task id whose first user message holds a secret and whose outcome is a
    failure: its task is fingerprinted from that message and listed among the worst tasks."""
    msgs = json.dumps([{"role": "user", "parts": [{"type": "text",
                                                   "content": f"please use key {INPUT_SECRET} to refund order 7"}]}])
    span = {"traceId": TID2, "spanId": "6f" * 8, "name": "invoke_agent support", "kind": 1,
            "startTimeUnixNano": "1760000001000000000", "endTimeUnixNano": "1760000002000000000",
            "attributes": _attrs({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "redact-agent",
                                  "gen_ai.input.messages": msgs, "relyscope.outcome": "failure"})}
    return {"resourceSpans": [{"resource": {"attributes": _attrs({"service.name": "redact-agent"})},
                               "scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}]}]}


def _leaks(text: str) -> list[str]:
    return [x for x in [*SECRETS, *DENIED, *UNUSUAL, *NESTED_DENIED, INPUT_SECRET]
            if x in text or x.encode().hex() in text]


@pytest.mark.parametrize("decoder", ["fast", "legacy"])
def test_score_redacts_as_the_sidecar_in_store_and_report(tmp_path, decoder):
    f = tmp_path / "secrets.otlp.jsonl"
    f.write_text(json.dumps(_body()) + "\n" + json.dumps(_failing_run()) + "\n")
    env = {"RELYSCOPE_REDACT_DENY": DENY, "RELYSCOPE_REDACT_PATTERNS": PATTERNS,
           "RELYSCOPE_INGEST_DECODER": decoder}
    rep = _score([f], tmp_path / "store", env)
    table = _score([f], tmp_path / "store2", env, fmt="table")
    for out in (rep, table):
        assert _leaks(out.stdout + out.stderr) == []
    [g] = [g for g in json.loads(rep.stdout)["groups"] if g["agent"] == "redact-agent"]
    # the failing run's task: fingerprinted from the *redacted* message, labelled with its excerpt
    labels = [w["label"] for w in g["worst_tasks"]]
    assert "please use key [REDACTED] to refund order 7" in labels, g["worst_tasks"]
    assert "please use key [REDACTED] to refund order 7" in table.stdout
    # 10 spans of the first request + 1 of the second, every one changed by the policy
    # (masked names / values, or a denied key): the first request's spans each carry a secret,
    # the second's root its user message
    assert "ingest: 11 of 11 spans redacted (RELYSCOPE_REDACT_DENY, RELYSCOPE_REDACT_PATTERNS)" in \
        " ".join(rep.stderr.split())
    rows = _dump(tmp_path / "store")
    assert len(rows["otel_traces"]) == 11 and len(rows["trials"]) == 2
    stored = json.dumps(rows, ensure_ascii=False)
    assert _leaks(stored) == []
    assert stored.count("[REDACTED]") >= 26
    assert all("redacted" in r["RelyscopeFlags"] for r in rows["otel_traces"])


# ---- limits: the sidecar's RELYSCOPE_MAX_ATTRIBUTES / RELYSCOPE_MAX_ATTRIBUTE_LENGTH ---------------

LIMITS = {"RELYSCOPE_MAX_ATTRIBUTES": "10", "RELYSCOPE_MAX_ATTRIBUTE_LENGTH": "12"}
CASES = DATA / "bugcases"


def _case_body(name: str) -> dict:
    [req] = json.loads(next(CASES.glob(f"{name}_*.json")).read_text())["requests"]
    return req["body"]


def _repairs(msg: str) -> dict[str, int]:
    """{flag: spans} and {"attributes": n} of a partial-success repair summary."""
    out = {flag: int(n) for n, flag in re.findall(r"(\d+) spans? (\w+) \(", msg)}
    m = re.search(r"(\d+) attributes\)", msg)
    out["attributes"] = int(m.group(1)) if m else 0
    return out


@pytest.fixture(scope="module")
def sidecar_limits(tmp_path_factory):
    """D14 and D20 posted to a sidecar with LIMITS; its replies and stored rows."""
    d = tmp_path_factory.mktemp("limits-sidecar")
    s = start_sidecar(d, extra_env=LIMITS)
    try:
        replies = []
        for name in ("D14", "D20"):
            r = httpx.post(s.otlp_http + "/v1/traces", json=_case_body(name), timeout=60)
            assert r.status_code == 200, r.text
            replies.append(r.json().get("partialSuccess", {}))
        s.flush()
    finally:
        s.kill()
    return {"replies": replies, "rows": _dump(d / "data")}


def _by_span(rows: list[dict]) -> dict:
    return {(r["TraceId"], r["SpanId"]): r for r in rows}


@pytest.mark.parametrize("decoder", ["fast", "legacy"])
def test_score_applies_the_sidecars_attribute_limits(tmp_path, sidecar_limits, decoder):
    files = []
    for name in ("D14", "D20"):
        files.append(tmp_path / f"{name}.otlp.json")
        files[-1].write_text(json.dumps(_case_body(name)))
    r = _score(files, tmp_path / "store", {**LIMITS, "RELYSCOPE_INGEST_DECODER": decoder})
    rows = _dump(tmp_path / "store")
    mine, theirs = _by_span(rows["otel_traces"]), _by_span(sidecar_limits["rows"]["otel_traces"])
    assert mine == theirs  # every stored column of every span, as the sidecar stored it
    # by hand (D20): the root has 135 distinct keys, the LLM span 146; 10 kept of each (the 5 and 6
    # that scoring reads among them) → 125 + 136 = 261 attributes dropped on 2 spans
    root, llm = mine[("2001abababababababababababababab", "2001cdcdcdcdcdcd")], \
        mine[("2001abababababababababababababab", "2002cdcdcdcdcdcd")]
    for row in (root, llm):
        assert len(row["SpanAttributes"]) == 10 and "dropped_attributes" in row["RelyscopeFlags"]
    for k in ("openinference.span.kind", "session.id", "relyscope.task.id", "relyscope.outcome"):
        assert k in root["SpanAttributes"]
    for k in ("llm.model_name", "llm.token_count.prompt", "llm.token_count.completion", "session.id"):
        assert k in llm["SpanAttributes"]
    # D14: the content strings over 12 code points are cut to 12; the identities are kept whole
    tool = mine[("1401abababababababababababababab", "1413cdcdcdcdcdcd")]["SpanAttributes"]
    assert tool["gen_ai.tool.call.id"] == "call_abcdefghijklmnopqrst1"
    # (the case file sends the arguments with their JSON escapes as text: {"q": "\u6ce8…)
    assert tool["gen_ai.tool.call.arguments"] == '{"q": "\\u6ce'
    # stderr names the repairs, summed over the two requests as the sidecar replied them
    line = " ".join(r.stderr.split())
    assert "ingest: accepted with repairs:" in line, r.stderr
    got = _repairs(line)
    want: dict[str, int] = {}
    for reply in sidecar_limits["replies"]:
        for k, v in _repairs(reply.get("errorMessage", "")).items():
            want[k] = want.get(k, 0) + v
    assert got == want
    assert got["dropped_attributes"] == 2 and got["attributes"] == 261
    # D14: 4 spans carry content over 12 code points (each run's LLM and tool span); D20: the
    # LLM span's kept history — at least those 4
    assert got["truncated_attribute"] >= 4


def test_score_says_which_spans_were_rejected_and_why(tmp_path):
    ok = _failing_run()
    bad = json.loads(json.dumps(ok))
    sp = bad["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    sp["traceId"], sp["spanId"] = "7a" * 16, ""  # no span id: the sidecar rejects it (span_id_missing)
    f = tmp_path / "mixed.otlp.jsonl"
    f.write_text(json.dumps(ok) + "\n" + json.dumps(bad) + "\n")
    r = _score([f], tmp_path / "store", {})
    line = " ".join(r.stderr.split())
    assert "1 spans rejected (span_id_missing 1), 1 stored" in line, r.stderr
    assert "spanId" in line  # the reason the sidecar would answer in partial success
    assert len(_dump(tmp_path / "store")["otel_traces"]) == 1
