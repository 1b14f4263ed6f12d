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

    def body(i):
        span = {"traceId": f"{i:032x}", "spanId": f"{i:016x}", "name": f"span-{i}", "kind": 1,
                "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000"}
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()

    def pipeline(name):
        return Pipeline(Settings(store=st.dsn, spool_dir=f"{root}/{name}", grace_period_s=0,
                                 max_backlog_s=0.3), st)

    def refused(p, i):
        try:
            p.accept(body(i), "application/json")
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
    p.start()
    p.flush(timeout_s=60)
    out["b_stored"] = stored(3, 4)
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
    # D: receiving faster than storing: refused by the worker's estimated time for what waits,
    # long before the oldest waiting record is as old as the bound
    real = st.insert_span_columns, st.insert_spans
    def slow(fn):
        def call(*a, **k):
            time.sleep(0.25)
            return fn(*a, **k)
        return call
    st.insert_span_columns, st.insert_spans = slow(real[0]), slow(real[1])
    p = Pipeline(Settings(store=st.dsn, spool_dir=f"{root}/d", grace_period_s=0, max_backlog_s=1.0), st)
    p.start()
    out["d_first"] = refused(p, 8)
    p.flush(timeout_s=60)
    out["d_s_per_record"] = p._s_per_record
    t0 = time.monotonic()
    out["d_refused_at"] = None
    for i in range(9, 40):
        if refused(p, i) is not None:
            out["d_refused_at"], out["d_refused_after_s"] = i - 9, time.monotonic() - t0
            break
    out["d_flushed"] = p.flush(timeout_s=60)
    out["d_accepted"] = p.stats.accepted
    out["d_stored"] = stored(*range(8, 8 + p.stats.accepted))
    p.shutdown()
    st.insert_span_columns, st.insert_spans = real
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
    assert outcome["a_flushed"] is True and outcome["a_after"] is None
    assert outcome["a_stored"] == 2  # everything accepted is stored


def test_the_backlog_a_restart_leaves_is_exempt(outcome):
    assert outcome["b_first"] is None
    assert outcome["b_after_restart"] is None  # record 3 is 0.6 s old, but replayed
    assert outcome["b_backlog_s"] < 0.3
    assert outcome["b_stored"] == 2


def test_a_store_outage_is_absorbed_by_the_spool_not_refused(outcome):
    assert outcome["c_first"] is None
    assert outcome["c_during_outage"] is None  # record 5 unstored for > 0.6 s: the store is down
    assert outcome["c_flushed"] is True and outcome["c_after"] is None
    assert outcome["c_stored"] == 3


def test_receiving_faster_than_storing_is_refused_by_the_estimated_wait_not_only_by_age(outcome):
    """Each insert takes 0.25 s: once about 4 records wait (4 x 0.25 s = the 1 s bound) a request is
    refused, while the oldest waiting record is still far younger than 1 s. An age-only bound let
    the bench's receiver admit ten times what the worker stores in the bound."""
    assert outcome["d_first"] is None
    assert outcome["d_s_per_record"] >= 0.25
    assert outcome["d_refused_at"] is not None and 3 <= outcome["d_refused_at"] <= 8
    assert outcome["d_refused_after_s"] < 1.0
    assert outcome["d_flushed"] is True
    assert outcome["d_stored"] == outcome["d_accepted"] == 1 + outcome["d_refused_at"]


@pytest.mark.parametrize("bad", ["0", "-1", "soon"])
def test_a_bound_that_is_not_a_positive_number_is_refused_with_the_field_named(bad, monkeypatch):
    from relyscope.config import Settings

    monkeypatch.setenv("RELYSCOPE_MAX_BACKLOG_S", bad)
    with pytest.raises(ValidationError, match="max_backlog_s"):
        Settings()
