"""Redaction never merges identities (task ids and the other exact values scoring reads), and
``RELYSCOPE_REDACT_ALLOW`` is a setting, in the sidecar and in ``relyscope score``.

Before the fix a pattern matching a task id replaced it by the one ``[REDACTED]``: two tasks
became one (pass^k over the merged task) — here ``acct-1111`` and ``acct-2222`` with the pattern
``acct-[0-9]{4}``. Now each match in an identity value becomes ``[REDACTED:<hex>]``, the first 16
hex digits of HMAC-SHA256(key, match): computed here with the standard library ``hmac`` from the
key the sidecar kept (``<spool dir>.redact-key``) or the one given (``RELYSCOPE_REDACT_KEY``).

Spans come from the real OTel SDK: its OTLP/HTTP exporter to a sidecar process, its spans written
as OTLP/JSON for ``relyscope score``. Every table of the chDB store is read back for the secrets.

Expected scores, by hand: task A has 2 trials, both successes; task B 2 trials, both failures.
Two tasks: success_rate = 2/4 = 0.5, pass^2 = mean(C(2,2)/C(2,2), C(0,2)/C(2,2)) = (1 + 0)/2 = 0.5,
pass@2 = mean(1 − C(0,2)/C(2,2), 1 − C(2,2)/C(2,2)) = (1 + 0)/2 = 0.5. Merged into one task of 4
trials with 2 successes, pass^2 would be C(2,2)/C(4,2) = 1/6 and tasks 1.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from conftest import BIN, start_sidecar
from relyscope.instrumentation.otlp_json import OTLPJsonFileExporter

PATTERNS = json.dumps([r"acct-[0-9]{4}"])
SECRETS = ("acct-1111", "acct-2222")
KEY = "identity-test-key-0123456789"
# (task id, session id, outcome) of the four runs
RUNS = [("acct-1111", "sess-acct-1111", "success"), ("acct-1111", "sess-acct-1111", "success"),
        ("acct-2222", "sess-acct-2222", "failure"), ("acct-2222", "sess-acct-2222", "failure")]

# every row of every table of the store (not only the ones scoring reads), as JSON text
DUMP_ALL = r"""
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
tables = c.query("SELECT database, name FROM system.tables WHERE database NOT IN "
                 "('system', 'INFORMATION_SCHEMA', 'information_schema')").result_rows
out = {}
for db, name in tables:
    q = c.query(f"SELECT * FROM `{db}`.`{name}`")
    out[f"{db}.{name}"] = [dict(zip(q.column_names, r)) for r in q.result_rows]
sys.stdout.buffer.write(json.dumps(out, ensure_ascii=False, default=repr).encode())
"""


def _token(key: bytes, secret: str) -> str:
    return "[REDACTED:" + hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()[:16] + "]"


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELYSCOPE_")}
    env.update(kw)
    return env


def _dump_all(data_dir) -> dict:
    r = subprocess.run([sys.executable, "-c", DUMP_ALL, str(data_dir)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return json.loads(r.stdout)


def _emit(exporter, extra: dict | None = None, first_run: int = 0) -> None:
    """The four runs through the OTel SDK: one root agent span each, with a tool call under it."""
    tp = TracerProvider(resource=Resource.create({"service.name": "acct-agent", "service.version": "1.0"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("identity-test")
    for i, (task, session, outcome) in enumerate(RUNS):
        with tracer.start_as_current_span("invoke_agent support", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support",
                "relyscope.task.id": task, "relyscope.trial.id": f"{task}-run{i + first_run}",
                "gen_ai.conversation.id": session, "relyscope.outcome": outcome,
                "gen_ai.input.messages": f"please close {task}", **(extra or {})}):
            with tracer.start_as_current_span("execute_tool lookup", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                    "gen_ai.tool.call.arguments": json.dumps({"account": task})}):
                pass
    tp.shutdown()


def _group(rep: dict) -> dict:
    [g] = [g for g in rep["groups"] if g["agent"] == "support"]
    return g


def _assert_two_tasks(g: dict) -> None:
    assert g["tasks"] == 2 and g["trials"] == 4, g
    m = g["metrics"]
    assert m["success_rate"]["value"] == 0.5
    assert m["pass^2"]["value"] == 0.5 and m["pass^2"]["n_tasks"] == 2
    assert m["pass@2"]["value"] == 0.5


def _assert_no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert leaked == [], leaked


def test_sidecar_keeps_tasks_apart_and_stores_no_secret(tmp_path):
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_REDACT_PATTERNS": PATTERNS})
    try:
        _emit(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces", timeout=30))
        sc.flush()
        _assert_two_tasks(_group(sc.report()))
        key_file = tmp_path / "spool.redact-key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = bytes.fromhex(key_file.read_text().strip())
        trials = sc.trials()
        assert sorted({t["task_id"] for t in trials}) == sorted(_token(key, s) for s in SECRETS)
        # equal values stay equal: both trials of a task share its token, and its session's
        assert sorted(t["conversation_id"] for t in trials) == sorted(
            f"sess-{_token(key, s)}" for s in ("acct-1111", "acct-1111", "acct-2222", "acct-2222"))
        assert sorted(t["trial_id"] for t in trials) == sorted(
            f"{_token(key, task)}-run{i}" for i, (task, _, _) in enumerate(RUNS))
        served = json.dumps(trials) + sc.get("/api/v1/sessions").text + json.dumps(sc.report())
        _assert_no_secret(served)
        # the API takes the raw ids as the application knows them: filters and posted outcomes
        # find the tokenized trials, and the outcome is stored with the token (its source masked)
        assert len(sc.trials(task_id="acct-1111")) == 2
        assert len(sc.trials(task_id=_token(key, "acct-1111"))) == 2
        r = sc.post("/api/v1/outcomes", json={"trial_id": "acct-2222-run3", "success": False,
                                              "source": "checked acct-2222"})
        assert r.status_code == 200, r.text
        assert r.json()["known"] is True and r.json()["key"] == f"{_token(key, 'acct-2222')}-run3"
        metrics = sc.get("/metrics").text
        # 8 spans changed (each carries the secret), the 4 roots and 4 tools in an identity value
        # (task id / session id on the roots; none on the tools: their secret is in the arguments)
        assert 'relyscope_spans_redacted_total{kind="redacted"} 8.0' in metrics
        assert 'relyscope_spans_redacted_total{kind="redacted_identity"} 4.0' in metrics
    finally:
        sc.kill()
    rows = _dump_all(tmp_path / "data")
    assert len(rows["relyscope.otel_traces"]) >= 8 and len(rows["relyscope.trials"]) >= 4
    text = json.dumps(rows, ensure_ascii=False)
    _assert_no_secret(text)
    assert "please close [REDACTED]" in text  # content keeps the plain mask


def test_sidecar_tokens_survive_a_restart(tmp_path):
    """The key kept beside the spool is read again at the next start: the same task id gives the
    same token, so a task's trials before and after a restart stay one task."""
    env = {"RELYSCOPE_REDACT_PATTERNS": PATTERNS}
    tokens = []
    for i in range(2):
        sc = start_sidecar(tmp_path, extra_env=env)
        try:
            _emit(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces", timeout=30), first_run=4 * i)
            sc.flush()
            tokens.append(sorted({t["task_id"] for t in sc.trials()}))
            g = _group(sc.report())
            assert g["tasks"] == 2 and g["trials"] == 4 * (i + 1), g
        finally:
            sc.kill()
    assert tokens[0] == tokens[1]


def _score(files, store_dir, env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run([str(BIN), "score", "--format", "json", "--n-boot", "0", "--keep-store", str(store_dir),
                        *map(str, files)], capture_output=True, text=True, timeout=300, env=_env(**env))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _spans_file(path, extra: dict | None = None):
    _emit(OTLPJsonFileExporter(str(path)), extra)
    return path


def test_score_keeps_tasks_apart_and_stores_no_secret(tmp_path):
    f = _spans_file(tmp_path / "runs.otlp.jsonl")
    r = _score([f], tmp_path / "store", {"RELYSCOPE_REDACT_PATTERNS": PATTERNS, "RELYSCOPE_REDACT_KEY": KEY})
    rep = json.loads(r.stdout)
    g = _group(rep)
    _assert_two_tasks(g)
    _assert_no_secret(r.stdout + r.stderr)
    line = " ".join(r.stderr.split())
    assert "ingest: 8 of 8 spans redacted (RELYSCOPE_REDACT_PATTERNS) before storage; 4 with identity values " \
           "tokenized" in line, r.stderr
    rows = _dump_all(tmp_path / "store")
    text = json.dumps(rows, ensure_ascii=False)
    _assert_no_secret(text)
    # the given key: the tokens are HMAC-SHA256(RELYSCOPE_REDACT_KEY, secret)
    for s in SECRETS:
        assert _token(KEY.encode(), s) in text


def test_allow_list_keeps_listed_and_identity_keys_in_sidecar_and_score(tmp_path):
    """RELYSCOPE_REDACT_ALLOW: only the listed attributes survive, besides the identity keys
    scoring reads (task id, outcome, agent name, operation, tool name, service name / version)."""
    extra = {"user.email": "a@example.com", "http.url": "https://x.example/?q=1", "custom.keep": "kept"}
    allow = json.dumps(["custom.*"])
    f = _spans_file(tmp_path / "runs.otlp.jsonl", extra)
    _score([f], tmp_path / "store", {"RELYSCOPE_REDACT_ALLOW": allow})
    sc = start_sidecar(tmp_path / "sidecar", extra_env={"RELYSCOPE_REDACT_ALLOW": allow})
    try:
        _emit(OTLPSpanExporter(endpoint=sc.otlp_http + "/v1/traces", timeout=30), extra)
        sc.flush()
        _assert_two_tasks(_group(sc.report()))  # task ids and outcomes were kept
    finally:
        sc.kill()
    for data in (tmp_path / "store", tmp_path / "sidecar" / "data"):
        spans = _dump_all(data)["relyscope.otel_traces"]
        roots = [r for r in spans if r["SpanName"] == "invoke_agent support"]
        assert len(roots) == 4
        for row in roots:
            assert set(row["SpanAttributes"]) == {
                "custom.keep", "relyscope.task.id", "relyscope.trial.id", "gen_ai.conversation.id", "relyscope.outcome",
                "gen_ai.operation.name", "gen_ai.agent.name"}, row["SpanAttributes"]
            assert set(row["ResourceAttributes"]) == {"service.name", "service.version"}


def test_identity_tokens_by_hand_and_idempotent():
    """The token of each match is HMAC-SHA256(key, match)[:16 hex] (computed with ``hmac``);
    equal ids equal, distinct ids distinct; a value that already holds a token (read back from
    the store and sent again, e.g. a replay's relyscope.shadow.of) keeps it, even under a pattern
    that matches hex digits; content keys keep the plain mask; span names get tokens."""
    from relyscope.collector.redaction import MASK, Redactor
    from relyscope.model import CanonicalSpan

    key = b"unit-test-key-0123456789abcdef"
    red = Redactor(patterns=[r"acct-[0-9]{4}", r"[0-9a-f]{6}"], key=key)

    def span(task: str, name: str = "invoke_agent support") -> CanonicalSpan:
        return CanonicalSpan(trace_id="1" * 32, span_id="2" * 16, parent_span_id="", name=name, kind=1,
                             start_ns=1, end_ns=2, attributes={"relyscope.task.id": task,
                                                               "relyscope.shadow.of": task,
                                                               "gen_ai.input.messages": f"close {task}"})

    a, a2, b = red.apply(span("acct-1111")), red.apply(span("acct-1111")), red.apply(span("acct-2222"))
    assert a.attributes["relyscope.task.id"] == _token(key, "acct-1111")
    assert a.attributes["relyscope.task.id"] == a2.attributes["relyscope.task.id"] != b.attributes["relyscope.task.id"]
    assert a.attributes["gen_ai.input.messages"] == f"close {MASK}"
    assert {"redacted", "redacted_identity"} <= a.flags
    again = red.apply(span(a.attributes["relyscope.task.id"]))
    assert again.attributes["relyscope.shadow.of"] == a.attributes["relyscope.task.id"]
    assert "redacted_identity" not in again.flags  # nothing left to tokenize
    named = red.apply(span("t1", name="invoke_agent acct-1111"))
    assert named.name == "invoke_agent " + _token(key, "acct-1111") and "redacted_identity" in named.flags


def test_a_deny_glob_over_identity_keys_is_warned_about(tmp_path):
    """``*.id`` (a plausible "drop every id" entry) matches relyscope.task.id, relyscope.trial.id,
    gen_ai.agent.id, session.id, …: ``relyscope score`` warns on stderr, naming them."""
    from relyscope.collector.decoding import denied_identity_keys

    hit = denied_identity_keys(["*.ID"])  # case-insensitive, as the redactor matches
    assert {"relyscope.task.id", "relyscope.trial.id", "session.id", "gen_ai.agent.id"} <= set(hit)
    assert denied_identity_keys(["user.email", "http.request.header.*"]) == []
    f = _spans_file(tmp_path / "runs.otlp.jsonl")
    r = _score([f], tmp_path / "store", {"RELYSCOPE_REDACT_DENY": json.dumps(["relyscope.task.id"])})
    line = " ".join(r.stderr.split())
    assert "RELYSCOPE_REDACT_DENY drops 1 identity key(s) scoring reads: relyscope.task.id" in line, r.stderr
