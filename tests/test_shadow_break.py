"""Adversarial inputs to shadow replays, each found breaking the sidecar: a replay attempt cut off
by a crash and re-run (counted twice in the live rollups), replay targets that trickle their reply
past the deadline or answer a huge body, and tool calls the proxy refuses (not counted as sandbox
misses). Real chDB, real loopback HTTP servers, the real stage / rollup / FastAPI app."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from relyscope.scoring.rollup import Rollup
from relyscope.store import Store
from relyscope.store.shadow import ShadowLedger
from test_shadow_units import PROD


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("shbreak") / "data")


@pytest.fixture()
def store(chdb_path):
    return Store(f"chdb://{chdb_path}", database="b" + uuid.uuid4().hex[:10])


def _ledger_row(trace_id: str, status: str) -> dict:
    return {"replay_id": "r1", "experiment": "e1", "shadow_of": "p1", "task_id": "task", "agent": "agent",
            "prod_version": "1.0", "target_version": "1.0", "run_kind": "shadow", "family": "nominal",
            "strength": None, "seed": 1, "idx": 0, "input": "refund ORD-1", "status": status,
            "trace_id": trace_id, "scheduled_at": 1_700_000_000.0}


def test_a_replay_attempt_cut_off_and_rerun_counts_once_in_the_rollups(store):
    """One replay (one ledger row). Its first attempt (trace T1) finishes and is rolled up while the
    ledger still says ``running`` (the sidecar writes results after the whole batch); the sidecar
    is killed; the restart re-runs the replay as T2. The shadow group must hold 1 trial, not 2 —
    and when a re-run never sends spans (the target is down now), the superseded T1 must still
    leave the rollups (0 trials: the ledger's current attempt has none)."""
    now = time.time_ns()
    prod = dataclasses.replace(PROD, trial_id="p1", trace_id="1" * 32, end_ns=now)
    store.insert_trials([prod])
    ledger = ShadowLedger(store)

    def replay(trace_id: str):
        return dataclasses.replace(prod, trial_id=f"{trace_id}:b", trace_id=trace_id, run_kind="shadow",
                                   shadow_of="p1", outcome="unknown", end_ns=time.time_ns())

    t1, t2, t3 = "2" * 32, "3" * 32, "4" * 32
    ledger.write_replays([_ledger_row(t1, "running")])
    store.insert_trials([replay(t1)])
    rollup = Rollup(store, None)
    rollup.sync()
    assert rollup.group_sizes()[("agent", "1.0", "shadow")] == 1
    # the restart re-runs it: new trace id in the ledger, then its spans
    ledger.write_replays([_ledger_row(t2, "running")])
    ledger.write_replays([_ledger_row(t2, "completed")])
    store.insert_trials([replay(t2)])
    rollup.sync()
    assert rollup.group_sizes()[("agent", "1.0", "shadow")] == 1
    # another re-run whose target is down: no spans, yet T2 is superseded and must go
    ledger.write_replays([_ledger_row(t3, "error")])
    rollup.sync()
    assert ("agent", "1.0", "shadow") not in rollup.group_sizes()
    assert rollup.group_sizes()[("agent", "1.0", "production")] == 1
