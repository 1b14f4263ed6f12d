"""``max_backlog_s`` (issue 13, freshness under load): a sidecar slower than its senders refuses
new requests with the retryable signal while what it has not stored yet is older than the bound,
so freshness stays bounded; what is refused is not acknowledged (never in the spool), and what
was accepted is all stored. The backlog a store outage or a restart leaves is exempt: the spool
is there to absorb it. Runs in a subprocess: chDB allows one data path per process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from relyscope.config import Settings
    from relyscope.pipeline import Backpressure, Pipeline
    from relyscope.store import Store

    root = sys.argv[1]
    st = Store(f"chdb://{root}/data")
    out = {}

    def body(i, name=None):
        span = {"traceId": f"{i:032x}", "spanId": f"{i:016x}", "name": name or f"span-{i}", "kind": 1,
                "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000"}
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()

    def pipeline(name, bound=0.3):
        return Pipeline(Settings(store=st.dsn, spool_dir=f"{root}/{name}", grace_period_s=0,
                                 quarantine_after_s=0, max_backlog_s=bound), st)

    def refused(p, i, name=None):
        try:
            p.accept(body(i, name), "application/json")
            return None
        except Backpressure as e:
            return str(e)

    def stored(*ids):
        q = "SELECT count() FROM {db}.otel_traces FINAL WHERE TraceId IN (%s)" % ",".join(
            f"'{i:032x}'" for i in ids)
        return st.query(q)[0][0]

    # A: the worker falls behind (not started): the bound refuses, then lets in again once caught up
    p = pipeline("a")
    out["a_first"] = refused(p, 1)
    time.sleep(0.6)
    out["a_backlog_s"] = p.backlog_s()
    out["a_late"] = refused(p, 2)
    out["a_pending"] = p.spool.pending_records
    out["a_backpressure"] = p.stats.backpressure
    out["a_backpressure_by"] = dict(p.stats.backpressure_by)
    p.start()
    out["a_flushed"] = p.flush(timeout_s=60)
    out["a_after"] = refused(p, 2)
    p.flush(timeout_s=60)
    out["a_stored"] = stored(1, 2)
    p.shutdown()

    # B: a restart with an old backlog in the spool: replayed records are exempt
    p = pipeline("b")
    out["b_first"] = refused(p, 3)
    p.spool.close()  # the process dies with record 3 unstored
    time.sleep(0.6)
    p = pipeline("b")
    out["b_after_restart"] = refused(p, 4)
    out["b_backlog_s"] = p.backlog_s()
    time.sleep(0.6)  # record 4 is 0.6 s old, queued behind the replay (not started yet)
    out["b_behind_replay"] = refused(p, 5)
    p.start()
    p.flush(timeout_s=60)
    out["b_stored"] = stored(3, 4, 5)
    out["b_after_drain"] = refused(p, 6)
    p.flush(timeout_s=60)
    p.shutdown()

    # C: a store outage: the spool absorbs it, however old the backlog gets
    down = f"{root}/down"
    open(down, "w").close()
    st.fault_file = down
    p = pipeline("c")
    p.start()
    out["c_first"] = refused(p, 5)
    deadline = time.monotonic() + 30
    while p.stats.store_errors == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)
    out["c_during_outage"] = refused(p, 6)
    os.remove(down)
    out["c_flushed"] = p.flush(timeout_s=60)
    out["c_after"] = refused(p, 7)
    p.flush(timeout_s=60)
    out["c_stored"] = stored(5, 6, 7)
    p.shutdown()
    # D1: receiving faster than storing: the worker's estimated time for what waits (count x its
    # seconds per record) refuses long before the oldest waiting record is as old as the bound
    p = pipeline("d1", bound=1.0)
    out["d1_three"] = [refused(p, i) for i in (8, 9, 10)]
    p._s_per_record = 0.3  # as measured by the worker on full batches (D2)
    out["d1_backlog_s"] = p.backlog_s()  # 3 waiting x 0.3 s
    out["d1_fourth"] = refused(p, 11)  # 0.9 s behind: let in
    out["d1_fifth"] = refused(p, 12)  # 4 x 0.3 = 1.2 s behind: refused
    out["d1_oldest_age_s"] = p.spool.oldest_pending_age_s
    p.start()
    out["d1_flushed"] = p.flush(timeout_s=60)
    out["d1_stored"] = stored(8, 9, 10, 11, 12)
    p.shutdown()

    # D2: the estimate comes from full batches only: a 1-record batch is mostly fixed cost
    real = st.insert_span_columns, st.insert_spans
    def slow(fn):
        def call(*a, **k):
            time.sleep(0.25)
            return fn(*a, **k)
        return call
    st.insert_span_columns, st.insert_spans = slow(real[0]), slow(real[1])
    p = pipeline("d2", bound=600)
    p.start()
    refused(p, 20)
    p.flush(timeout_s=60)
    out["d2_after_one"] = p._s_per_record
    p.shutdown()
    p = pipeline("d2b", bound=600)
    for i in range(100, 356):  # 256 records: one full batch (the worker's record cap)
        refused(p, i)
    p.start()
    p.flush(timeout_s=60)
    out["d2_after_full"] = p._s_per_record
    p.shutdown()
    st.insert_span_columns, st.insert_spans = real

    # E: a record the store refuses is retried, then quarantined: meanwhile the bound is off
    with open(down, "w") as f:
        json.dump({"code": 53, "match": "poison", "tables": ["otel_traces"]}, f)
    st.fault_file = down
    p = pipeline("e")
    p.start()
    out["e_poison"] = refused(p, 400, "poison")
    deadline = time.monotonic() + 30
    while p._impaired_since is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)
    out["e_while_retried"] = refused(p, 401)
    out["e_flushed"] = p.flush(timeout_s=60)
    out["e_unstorable"] = p.stats.rejected["unstorable"]
    out["e_stored"] = stored(401)
    out["e_after"] = refused(p, 402)
    p.flush(timeout_s=60)
    p.shutdown()
    os.remove(down)
    st.close()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    root = tmp_path_factory.mktemp("backlog")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_backlog_older_than_the_bound_refuses_new_requests_until_the_worker_catches_up(outcome):
    assert outcome["a_first"] is None
    assert outcome["a_backlog_s"] >= 0.6  # slept 0.6 s with record 1 unstored
    msg = outcome["a_late"]
    assert msg is not None and "RELYSCOPE_MAX_BACKLOG_S=0.3" in msg
    assert outcome["a_pending"] == 1  # the refused request was not spooled (not acknowledged)
    assert outcome["a_backpressure"] == 1
    assert outcome["a_backpressure_by"] == {"backlog": 1}  # relyscope_backpressure_total{reason="backlog"}
    assert outcome["a_flushed"] is True and outcome["a_after"] is None
    assert outcome["a_stored"] == 2  # everything accepted is stored


def test_the_backlog_a_restart_leaves_is_exempt(outcome):
    assert outcome["b_first"] is None
    assert outcome["b_after_restart"] is None  # record 3 is 0.6 s old, but replayed
    assert outcome["b_backlog_s"] < 0.3
    assert outcome["b_behind_replay"] is None  # record 4 waits behind the replay: its clock has not started
    assert outcome["b_stored"] == 3 and outcome["b_after_drain"] is None


def test_a_store_outage_is_absorbed_by_the_spool_not_refused(outcome):
    assert outcome["c_first"] is None
    assert outcome["c_during_outage"] is None  # record 5 unstored for > 0.6 s: the store is down
    assert outcome["c_flushed"] is True and outcome["c_after"] is None
    assert outcome["c_stored"] == 3


def test_receiving_faster_than_storing_is_refused_by_the_estimated_wait_not_only_by_age(outcome):
    """By hand: 3 waiting records x 0.3 s = 0.9 s behind (let in), 4 x 0.3 = 1.2 s > the 1 s
    bound (refused), while the oldest waiting record is far younger than 1 s. An age-only bound
    let the bench's receiver admit ten times what the worker stores within the bound."""
    assert outcome["d1_three"] == [None, None, None]
    assert abs(outcome["d1_backlog_s"] - 0.9) < 1e-9
    assert outcome["d1_fourth"] is None
    assert outcome["d1_fifth"] is not None and "RELYSCOPE_MAX_BACKLOG_S=1" in outcome["d1_fifth"]
    assert outcome["d1_oldest_age_s"] < 1.0
    assert outcome["d1_flushed"] is True and outcome["d1_stored"] == 4


def test_the_workers_estimate_comes_from_full_batches(outcome):
    """Each insert sleeps 0.25 s. One record alone: no estimate (it would say 0.25 s per record);
    256 records in one batch: between 0.25 / 256 s and well under the single-record figure."""
    assert outcome["d2_after_one"] is None
    per = outcome["d2_after_full"]
    assert per is not None and 0.25 / 256 <= per < 0.05


def test_a_record_being_retried_then_quarantined_does_not_turn_the_bound_on_everyone(outcome):
    assert outcome["e_poison"] is None
    assert outcome["e_while_retried"] is None  # the poison record is 0.6 s old: retried, not lag
    assert outcome["e_flushed"] is True and outcome["e_unstorable"] == 1 and outcome["e_stored"] == 1
    assert outcome["e_after"] is None


@pytest.mark.parametrize("bad", ["0", "-1", "soon"])
def test_a_bound_that_is_not_a_positive_number_is_refused_with_the_field_named(bad, monkeypatch):
    from relyscope.config import Settings

    monkeypatch.setenv("RELYSCOPE_MAX_BACKLOG_S", bad)
    with pytest.raises(ValidationError, match="max_backlog_s"):
        Settings()
