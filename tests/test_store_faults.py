"""Transient and permanent store errors, over real sidecar processes (issue 10 item 1).

The faults are injected with ``RELYSCOPE_FAULT_STORE_DOWN_FILE`` holding JSON: inserts fail with a
ClickHouse error (the driver's own ``DatabaseError``, ``Code: N.``) while the store still answers
its ping and queries — as a ClickHouse under load does (MEMORY_LIMIT_EXCEEDED 241, TOO_MANY_PARTS
252) or as one refusing data it cannot hold does (TYPE_MISMATCH 53). Expected values come from
what each test sent and which requests were acknowledged: an acknowledged span must end up in the
store, never in quarantine, unless the store refused *that* record with a data error.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, DataError

from conftest import RELYSCOPE_BIN
from relyscope.store import StoreRejected, StoreUnavailable
from relyscope.store.errors import classify
from test_durability import (_start, _stop_term, check_trials, flush, keys_of, make_trace, metric, post_json,
                             sidecars, stored_keys, trace_id_of, wait_until)  # noqa: F401 (fixture)


def _health(sc) -> dict:
    return sc.get("/healthz").json()


def _quarantine(sc) -> list[dict]:
    r = subprocess.run([str(RELYSCOPE_BIN), "quarantine", "list", "--json", "--spool-dir",
                        str(sc.data_dir / "spool")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


# ---- classification (pure) ------------------------------------------------------------------------
@pytest.mark.parametrize("message, kind, code", [
    ("Code: 241. DB::Exception: Memory limit (total) exceeded. (MEMORY_LIMIT_EXCEEDED)", StoreUnavailable, 241),
    ("Code: 252. DB::Exception: Too many parts (300). (TOO_MANY_PARTS)", StoreUnavailable, 252),
    ("HTTPDriver for http://ch:8123 received ClickHouse error code 159\n Code: 159. DB::Exception: Timeout "
     "exceeded. (TIMEOUT_EXCEEDED)", StoreUnavailable, 159),
    ("Code: 53. DB::Exception: Type mismatch. (TYPE_MISMATCH)", StoreRejected, 53),
    ("Code: 321. DB::Exception: Value out of range. (VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE)", StoreRejected, 321),
    ("Code: 48. DB::Exception: Not implemented. (NOT_IMPLEMENTED)", StoreUnavailable, 48),  # unknown: retry
])
def test_clickhouse_error_codes_are_classified(message, kind, code):
    err = classify(DatabaseError(message), "insert into otel_traces")
    assert type(err) is kind and err.code == code


def test_client_side_serialization_errors_are_permanent_and_unknown_ones_retryable():
    assert isinstance(classify(DataError("Unable to create native array for column `a`"), "x"), StoreRejected)
    assert isinstance(classify(OverflowError("int too big"), "x"), StoreRejected)
    assert isinstance(classify(ConnectionResetError("reset"), "x"), StoreUnavailable)
    assert isinstance(classify(RuntimeError("?"), "x"), StoreUnavailable)


# ---- a transient insert error loses nothing ------------------------------------------------------
def test_transient_insert_error_while_ping_answers_is_retried_not_quarantined(tmp_path, sidecars):
    fault = tmp_path / "fault"
    fault.write_text(json.dumps({"code": 241}))  # MEMORY_LIMIT_EXCEEDED: passes
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=fault, RELYSCOPE_QUARANTINE_AFTER_S=0)
    traces = {}
    for i in range(5):
        tid = trace_id_of(20, i)
        traces[tid] = make_trace(tid, task=f"t{i % 2}")
        assert post_json(sc, traces[tid]).status_code == 200
    # four failed attempts take 0.5 + 1 + 2 s of backoff: the old code quarantined after two
    wait_until(lambda: metric(sc, "relyscope_store_write_errors_total") >= 4, what="retried inserts")
    h = _health(sc)
    assert h["status"] == "degraded" and "MEMORY_LIMIT_EXCEEDED" in h["last_error"]
    assert h["quarantine_records"] == 0 and _quarantine(sc) == []
    assert 'reason="unstorable"' not in sc.get("/metrics").text
    assert sc.get("/readyz").status_code == 200  # the spool absorbs it: still accepting
    assert stored_keys(sc) == set()

    fault.unlink()  # the store recovers
    flush(sc)
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in traces.values()))
    check_trials(sc, traces)
    assert metric(sc, "relyscope_quarantine_records") == 0
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="spool committed")
    assert _stop_term(sc) == 0


def test_permanent_insert_error_quarantines_only_that_record_visible_and_replayable(tmp_path, sidecars):
    fault = tmp_path / "fault"
    fault.write_text(json.dumps({"code": 53, "match": "poison", "tables": ["otel_traces"]}))  # TYPE_MISMATCH
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=fault, RELYSCOPE_QUARANTINE_AFTER_S=1)
    good = {}
    for i, name in enumerate(["good", "poison", "good"]):
        tid = trace_id_of(21, i)
        spans = make_trace(tid, task="t0")
        spans[1]["attrs"]["note"] = name  # only the middle request holds the string "poison"
        assert post_json(sc, spans).status_code == 200
        if name == "good":
            good[tid] = spans
        else:
            poison = (tid, spans)
    wait_until(lambda: metric(sc, "relyscope_quarantine_records") == 1, what="poison record quarantined")
    wait_until(lambda: stored_keys(sc) == set().union(*(keys_of(s) for s in good.values())),
               what="records behind the poison one stored")
    h = _health(sc)
    assert h["quarantine_records"] == 1 and h["quarantine_bytes"] > 0 and h["status"] == "degraded"
    text = sc.get("/metrics").text
    assert 'relyscope_spans_rejected_total{reason="unstorable"} 5.0' in text
    [entry] = _quarantine(sc)
    assert entry["spans"] == 5 and entry["code"] == 53 and "TYPE_MISMATCH" in entry["error"]
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="spool committed")

    fault.unlink()  # the cause is fixed: replay puts the record through the sidecar again
    r = subprocess.run([str(RELYSCOPE_BIN), "quarantine", "replay", "--endpoint", sc.otlp_http,
                        "--spool-dir", str(sc.data_dir / "spool")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _quarantine(sc) == []
    flush(sc)
    good[poison[0]] = poison[1]
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in good.values()))
    check_trials(sc, good)
    assert metric(sc, "relyscope_quarantine_records") == 0
    assert _stop_term(sc) == 0


# ---- kill -9 in the middle of it -----------------------------------------------------------------
def test_sigkill_during_transient_retry_loses_nothing(tmp_path, sidecars):
    fault = tmp_path / "fault"
    fault.write_text(json.dumps({"code": 252}))  # TOO_MANY_PARTS
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=fault, RELYSCOPE_QUARANTINE_AFTER_S=0)
    traces = {}
    for i in range(6):
        tid = trace_id_of(22, i)
        traces[tid] = make_trace(tid, task=f"t{i % 3}")
        assert post_json(sc, traces[tid]).status_code == 200
    wait_until(lambda: metric(sc, "relyscope_store_write_errors_total") >= 2, what="a retry under way")
    sc.kill(signal.SIGKILL)
    fault.unlink()
    sc = _start(sidecars, tmp_path)
    flush(sc)
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in traces.values()))
    check_trials(sc, traces)
    assert _quarantine(sc) == []
    assert _stop_term(sc) == 0


def test_sigkill_during_quarantine_retries_quarantines_the_record_once(tmp_path, sidecars):
    fault = tmp_path / "fault"
    fault.write_text(json.dumps({"code": 53, "match": "poison", "tables": ["otel_traces"]}))
    env = {"RELYSCOPE_FAULT_STORE_DOWN_FILE": fault}
    sc = _start(sidecars, tmp_path, **env, RELYSCOPE_QUARANTINE_AFTER_S=600)  # still retrying at the kill
    good = {}
    for i, name in enumerate(["poison", "good", "good"]):
        tid = trace_id_of(23, i)
        spans = make_trace(tid, task="t1")
        spans[2]["attrs"]["note"] = name
        assert post_json(sc, spans).status_code == 200
        if name == "good":
            good[tid] = spans
    wait_until(lambda: metric(sc, "relyscope_store_write_errors_total") >= 2, what="poison record retried")
    assert stored_keys(sc) == set()  # it blocks the records behind it while it is retried
    sc.kill(signal.SIGKILL)
    sc = _start(sidecars, tmp_path, **env, RELYSCOPE_QUARANTINE_AFTER_S=1)
    wait_until(lambda: metric(sc, "relyscope_quarantine_records") == 1, what="quarantined after restart")
    flush(sc)
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in good.values()))
    check_trials(sc, good)
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="spool committed")
    sc.kill(signal.SIGKILL)  # and once more: the quarantined record is not replayed or duplicated
    sc = _start(sidecars, tmp_path, **env)
    flush(sc)
    assert [e["spans"] for e in _quarantine(sc)] == [5]
    assert stored_keys(sc) == set().union(*(keys_of(s) for s in good.values()))
    assert _stop_term(sc) == 0


def test_a_store_down_at_start_is_retried_once_per_interval_not_in_a_busy_loop(tmp_path, sidecars):
    """While every write fails from the start (no score yet), the scorer retries its first cycle
    every RELYSCOPE_SCORE_INTERVAL_S (1 s here), not at once: it used to log ~200 failures a
    second and starve the receivers of CPU (the graceful-stop test then flaked)."""
    import time

    down = tmp_path / "down"
    down.touch()
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down)
    time.sleep(4)
    n = sc.log.count("scoring failed")
    assert _stop_term(sc) == 0
    assert 1 <= n <= 4 + 2, n  # one per second, give or take the start and a slow machine
