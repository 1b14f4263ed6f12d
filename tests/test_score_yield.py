"""The scorer thread yields to a backlogged worker (issue 13, bench/bench_worker_wall.py): while
the worker's last insert batch was full and more spool records wait, a scoring cycle is
postponed — at most ``max_defer`` cycles in a row, so scores lag by at most
``(max_defer + 1) * score_interval_s`` — and runs on schedule again once the backlog is gone."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relyscope.config import Settings
from relyscope.exporter.prom import build_registry
from relyscope.pipeline import Pipeline
from relyscope.scoring.stage import ScoreStage
from relyscope.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_ingest_decode import build_request  # noqa: E402


class _Ticks(threading.Event):
    """A stop event whose ``wait`` returns at once: False ``n`` times (an interval passed), then
    True (stop) — the scorer loop runs exactly ``n`` scheduled cycles after its first."""

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def wait(self, timeout=None):
        self.left -= 1
        return self.left < 0


class _Counting(ScoreStage):
    def __init__(self, ticks: int, busy, max_defer: int):
        super().__init__(Settings(), None, None, stop=_Ticks(ticks), busy=busy, max_defer=max_defer)
        self.cycles = 0

    def rescore(self, *, all_groups: bool = False):
        self.cycles += 1
        return {}


def test_busy_worker_postpones_at_most_max_defer_cycles_in_a_row():
    # 12 intervals, always busy, max_defer 3: defer, defer, defer, run (x3) -> runs at intervals
    # 4, 8 and 12, plus the first cycle at start (never postponed)
    s = _Counting(12, busy=lambda: True, max_defer=3)
    s.run()
    assert (s.cycles, s.deferred_cycles) == (4, 9)


def test_idle_worker_and_no_busy_hook_score_every_interval():
    for busy in (lambda: False, None):
        s = _Counting(12, busy=busy, max_defer=3)
        s.run()
        assert (s.cycles, s.deferred_cycles) == (13, 0)


def test_scorer_runs_at_once_when_the_backlog_is_gone():
    state = iter([True, True, False, False])  # busy for 2 intervals, then idle
    s = _Counting(4, busy=lambda: next(state), max_defer=5)
    s.run()
    assert (s.cycles, s.deferred_cycles) == (1 + 2, 2)


def test_pipeline_is_backlogged_only_while_full_batches_wait(tmp_path):
    # 20 requests x 512 spans: the first pass inserts 16 records (8 192 spans, the batch bound)
    # and 4 records wait -> backlogged; the second pass takes the last 4 -> not backlogged
    store = Store(f"chdb://{tmp_path}/data", database="yield")
    st = Settings(store=store.dsn, spool_dir=str(tmp_path / "spool"), grace_period_s=0.0)
    p = Pipeline(st, store, clock=lambda: 1_000.0)
    body = build_request(512).SerializeToString()
    try:
        for _ in range(20):
            p.accept(body, "application/x-protobuf")
        assert p._backlogged is False
        assert p._work_once()
        assert p._backlogged is True
        assert p.queue_depth == 4
        assert p.scoring._busy() is True
        assert p._work_once()
        assert p._backlogged is False and p._queue_empty()
        assert p.scoring._busy() is False
    finally:
        p.spool.close()
        store.close()


def test_max_defer_zero_never_postpones():
    s = _Counting(12, busy=lambda: True, max_defer=0)
    s.run()
    assert (s.cycles, s.deferred_cycles) == (13, 0)


def test_the_pipeline_takes_max_defer_from_the_settings(tmp_path, monkeypatch):
    import pytest
    from pydantic import ValidationError

    store = Store(f"chdb://{tmp_path}/data", database="yield2")
    try:
        for env, want in (("0", 0), ("12", 12), (None, 5)):
            if env is None:
                monkeypatch.delenv("RELYSCOPE_SCORE_MAX_DEFER", raising=False)
            else:
                monkeypatch.setenv("RELYSCOPE_SCORE_MAX_DEFER", env)
            p = Pipeline(Settings(store=store.dsn, spool_dir=str(tmp_path / f"spool{env}")), store)
            try:
                assert p.scoring.max_defer == want
            finally:
                p.spool.close()
        for bad in ("-1", "two", "1001"):
            monkeypatch.setenv("RELYSCOPE_SCORE_MAX_DEFER", bad)
            with pytest.raises(ValidationError, match="score_max_defer"):
                Settings()
    finally:
        store.close()


def test_postponed_cycles_are_counted(tmp_path):
    # 12 intervals with the worker always backlogged and max_defer 3: the first cycle at start,
    # then defer ×3 and run, three times → 4 cycles, 9 postponed (the rule of ScoreStage)
    store = Store(f"chdb://{tmp_path}/data", database="yield3")
    p = Pipeline(Settings(store=store.dsn, spool_dir=str(tmp_path / "spool")), store)
    try:
        sc = p.scoring
        sc._stop, sc._busy, sc.max_defer = _Ticks(12), (lambda: True), 3
        sc.run()
        got = {s.name: s.value for fam in text_string_to_metric_families(generate_latest(build_registry(p)).decode())
               for s in fam.samples if not s.labels}
        assert got["relyscope_score_cycles_total"] == 4
        assert got["relyscope_score_cycles_deferred_total"] == 9
        assert got["relyscope_score_cycle_seconds_count"] == 4
    finally:
        p.spool.close()
        store.close()
