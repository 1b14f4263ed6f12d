"""A trial the store refused with a data error and later stored leaves nothing behind: the
worker's per-trial strike count (``Pipeline._trial_strikes``, what decides that a trial is
unstorable after ``quarantine_after_s``) is dropped once the trial is written. Before the fix
every such trial kept its entry for the life of the process (a leak that grew with every
transient data error), and a later, unrelated refusal of the same trial id started from the old
strikes and first-refusal time, so it was dropped as unstorable without the full wait."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from relyscope.config import Settings
from relyscope.pipeline import Pipeline
from relyscope.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_ingest_decode import build_request  # noqa: E402


def test_a_refused_trial_that_later_stores_leaves_no_strikes(tmp_path):
    fault = tmp_path / "fault.json"
    # code 117 (INCORRECT_DATA): a permanent data error, for the trials table only
    fault.write_text(json.dumps({"code": 117, "tables": ["trials"]}))
    store = Store(f"chdb://{tmp_path}/data", database="strikes", fault_file=str(fault))
    st = Settings(store=store.dsn, spool_dir=str(tmp_path / "spool"), grace_period_s=0.0,
                  quarantine_after_s=3600)
    p = Pipeline(st, store, clock=lambda: 1_000.0)
    try:
        p.accept(build_request(32).SerializeToString(), "application/x-protobuf")  # 2 traces
        for _ in range(3):  # store the spans, finalize both traces (grace 0): the trials are refused
            p._work_once()
        assert p.stats.stored == 32
        assert len(p._trial_strikes) == 2, p._trial_strikes
        assert p.stats.trials_finalized == 0
        fault.unlink()
        deadline = time.monotonic() + 20
        while p.stats.trials_finalized < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # past the retry pause (0.5 s after the first strike)
            p._work_once()
        assert p.stats.trials_finalized == 2
        assert p._trial_strikes == {}
        assert p.stats.rejected["trials_unstorable"] == 0
    finally:
        p.spool.close()
        store.close()
