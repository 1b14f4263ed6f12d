"""How fresh the reliability gauges are, as /metrics tells an operator (issue 13: freshness under
load): ``relyscope_score_cycles_total``, ``relyscope_score_cycles_deferred_total``, the
``relyscope_score_cycle_seconds`` histogram and ``relyscope_scores_age_seconds`` — absent before
the first cycle (unknown, not 0). The ``RelyscopeScoresStale`` alert on the age is tested by
promtool (deploy/alerts/relyscope-rules.test.yml, test_prometheus_rules.py).

Expected values come from the measured wall clock around the cycles, not from the exporter's own
output; the postponed-cycles counter is checked in test_score_yield.py, against the scorer's rule."""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relyscope.config import Settings
from relyscope.exporter.prom import build_registry
from relyscope.pipeline import Pipeline
from relyscope.store import Store


def _samples(reg) -> dict[str, float]:
    """sample name → value of the unlabelled samples (histogram count and sum included) of one scrape."""
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def _pipeline(tmp_path, db: str) -> tuple[Pipeline, Store]:
    store = Store(f"chdb://{tmp_path}/data", database=db)
    p = Pipeline(Settings(store=store.dsn, spool_dir=str(tmp_path / "spool"), grace_period_s=0.0), store)
    return p, store


def test_cycle_count_duration_and_age_follow_the_cycles(tmp_path):
    p, store = _pipeline(tmp_path, "fresh1")
    try:
        reg = build_registry(p)
        before = _samples(reg)
        assert before["relyscope_score_cycles_total"] == 0
        assert before["relyscope_score_cycle_seconds_count"] == 0
        assert "relyscope_scores_age_seconds" not in before  # no cycle yet: unknown, not 0

        walls = []
        for _ in range(2):
            t0 = time.time()
            p.scoring.rescore(all_groups=True)
            t1 = time.time()
            walls.append((t0, t1))
        scrape_from = time.time()
        got = _samples(reg)
        scrape_to = time.time()
        assert got["relyscope_score_cycles_total"] == 2
        assert got["relyscope_score_cycle_seconds_count"] == 2
        assert 0 < got["relyscope_score_cycle_seconds_sum"] <= sum(b - a for a, b in walls)
        # the last cycle ended within the second call: its age lies between these bounds
        (a2, b2) = walls[1]
        assert scrape_from - b2 <= got["relyscope_scores_age_seconds"] <= scrape_to - a2

        # a second scrape does not count the same cycles twice
        again = _samples(reg)
        assert again["relyscope_score_cycle_seconds_count"] == 2
        assert again["relyscope_scores_age_seconds"] >= got["relyscope_scores_age_seconds"]
    finally:
        p.spool.close()
        store.close()


def test_a_store_write_shows_in_the_latency_histogram_at_the_next_scrape(tmp_path):
    # bug: the histograms were registered on the registry and collected before the collector
    # drained the samples into them, so each write appeared one scrape late
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_ingest_decode import build_request

    p, store = _pipeline(tmp_path, "fresh3")
    try:
        reg = build_registry(p)
        assert _samples(reg)["relyscope_store_write_seconds_count"] == 0
        p.accept(build_request(16).SerializeToString(), "application/x-protobuf")
        t0 = time.perf_counter()
        assert p._work_once()  # one insert of the spans (and one of the finalized trials)
        took = time.perf_counter() - t0
        got = _samples(reg)
        assert got["relyscope_store_write_seconds_count"] == 1  # the span insert: one sample per batch
        assert 0 < got["relyscope_store_write_seconds_sum"] <= took
    finally:
        p.spool.close()
        store.close()


def test_a_scrape_racing_another_for_the_same_samples_does_not_fail():
    # bug (h-breaker): the drain read len() and then popped that many; a concurrent scrape that
    # emptied the queue in between made this one raise IndexError (a 500 on /metrics)
    import collections

    from prometheus_client import CollectorRegistry, Histogram

    from relyscope.exporter.prom import _drain

    class Raced(collections.deque):
        def __len__(self):  # what this scrape saw before the other one took two of the samples
            return super().__len__() + 2

    q = Raced([0.5, 2.0])
    hist = Histogram("h_seconds", "h", registry=CollectorRegistry(), buckets=(1, 10))
    _drain(q, hist)
    assert len(collections.deque(q)) == 0
    got = {s.name: s.value for s in hist.collect()[0].samples if not s.labels or s.labels.get("le") == "1.0"}
    assert got["h_seconds_count"] == 2 and got["h_seconds_sum"] == 2.5 and got["h_seconds_bucket"] == 1
