"""Adversarial inputs for the live scorer: the in-memory windows (relyscope.scoring.live), the
ClickHouse rollups they mirror (relyscope.scoring.rollup) and the batch scorer
(relyscope.scorers.review.score_reviewed) must agree on every metric of every window for inputs
the main equality tests (test_live_memory.py, test_live_rollup.py) do not generate: end times far
in the future or at the epoch, extreme resource values, and names holding the separators of the
rollup's SQL keys."""

from __future__ import annotations

import dataclasses
import math
import random
import time
import uuid

import pytest

from live_traffic import make_trial
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.review import policy_for, score_reviewed
from relyscope.scoring.live import LiveStats, same_stats
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.scoring.stats import score_stats
from relyscope.scoring.windows import parse_windows
from relyscope.store import Store
from test_live_rollup import POLICY
from test_scoring_stats import assert_same

WINDOWS = parse_windows("5m,1h,24h,7d,all")
N_BOOT = 40
G = ("support", "1.0", "production")


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("edges") / "data")


@pytest.fixture()
def store(chdb_path):
    st = Store(f"chdb://{chdb_path}", database="e" + uuid.uuid4().hex[:10])
    yield st
    st.close()


def trial(rng: random.Random, i: int, now: float, **kw):
    end_ns = kw.pop("end_ns", int((now - 30 - i) * 1e9))
    t = make_trial(rng, i, task=kw.pop("task", f"t{i % 3}"), end_ns=end_ns)
    return dataclasses.replace(t, **kw)


def check(store: Store, live: LiveStats, groups, now: float) -> None:
    """Every window of every group: memory == rollups, and both score == the batch scorer on the
    stored trials that ended since the window's start (CIs for the minute-level windows)."""
    for g in groups:
        for name, length in WINDOWS:
            since = window_start(now, length)
            mine, ref = live.stats(g, name), live.rollup.window_stats(g, since, length)
            assert same_stats(mine, ref, pooled=live.window(g, name).pooled), (g, name, mine.task_ids, ref.task_ids)
            trials = store.load_trials(agent=g[0], version=g[1], run_kind=g[2], since_ns=since * 10**9)
            trials = sorted(apply_outcomes(trials, store.outcomes()), key=lambda t: t.task_id)
            nb = 0 if live.window(g, name).pooled else N_BOOT
            batch, _ = score_reviewed(trials, POLICY, n_boot=nb, seed=0, max_k=5)
            for src, st in (("memory", mine), ("rollup", ref)):
                inc = score_stats(st, n_boot=nb, seed=0, max_k=5, safety_measured=policy_for(POLICY, g[0]) is not None)
                try:
                    assert_same(batch, inc)
                except AssertionError as e:
                    raise AssertionError(f"{src} {g} {name}: {e}") from e


def start(store: Store, trials, groups, now: float) -> tuple[Rollup, LiveStats]:
    store.insert_trials(trials)
    ru = Rollup(store, POLICY, traj_sample=1000)
    ru.sync()
    ru.rows = []
    live = LiveStats(ru, WINDOWS)
    for g in groups:
        live.load(g, now)
    return ru, live


def sync(ru: Rollup, live: LiveStats) -> None:
    ru.sync()
    live.apply(ru.rows)
    ru.rows = []


def test_trials_ending_in_the_far_future_count_in_every_window(store):
    """A trial whose end lies after 2038-01-19 (a skewed clock, a bogus timestamp) ended after
    every window's start: the batch scorer counts it in each, so must the rollups and the memory.
    The rollup read stopped at bucket 2**31 s, so the memory (which had it) and the rollups (which
    had not) disagreed, and both scores differed from the batch scorer's; past 2106 the bucket
    saturates at DateTime's maximum, still after every start. Also: an end at the epoch
    (missing times) and ten years ago count in 'all' only."""
    now = time.time()
    rng = random.Random(1)
    base = [trial(rng, i, now) for i in range(12)]
    ru, live = start(store, base, [G], now)
    ends = (now + 120, now + 13 * 365 * 86400, now + 90 * 365 * 86400, now + 200 * 365 * 86400, 0.0,
            now - 10 * 365 * 86400)
    odd = [trial(rng, 100 + i, now, end_ns=int(e * 1e9), start_ns=max(0, int(e * 1e9) - 2 * 10**9),
                 status="complete", perturbation_family=None, outcome=("success", "failure")[i % 2])
           for i, e in enumerate(ends)]
    store.insert_trials(odd)
    sync(ru, live)
    check(store, live, [G], now)
    assert live.window(G, "5m").trials() == len([t for t in base + odd if t.end_ns >= window_start(now, 300) * 1e9])
    fresh = LiveStats(ru, WINDOWS)  # a restart loads the same from the rollups
    fresh.load(G, now)
    check(store, fresh, [G], now)
