"""An open trace must not pin the spool (issue 10 item 2), over real sidecar processes.

A rootless trace stays open for ``RELYSCOPE_ROOT_TIMEOUT_S`` (300 s by default). The spool used to
free space only up to the first record of a still-open trace, so one orphan span followed by
ordinary traffic filled a small spool and every export got 503 although the store was healthy.
Records are now committed once their spans are stored; the ids of open traces are kept in the
spool's state and reloaded from the store after a restart (checked here with kill -9).
"""

from __future__ import annotations

import signal
import time

from test_durability import (_start, _stop_term, check_trials, flush, keys_of, make_trace, metric, post_json,
                             sidecars, stored_keys, trace_id_of, wait_until)  # noqa: F401


def _orphans(tid: str) -> list[dict]:
    """The children of ``make_trace(tid)`` without their root (the root is not sent yet)."""
    return make_trace(tid, task="orphan")[1:]


def test_rootless_trace_does_not_pin_a_small_spool(tmp_path, sidecars):
    sc = _start(sidecars, tmp_path, RELYSCOPE_SPOOL_MAX_BYTES=1 << 16)  # 64 KiB; ~2.3 KB per request
    orphan = trace_id_of(50, 0)
    assert post_json(sc, _orphans(orphan)).status_code == 200
    traces = {}
    deadline = time.monotonic() + 90
    for i in range(1, 121):  # ~280 KB: four times the spool
        tid = trace_id_of(50, i)
        traces[tid] = make_trace(tid, task=f"t{i % 4}")
        while (r := post_json(sc, traces[tid])).status_code == 503:  # a client honouring Retry-After
            assert time.monotonic() < deadline, "the spool stayed full: pinned by the open trace"
            time.sleep(0.2)
        assert r.status_code == 200, r.text
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="spool committed")
    assert metric(sc, "relyscope_open_traces") >= 1  # the orphan's trace is still open
    sent = set().union(*(keys_of(s) for s in traces.values()))
    assert sent | keys_of(_orphans(orphan)) == stored_keys(sc)
    flush(sc)
    assert {t["trace_id"] for t in sc.trials(limit=1000)} >= set(traces)


def test_open_trace_is_reloaded_from_the_store_after_sigkill(tmp_path, sidecars):
    env = {"RELYSCOPE_GRACE_PERIOD_S": 120}  # nothing finalizes on its own in this test
    sc = _start(sidecars, tmp_path, **env)
    tid = trace_id_of(51, 1)
    spans = make_trace(tid, task="t0", n_children=4)
    assert post_json(sc, spans[1:]).status_code == 200  # children first, as OTel exports them
    wait_until(lambda: stored_keys(sc) == keys_of(spans[1:]), what="children stored")
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="their record committed")
    sc.kill(signal.SIGKILL)  # the spool no longer holds them: only the open-trace state does

    sc = _start(sidecars, tmp_path, **env)
    wait_until(lambda: metric(sc, "relyscope_open_traces") == 1, what="open trace reloaded")
    assert post_json(sc, spans[:1]).status_code == 200  # the root arrives after the restart
    flush(sc)
    check_trials(sc, {tid: spans})  # one complete trial of all five spans, the id {trace}:{root}
    assert _stop_term(sc) == 0


def test_finalized_trial_the_store_refused_is_written_after_a_restart(tmp_path, sidecars):
    down = tmp_path / "down"
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down, RELYSCOPE_GRACE_PERIOD_S=120)
    tid = trace_id_of(52, 1)
    spans = make_trace(tid, task="t0")
    assert post_json(sc, spans).status_code == 200
    wait_until(lambda: stored_keys(sc) == keys_of(spans), what="spans stored")
    wait_until(lambda: metric(sc, "relyscope_spool_pending_records") == 0, what="record committed")
    down.touch()  # trials cannot be written: the finalized trial stays pending
    r = sc.post("/api/v1/flush", params={"timeout_s": 1})
    assert r.status_code == 504
    sc.kill(signal.SIGKILL)
    down.unlink()
    sc = _start(sidecars, tmp_path, RELYSCOPE_GRACE_PERIOD_S=120)
    flush(sc)
    check_trials(sc, {tid: spans})
    assert _stop_term(sc) == 0
