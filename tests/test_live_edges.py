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


def _plain(rng, i, now, **kw):
    return trial(rng, i, now, status="complete", perturbation_family=None, **kw)


def test_extreme_resource_values_neither_wrap_nor_stop_the_sync(store):
    """C_res from exact integer sums: a task of 70 runs whose start is missing (start 0: ~57
    years of wall time in ns, each square ~2^121) wrapped the Int128 sum of squares (C_res wrong
    in memory, rollups and every later reload); a cost of 1e25 USD (nano-USD squared > 2^127)
    failed the contrib_log insert — that sync and every later one, so no live score moved again —
    and an infinite cost (a sum of huge span costs) raised OverflowError in the same place. Now a
    non-finite cost or one beyond MAX_COST_USD is *not available* for both scorers, squares are
    Int256, and every metric equals the batch scorer's."""
    MAX_COST_USD = 1e18  # relyscope.scorers.metrics.MAX_COST_USD

    now = time.time()
    rng = random.Random(2)
    runs = [_plain(rng, i, now, task="t0", start_ns=0) for i in range(70)]
    ru, live = start(store, runs, [G], now)
    odd = [_plain(rng, 100 + i, now, task="t1", cost_usd=c, total_tokens=2**64 - 1 - i)
           for i, c in enumerate((1e25, math.inf, -math.inf, math.nan, -1.0, 0.5, MAX_COST_USD, 2 * MAX_COST_USD))]
    # by hand: cost {1, 3} (the 1e25 one is not available), wall {1, 3, 2} s, model calls {2, 2, 2},
    # tool calls and errors all 0 (skipped): CVs √2/2, 1/2, 0
    end = int((now - 50) * 1e9)
    hand = [_plain(rng, 200 + i, now, task="h", cost_usd=c, start_ns=end - w * 10**9, end_ns=end, model_calls=2,
                   tool_calls=0, tool_errors=0, total_tokens=None)
            for i, (c, w) in enumerate(((1.0, 1), (3.0, 3), (1e25, 2)))]
    store.insert_trials(odd + hand)
    sync(ru, live)  # raised StoreUnavailable (OverflowError serializing the row) before
    check(store, live, [G], now)
    h = live.stats(G, "all")
    c_res_h = score_stats(dataclasses.replace(h, task_ids=["h"], sums=h.sums[[h.task_ids.index("h")]],
                                              hist=[], trajectories=[[]], fsums=None, c_res=None,
                                              traj_values=None, traj_sizes=None, pooled_hist=None),
                          safety_measured=False, n_boot=0).metrics["C_res"].value
    assert c_res_h == pytest.approx(math.exp(-(math.sqrt(2) / 2 + 0.5 + 0.0) / 3), rel=1e-12)


def test_rollups_made_with_int128_squares_are_widened_at_start(store):
    """A store whose rollup tables an earlier version made (sums of squares Int128) has them
    altered to Int256 when the rollup starts, and huge values then fold in exactly."""
    now = time.time()
    rng = random.Random(3)
    Rollup(store, POLICY)
    for table in ("task_stats", "contrib", "contrib_log"):
        for r in range(6):
            store.query(f"ALTER TABLE {{db}}.{table} MODIFY COLUMN r{r}_ss Int128")
    runs = [_plain(rng, i, now, task="t0", start_ns=0) for i in range(70)]
    ru, live = start(store, runs, [G], now)
    types = store.query("SELECT DISTINCT type FROM system.columns WHERE database = %(d)s AND name LIKE 'r%%_ss'",
                        {"d": store.db})
    assert types == [("Int256",)]
    check(store, live, [G], now)


def _spread(rng, now, n=48):
    """``n`` runs over 4 tasks ending every 10 s back from ``now - 5``, and 6 ending just inside
    the last hour: every minute-level window has buckets to leave at the next minutes."""
    return ([_plain(rng, i, now, task=f"t{i % 4}", end_ns=int((now - 5 - 10 * i) * 1e9)) for i in range(n)]
            + [_plain(rng, 900 + i, now, task=f"t{i % 4}", end_ns=int((now - 3590 + 15 * i) * 1e9)) for i in range(6)])


def test_window_slides_read_ahead_then_made_before_a_later_sync_match_the_rollups(store):
    """The buckets the windows leave by a later clock are read ahead (the scoring stage does it
    on its check thread between cycles); a sync then stores a late run ending in a bucket being
    left and a new one. Made from that read before the sync's rows are applied, the slides give
    the memory ClickHouse and the batch scorer give: the late run's row is skipped by the windows
    it is before, as for any row before a window's start."""
    now = time.time()
    rng = random.Random(6)
    ru, live = start(store, _spread(rng, now), [G], now)
    later = now + 130
    plan = live.slide_plan([G], later)
    assert {"5m", "1h"} <= {p[1] for p in plan}
    gone = live.read_slides(plan)
    assert sum(st.sums[:, 0].sum() for st in gone) > 0  # the buckets left hold runs
    since5 = window_start(now, 300)
    store.insert_trials([_plain(rng, 500, now, task="t1", end_ns=(since5 + 5) * 10**9),
                         _plain(rng, 501, now, task="t2", end_ns=int((later - 3) * 1e9))])
    ru.sync()
    assert live.slide_from(plan, gone, later) == len(plan)
    live.apply(ru.rows)
    ru.rows = []
    assert live.advance_all([G], later) == {}  # nothing left to slide
    check(store, live, [G], later)


def test_window_slides_read_ahead_are_not_made_on_a_window_changed_since(store):
    """A read ahead describes the windows as they were: once a window changed (rows applied,
    reloaded) or its clock starts it elsewhere, its planned slide is not made from it and the
    ordinary slide (a read of its own) is; every window then matches the rollups and the batch
    scorer."""
    # half past an hour (in the past): the 130 s below cross minute boundaries only, so only the
    # minute-level windows (5m, 1h) slide. With the wall clock, one run in ~28 put an hour
    # boundary in those 130 s and planned the 24h window too; the new trial changes every window,
    # so none may be slid from the read — what the code did and the old expectation denied.
    now = (time.time() - 3600) // 3600 * 3600 + 1800
    rng = random.Random(7)
    ru, live = start(store, _spread(rng, now), [G], now)
    later = now + 130
    plan = live.slide_plan([G], later)
    assert {p[1] for p in plan} == {"5m", "1h"}
    gone = live.read_slides(plan)
    since5 = window_start(now, 300)
    store.insert_trials([_plain(rng, 600, now, task="t3", end_ns=(since5 + 5) * 10**9)])
    sync(ru, live)  # applied first: the 5m and 1h windows changed since the read
    assert live.slide_from(plan, gone, now) == 0  # a clock before the planned starts: none made
    assert live.slide_from(plan, gone, later) == 0  # changed since the read: none made from it
    assert {"5m", "1h"} <= set(live.advance_all([G], later)[G])
    check(store, live, [G], later)


def test_bucket_rollups_of_an_earlier_store_get_small_compressed_blocks_at_start(store):
    """The bucket rollups are read one bucket per group and part at each window slide; with
    ClickHouse's default compressed blocks (64 KiB: 8 granules) every such read decompressed 8×
    what it used. New stores make them with 4 KiB-minimum blocks; a store an earlier version made
    (no such settings) gets them when the rollup starts, once, and folds and checks as before."""
    def ddl():
        return dict(store.query("SELECT name, create_table_query FROM system.tables WHERE database = %(d)s "
                                "AND name IN ('task_stats', 'conf_stats')", {"d": store.db}))

    import re

    def blocks(text):
        return dict(re.findall(r"\b(m..)_compress_block_size = (\d+)\b", text))

    Rollup(store, POLICY)
    for name, text in ddl().items():
        assert blocks(text) == {"min": "4096", "max": "65536"}, name
    store.query("ALTER TABLE {db}.task_stats RESET SETTING min_compress_block_size, max_compress_block_size")
    # set by hand to another value (its text holds "min_compress_block_size = 4096" as a prefix)
    store.query("ALTER TABLE {db}.conf_stats MODIFY SETTING min_compress_block_size = 40960")
    assert blocks(ddl()["task_stats"]) == {} and blocks(ddl()["conf_stats"])["min"] == "40960"
    now = time.time()
    rng = random.Random(5)
    ru, live = start(store, [_plain(rng, i, now, task=f"t{i % 4}") for i in range(24)], [G], now)
    for name, text in ddl().items():
        assert blocks(text) == {"min": "4096", "max": "65536"}, name
    from relyscope.scoring.rollup import _small_blocks

    assert _small_blocks(store) == []  # already set: no second ALTER
    check(store, live, [G], now)


def test_an_outcome_posted_after_the_clock_stepped_back_reaches_the_live_scores(chdb_path, monkeypatch):
    """POST /api/v1/outcomes stores the outcome stamped with the wall clock; the rollup found
    posted outcomes by that stamp (after its watermark minus 30 s), so once the clock had stepped
    back more than that, a post was acknowledged ("recorded", and the API's own lookup shows it
    applied) but never reached the live scores — every window kept the old outcome until a
    rebuild. The API now tells the scorer which key it posted."""
    from fastapi.testclient import TestClient

    import relyscope.store.clickhouse as chm
    from relyscope.config import Settings
    from relyscope.exporter.api import create_api_app
    from relyscope.pipeline import Pipeline

    now = time.time()
    rng = random.Random(4)
    url = f"chdb://{chdb_path}"
    store = Store(url, database="o" + uuid.uuid4().hex[:10])
    trials = [_plain(rng, i, now, task=f"t{i % 3}", outcome="unknown") for i in range(9)]
    store.insert_trials(trials)
    store.insert_outcome(trials[0].trial_id, "trial", "failure", None, "feedback")
    p = Pipeline(Settings(store=url, n_boot=0, score_ci_background=False), store)
    try:
        p.rescore(all_groups=True)
        client = TestClient(create_api_app(p))
        real = chm.time.time_ns
        monkeypatch.setattr(chm.time, "time_ns", lambda: real() - 3600 * 10**9)  # the clock steps back 1 h
        for t, out in ((trials[1], "success"), (trials[2], "failure")):
            r = client.post("/api/v1/outcomes", json={"trial_id": t.trial_id, "outcome": out})
            assert r.status_code == 200 and r.json()["status"] == "recorded"
        r = client.post("/api/v1/outcomes", json={"trace_id": trials[3].trace_id, "outcome": "success"})
        assert r.status_code == 200
        monkeypatch.undo()
        got = sorted(apply_outcomes(store.load_trials(), store.outcomes()), key=lambda t: t.task_id)
        assert sum(t.outcome != "unknown" for t in got) == 4
        batch, _ = score_reviewed(got, None, n_boot=0, seed=0, max_k=p.settings.max_k)
        g = (trials[0].agent_name, trials[0].agent_version, trials[0].run_kind)
        for w in ("5m", "1h", "24h", "7d", "all"):
            assert_same(batch, p.scoring.window_scores[w][g])
        assert p.scoring.window_scores["all"][g].metrics["success_rate"].n_trials == 4
    finally:
        p.scoring.close()
        store.close()


def test_the_batch_scorer_keeps_no_queue_of_stored_traces(chdb_path):
    """With RELYSCOPE_INCREMENTAL_SCORING off nothing folds the worker's stored trace ids (or
    posted keys) into rollups, and nothing emptied their queue: it grew by every trace stored
    for the life of the process."""
    from relyscope.config import Settings
    from relyscope.scoring.stage import ScoreStage

    store = Store(f"chdb://{chdb_path}", database="q" + uuid.uuid4().hex[:10])
    rng = random.Random(5)
    trials = [_plain(rng, i, time.time(), task="t0") for i in range(50)]
    store.insert_trials(trials)
    stage = ScoreStage(Settings(store=f"chdb://{chdb_path}", incremental_scoring=False, n_boot=0), store, None)
    try:
        stage.trials_stored(trials)
        stage.rescore()
        assert stage.scores[(trials[0].agent_name, trials[0].agent_version, trials[0].run_kind)].trials == 50
        assert not stage._pending_traces
    finally:
        stage.close()
        store.close()


def test_the_other_pool_takes_only_its_members_whatever_their_names_hold(store):
    """The cardinality cap's 'other' group pools its member (agent, version) pairs; they were
    matched as concat(agent, NUL, version), so agent 'a\\0b' version 'c' (admitted, scored under
    its own labels) was also pooled into 'other' when 'a' / 'b\\0c' was a member: its trials
    counted twice, once in a group they are not in."""
    now = time.time()
    rng = random.Random(6)
    admitted, member = ("a\0b", "c", "production"), ("a", "b\0c", "production")
    trials = [trial(rng, i, now, task=f"t{i % 4}", agent_name=g[0], agent_version=g[1])
              for i, g in enumerate([admitted, member] * 15)]
    store.insert_trials(trials)
    ru = Rollup(store, POLICY)
    ru.sync()
    mine = sorted(apply_outcomes([t for t in store.load_trials() if t.agent_name == "a"], store.outcomes()),
                  key=lambda t: t.task_id)
    assert len(mine) == 15
    for name, length in WINDOWS:
        since = window_start(now, length)
        pooled = ru.window_stats(("other", "other", "production"), since, length, members=[member[:2]])
        batch, _ = score_reviewed([t for t in mine if t.end_ns >= since * 10**9], POLICY, n_boot=N_BOOT, seed=0,
                                  max_k=5)
        measured = policy_for(POLICY, member[0]) is not None
        assert_same(batch, score_stats(pooled, safety_measured=measured, n_boot=N_BOOT, seed=0, max_k=5))
    assert ru.window_stats(("other", "other", "production"), 0, None, members=[]).task_ids == []
    gone = ru.range_stats([member, admitted], 1, 0, 2**32 - 1)
    assert {g: int(st.col("n_all").sum()) for g, st in gone.items()} == {member: 15, admitted: 15}


def test_the_other_pool_keeps_each_members_tasks_apart(store):
    """Pooled members' tasks were merged by task id: agent X's two successes and agent Y's two
    failures of task "t" made one task of four runs — pass^2 = C(2,2)/C(4,2) = 1/6 and C_out 0
    for two perfectly consistent tasks (by hand: pass^2 = (1 + 0) / 2 = 0.5, C_out = 1, both
    over two tasks). Two versions of one agent are likewise two tasks."""
    now = time.time()
    rng = random.Random(8)
    members = [("X", "1"), ("Y", "1"), ("X", "2")]
    trials = [_plain(rng, 200 + i, now, task="t", agent_name=a, agent_version=v, outcome=o, confidence=None,
                     end_ns=int((now - 60 - i) * 1e9))
              for i, (a, v, o) in enumerate([("X", "1", "success"), ("X", "1", "success"), ("Y", "1", "failure"),
                                             ("Y", "1", "failure"), ("X", "2", "success")])]
    store.insert_trials(trials)
    ru = Rollup(store, POLICY)
    ru.sync()
    pooled = ru.window_stats(("other", "other", "production"), 0, None, members=members)
    assert len(pooled.task_ids) == 3
    gs = score_stats(pooled, safety_measured=False, n_boot=0, seed=0, max_k=5)
    assert gs.metrics["pass^2"].value == pytest.approx(0.5)  # X@1: 1, Y@1: 0 (X@2 has one run)
    assert gs.metrics["pass^2"].n_tasks == 2
    assert gs.metrics["C_out"].value == pytest.approx(1.0)
    assert gs.metrics["success_rate"].value == pytest.approx(3 / 5)


def test_one_trial_id_in_two_groups_is_two_trials(store):
    """The store keys a trial by (group, trial id): an application that numbers its trials
    (``relyscope.trial.id`` = 'task7-run3') for a baseline and a candidate version stores two
    trials. The rollup kept one contribution per trial id, so the second group's trial replaced
    the first's (lost from its group), and re-folding one group's trace retracted the other's.
    Also: a trial that moves to another group with a tombstone leaves its old group."""
    now = time.time()
    rng = random.Random(7)
    G2 = ("support", "2.0", "production")
    a = [trial(rng, i, now, task=f"t{i % 3}", trial_id=f"run{i}") for i in range(9)]
    b = [dataclasses.replace(trial(rng, 50 + i, now, task=f"t{i % 3}", agent_version="2.0"), trial_id=f"run{i}")
         for i in range(9)]
    ru, live = start(store, a, [G, G2], now)
    store.insert_trials(b)
    sync(ru, live)
    check(store, live, [G, G2], now)
    # late outcomes by the shared trial ids (both groups' trials), a re-finalized baseline trial
    for i in range(3):
        store.insert_outcome(f"run{i}", "trial", "success", None, "feedback")
    store.insert_trials([dataclasses.replace(a[4], revision=2, outcome="failure", steps=a[4].steps * 2)])
    sync(ru, live)
    check(store, live, [G, G2], now)
    # run5 of 1.0 becomes a trial of 3.0: tombstone in 1.0, the trial in 3.0
    G3 = ("support", "3.0", "production")
    store.insert_trials([dataclasses.replace(a[5], status="superseded", revision=2),
                         dataclasses.replace(a[5], agent_version="3.0", revision=2)])
    live.load(G3, now)
    sync(ru, live)
    check(store, live, [G, G2, G3], now)
    assert live.window(G, "all").trials() == 8 and live.window(G2, "all").trials() == 9
    fresh = LiveStats(Rollup(store, POLICY, traj_sample=1000), WINDOWS)  # restart
    for g in (G, G2, G3):
        fresh.load(g, now)
    check(store, fresh, [G, G2, G3], now)


def test_contributions_kept_by_trial_id_alone_are_rekeyed_at_start(store, monkeypatch):
    """A store whose ``contrib`` an earlier version keyed by trial id alone (its rows written
    then) gets the group in its key at the start; its rows stay the current contributions (later
    changes retract them) and a trial id then stored in a second group counts there too."""
    import relyscope.scoring.rollup as R

    now = time.time()
    rng = random.Random(8)
    a = [trial(rng, i, now, task=f"t{i % 3}", trial_id=f"run{i}") for i in range(9)]
    store.insert_trials(a)
    old_ddl = [d.replace(",\n        gkey String", "").replace("ORDER BY (trial_id, gkey)", "ORDER BY trial_id")
               .replace(f", {R._GKEY} AS gkey", "") for d in R.ROLLUP_SCHEMA]
    with monkeypatch.context() as m:  # the earlier version's tables, and its fold of the trials
        m.setattr(R, "ROLLUP_SCHEMA", old_ddl)
        m.setattr(R, "_key_contrib_by_group", lambda st: False)
        Rollup(store, POLICY).sync()
    key = "SELECT sorting_key FROM system.tables WHERE database = %(d)s AND name = 'contrib'"
    assert store.query(key, {"d": store.db}) == [("trial_id",)]
    assert store.query("SELECT count() FROM {db}.contrib")[0][0] == 9
    ru = Rollup(store, POLICY, traj_sample=1000)
    assert store.query(key, {"d": store.db}) == [("trial_id, gkey",)]
    G2 = ("support", "2.0", "production")
    b = [dataclasses.replace(trial(rng, 50 + i, now, task=f"t{i % 3}", agent_version="2.0"), trial_id=f"run{i}")
         for i in range(9)]
    store.insert_trials(b + [dataclasses.replace(a[1], revision=2, outcome="success", steps=a[1].steps * 2)])
    live = LiveStats(ru, WINDOWS)
    for g in (G, G2):
        live.load(g, now)
    sync(ru, live)
    check(store, live, [G, G2], now)


def test_the_stage_publishes_the_batch_scores_of_adversarial_traffic(chdb_path):
    """Through the scoring stage's cycles (sync, memory, sliding, CIs every cycle): far-future
    and epoch end times, a trial id shared by two groups, names with NUL, a group of one trial, one
    with no valid trial, one with only unknown outcomes, huge resources and costs — every window's
    published score equals the batch scorer's on the same stored trials, with max_k 5 and 2."""
    from relyscope.config import Settings
    from relyscope.scoring.stage import ScoreStage

    store = Store(f"chdb://{chdb_path}", database="z" + uuid.uuid4().hex[:10])
    rng = random.Random(10)
    now = time.time()

    def grp(agent, n, **kw):
        return [trial(rng, 1000 * len(agent) + i, now, agent_name=agent, **kw) for i in range(n)]

    trials = grp("mix", 40, task="x") + grp("a\0b", 6) + grp("one", 1, status="complete", outcome="success")
    trials += grp("zero", 4, status="incomplete") + grp("unknowns", 6, outcome="unknown", confidence=0.4)
    trials += [trial(rng, 5000 + i, now, agent_name="mix", end_ns=int(e * 1e9), start_ns=0, cost_usd=c)
               for i, (e, c) in enumerate(((now + 30 * 365 * 86400, 1e25), (0.0, None), (now - 10, math.inf),
                                           (now - 4000, 2.5), (now - 90000, 1e17)))]
    trials += [dataclasses.replace(t, agent_version="2.0", trace_id=f"{int(t.trace_id, 16) + 777:032x}")
               for t in trials[:10]]  # the same trial ids in group mix/2.0
    store.insert_trials(trials[: len(trials) // 2])
    for max_k in (5, 2):
        s = Settings(store=f"chdb://{chdb_path}", n_boot=N_BOOT, score_ci_background=False,
                     score_ci_interval_s=0.0, max_k=max_k)
        stage = ScoreStage(s, store, POLICY)
        try:
            stage.rescore(all_groups=True)
            rest = trials[len(trials) // 2:] if max_k == 5 else []
            store.insert_trials(rest)
            stage.trials_stored(rest)
            stage.rescore()
            at = time.time()
            groups = {(t.agent_name, t.agent_version, t.run_kind) for t in trials}
            for g in sorted(groups):
                for name, length in stage.windows:
                    since = window_start(at, length)
                    got = stage.window_scores[name].get(g)
                    mine = store.load_trials(agent=g[0], version=g[1], run_kind=g[2], since_ns=since * 10**9)
                    mine = sorted(apply_outcomes(mine, store.outcomes()), key=lambda t: t.task_id)
                    batch, _ = score_reviewed(mine, POLICY, n_boot=N_BOOT, seed=0, max_k=max_k)
                    assert got is not None, (g, name)
                    try:
                        assert_same(batch, got)
                    except AssertionError as e:
                        raise AssertionError(f"max_k {max_k} {g} {name}: {e}") from e
        finally:
            stage.close()
    store.close()


def test_a_small_case_by_hand_unknown_outcomes_stay_unknown(store):
    """By hand (metrics.md §2, §3): task A has outcomes success, success, failure; task B
    success and unknown; task C only unknowns. Known: n = (3, 1, 0), c = (2, 1, 0).
    success_rate = 3/4; pass@1 = mean(2/3, 1) = 5/6 over 2 tasks; pass^2 over tasks with n ≥ 2
    (A only) = C(2,2)/C(3,2) = 1/3; C_out(A) = (2·2/3 − 1)² = 1/9 (B, C: n < 2); unanimity 0.
    An unknown outcome counted as a failure would give 3/6 and pass@1 = mean(2/3, 1/2, 0)."""
    now = time.time()
    rng = random.Random(11)
    outs = [("A", "success"), ("A", "success"), ("A", "failure"), ("B", "success"), ("B", "unknown"),
            ("C", "unknown"), ("C", "unknown")]
    trials = [_plain(rng, i, now, task=task, outcome=o) for i, (task, o) in enumerate(outs)]
    ru, live = start(store, trials, [G], now)
    check(store, live, [G], now)
    for name in ("5m", "all"):
        m = score_stats(live.stats(G, name), safety_measured=True, n_boot=0, max_k=5).metrics
        assert (m["success_rate"].value, m["success_rate"].n_tasks, m["success_rate"].n_trials) == (0.75, 2, 4)
        assert m["pass@1"].value == pytest.approx(5 / 6) and m["pass@1"].n_tasks == 2
        assert m["pass^2"].value == pytest.approx(1 / 3) and m["pass^2"].n_tasks == 1
        assert m["C_out"].value == pytest.approx(1 / 9) and m["unanimity"].value == 0.0
        assert "pass@4" not in m  # K = the most known outcomes of a task (3)
    gu = ("unk", "1.0", "production")  # a group with outcomes all unknown: undefined, never 0
    store.insert_trials([_plain(rng, 50 + i, now, task=f"u{i % 2}", outcome="unknown", agent_name="unk")
                         for i in range(4)])
    live.load(gu, now)
    sync(ru, live)
    check(store, live, [G, gu], now)
    m = score_stats(live.stats(gu, "all"), safety_measured=True, n_boot=0).metrics
    assert math.isnan(m["success_rate"].value) and m["success_rate"].n_trials == 0
    assert math.isnan(m["pass@1"].value) and math.isnan(m["C_out"].value)


class _SteppedClock:
    """A ``time`` module whose wall clock reads ``back_ns`` behind the real one (an NTP step)."""

    def __init__(self, back_ns: int):
        self.back_ns = back_ns

    def time_ns(self) -> int:
        return time.time_ns() - self.back_ns

    def time(self) -> float:
        return self.time_ns() / 1e9

    def __getattr__(self, name):
        return getattr(time, name)


def test_writes_after_the_clock_stepped_back_replace_the_earlier_ones(store, monkeypatch):
    """Versions were wall-clock stamps: after the clock stepped back, a re-finalized trial's row
    (and a later outcome post) had a *lower* version than the row it replaces, so the store kept
    the old trial (both scorers scored a stale outcome) and the rollup's ``contrib`` kept the old
    contribution (the next change retracted a state already retracted: sums corrupted). Stamps of
    one writer now never go back (each above the last it wrote or finds ahead of the clock)."""
    import relyscope.scoring.rollup as R
    import relyscope.store.clickhouse as chm

    now = time.time()
    rng = random.Random(12)
    trials = [_plain(rng, i, now, task=f"t{i % 3}", outcome="failure") for i in range(6)]
    ru, live = start(store, trials, [G], now)
    t = trials[0]
    store.insert_trials([dataclasses.replace(t, revision=2, outcome="success")])
    store.insert_outcome(trials[1].trial_id, "trial", "success", None, "feedback")
    sync(ru, live)
    step = _SteppedClock(3600 * 10**9)
    monkeypatch.setattr(chm, "time", step)  # the sidecar's clock steps back 1 h
    monkeypatch.setattr(R, "time", step)
    store.insert_trials([dataclasses.replace(t, revision=3, outcome="failure", task_id="t1")])
    store.insert_outcome(trials[1].trial_id, "trial", "failure", None, "feedback")  # the latest post
    ru.sync(trace_ids=[t.trace_id, trials[1].trace_id])
    live.apply(ru.rows)
    ru.rows = []
    got = {x.trial_id: x for x in apply_outcomes(store.load_trials(), store.outcomes())}
    assert (got[t.trial_id].revision, got[t.trial_id].task_id) == (3, "t1")
    assert got[trials[1].trial_id].outcome == "failure"
    check(store, live, [G], now)
    store.insert_trials([dataclasses.replace(t, revision=4, outcome="success", task_id="t2")])
    ru.sync(trace_ids=[t.trace_id])
    live.apply(ru.rows)
    ru.rows = []
    check(store, live, [G], now)
    fresh = LiveStats(ru, WINDOWS)
    fresh.load(G, now)
    check(store, fresh, [G], now)
    # a restarted process (no memory of its last stamps) continues above those ahead of its clock
    store._stamps.clear()
    store.insert_trials([dataclasses.replace(t, revision=5, outcome="failure", task_id="t0")])
    ru2 = Rollup(store, POLICY, traj_sample=1000)
    ru2.sync(trace_ids=[t.trace_id])
    assert store.load_trials(trace_ids=[t.trace_id])[0].revision == 5
    live2 = LiveStats(ru2, WINDOWS)
    live2.load(G, now)
    check(store, live2, [G], now)


def test_a_sliding_window_recomputes_c_traj_only_of_tasks_whose_runs_left_it(store):
    """As a window slides, only a task whose oldest run in the window ended before the new start
    has its C_traj values recomputed (all of them were, every minute: ~0.1 s a slide at 1 000
    tasks); the values kept for the others still equal those computed from ClickHouse's
    trajectory sample (the path with no per-task cache)."""
    now = (int(time.time()) // 60) * 60 + 30.0  # mid-minute: the 5m window starts at now - 5m30s
    rng = random.Random(11)
    since = window_start(now, 300)
    acts = [("llm", "search"), ("llm", "issue_refund"), ("llm",), ("search", "llm")]
    trials = []
    for i in range(8):  # 'old': two runs in the first minute of the 5m window, the rest recent
        end = (since + 10 + i) if i < 2 else (now - 20 - i)
        t = trial(rng, i, now, task="old", end_ns=int(end * 1e9), outcome="success", status="complete",
                  perturbation_family=None)
        trials.append(dataclasses.replace(t, steps=tuple(dataclasses.replace(t.steps[0], action=a, name=a, span_id=f"{i}{j}")
                                                         for j, a in enumerate(acts[i % 4]))))
    for i in range(8, 16):  # 'new': every run in the last two minutes
        t = trial(rng, i, now, task="new", end_ns=int((now - 20 - i) * 1e9), outcome="success", status="complete",
                  perturbation_family=None)
        trials.append(dataclasses.replace(t, steps=tuple(dataclasses.replace(t.steps[0], action=a, name=a, span_id=f"{i}{j}")
                                                         for j, a in enumerate(acts[i % 4]))))
    ru, live = start(store, trials, [G], now)
    live.stats(G, "5m")  # computes (and caches) every task's C_traj values
    ws = live.window(G, "5m")
    assert ws.tj_ok[[ws.ids["old"], ws.ids["new"]]].all()
    later = now + 60  # the window's start moves one minute: old's two first runs leave it
    live.advance_all([G], later)
    ws = live.window(G, "5m")
    assert ws.tj_ok[ws.ids["new"]] and not ws.tj_ok[ws.ids["old"]]
    assert int(ws.tj[ws.ids["new"], 0]) == 8
    mine = live.stats(G, "5m", trajectories=False, points_only=True)
    ref = ru.window_stats(G, window_start(later, 300), 300)
    assert mine.task_ids == ref.task_ids == ["new", "old"]
    assert [len(x) for x in ref.trajectories] == [8, 6]
    a = score_stats(mine, safety_measured=True, n_boot=0, seed=0, max_k=5)
    b = score_stats(ref, safety_measured=True, n_boot=0, seed=0, max_k=5)
    for key in ("C_traj_d", "C_traj_s", "C_traj"):
        assert a.metrics[key].value == pytest.approx(b.metrics[key].value, rel=1e-12, nan_ok=True), key
    assert not math.isnan(b.metrics["C_traj_d"].value)


def test_ranges_stats_reads_several_overlapping_bucket_ranges_at_once(store):
    """One read for the buckets every sliding window of a level leaves: per (group, range) the
    sums of the minute buckets in [since, until), a bucket in two ranges counted in both."""
    now = (int(time.time()) // 60) * 60 + 30.0
    rng = random.Random(12)
    m = [int(now // 60) * 60 - 60 * k for k in (10, 9, 8)]  # three minute buckets, oldest first
    G2 = ("support", "2.0", "production")
    trials = [trial(rng, i, now, task=f"t{i % 2}", end_ns=int((m[i % 3] + 5) * 1e9), agent_version=v)
              for i, v in enumerate(["1.0"] * 6 + ["2.0"] * 3)]
    # G: buckets m0, m1, m2 hold trials 0,3 / 1,4 / 2,5; G2: trials 6 (m0), 7 (m1), 8 (m2)
    store.insert_trials(trials)
    ru = Rollup(store, POLICY)
    ru.sync()
    got = ru.ranges_stats([G, G2], 1, [(m[0], m[2]), (m[1], m[2] + 60), (m[2] + 60, m[2] + 120)])
    n = {k: int(st.col("n_all").sum()) if st.task_ids else 0 for k, st in got.items()}
    assert n == {(G, 0): 4, (G, 1): 4, (G, 2): 0, (G2, 0): 2, (G2, 1): 2, (G2, 2): 0}
    assert got[(G, 0)].task_ids == ["t0", "t1"]  # trials 0, 4 are t0; 1, 3 are t1
    one = ru.range_stats([G, G2], 1, m[1], m[2] + 60)
    assert same_stats(one[G], got[(G, 1)]) and same_stats(one[G2], got[(G2, 1)])


def test_the_intern_table_of_action_sequences_stays_proportional_to_the_samples(store, monkeypatch):
    """Every run's action sequence is interned (one tuple per distinct sequence); sequences of
    runs no sample holds any more are dropped when the table doubles past what the samples hold
    — it used to keep up to 200 000 of them whatever the samples held. Traffic of ever new
    sequences (every run's action names made unique) through a real sync: the table ends within max(floor, 2 × the
    samples' distinct sequences), and the samples' tuples are still the table's own."""
    from relyscope.scoring import live as L

    monkeypatch.setattr(L, "_INTERN_MIN", 50)
    rng = random.Random(41)
    now = int(time.time())
    ru = Rollup(store, POLICY)
    live = LiveStats(ru, parse_windows("1h,all"))
    g = ("a", "1.0", "production")
    for batch in range(10):
        trials = [dataclasses.replace(make_trial(rng, 100 * batch + i, task=f"t{i % 4}", agent="a",
                                                 end_ns=(now - 100 + batch * 5 + i % 5) * 10**9),
                                      status="complete", outcome="success", perturbation_family=None)
                  for i in range(100)]
        trials = [dataclasses.replace(t, steps=tuple(dataclasses.replace(st, action=f"{st.action}{100 * batch + i}")
                                                     for st in t.steps)) for i, t in enumerate(trials)]
        store.insert_trials(trials)
        ru.sync()
        if not live.loaded(g):
            live.load(g, now)
        else:
            live.apply(ru.rows)
        ru.rows = []
    kept = {e[2] for runs in live._traj[g].values() for e in runs}
    assert len(kept) == 4 * ru.traj_sample  # the M most recent runs of each of the 4 tasks, all distinct
    assert len(live._interned) <= max(50, 2 * len(kept)) + 1
    assert all(live._interned[e[2]] is e[2] for runs in live._traj[g].values() for e in runs)


def test_window_exact_sums_stay_int64_per_column_until_one_could_overflow_then_are_python_ints():
    """A window keeps each Int128 / Int256 sum column in int64 (memory: ~8 B a value instead of
    ~48) and turns that column alone into exact Python ints the first time one of its partial
    sums could reach 2 ** 62. Values by hand, with repeated rows in one add and subtractions on
    both sides of the switch; the other columns stay int64."""
    import numpy as np

    from relyscope.scoring.live import _BIG, _NCOL, WindowState

    last = len(_BIG) - 1

    def sums(small, big, n=1):  # n: the trials (n_all) each row adds, what keeps a task alive
        a = np.zeros((len(small), _NCOL), dtype=object)
        for i, (x, y) in enumerate(zip(small, big)):
            a[i, 0], a[i, _BIG[0]], a[i, _BIG[last]] = n, x, y
        return a

    ws = WindowState("all", None, 0, 1, 0, False)
    ws.add(["a", "b", "b"], sums([3, 1, 1], [3, 2**60, 2**60]))  # b: 2^61, within the int64 range kept
    ws.add(["a"], sums([1], [1], n=0), sign=-1)
    assert [c.dtype for c in ws.bigs.cols] == [np.dtype(np.int64)] * len(_BIG)
    assert ws.bigs.rows(np.array([ws.ids["a"], ws.ids["b"]]))[:, [0, last]].tolist() == [[2, 2], [2, 2**61]]
    ws.add(["b", "b"], sums([0, 0], [2**60, 2**60]))  # 2^61 + 2^61 = 2^62: could overflow → exact
    assert ws.bigs.cols[last].dtype == object and ws.bigs.cols[0].dtype == np.int64
    ws.add(["b", "a"], sums([5, 5], [2**200, 5]))
    ws.add(["b"], sums([1], [2**200 - 7], n=0), sign=-1)
    ws.add(["a"], sums([2**62], [0], n=0), sign=-1)  # a subtraction that could overflow: column 0 exact too
    assert ws.bigs.cols[0].dtype == object
    ws.add(["a"], sums([2**62], [0], n=0))
    for _ in range(3):  # rows grown (new tasks) and compacted (a task gone) keep every value
        ws.add([f"x{i}" for i in range(40)], sums([1] * 40, [1] * 40))
    ws.add([f"x{i}" for i in range(40)], sums([3] * 40, [3] * 40, n=3), sign=-1)
    ws.compact()
    got = ws.bigs.rows(np.array([ws.ids["a"], ws.ids["b"]]))[:, [0, last]]
    assert got.tolist() == [[7, 7], [6, 2**62 + 7]] and all(type(x) is int for x in got.ravel())
    assert set(ws.ids) == {"a", "b"}


def test_window_counts_stay_int32_until_one_could_reach_2_to_30_then_are_int64_and_exact():
    """A window keeps its Int64 sums (counts) in int32 (~160 B a task instead of 320) and turns
    them into int64 before an add whose |row| + Σ|added| could reach 2 ** 30 — int32 would wrap
    silently past 2 ** 31. Values by hand, with a repeated row in one add and a subtraction."""
    import numpy as np

    from relyscope.scoring.live import _NCOL, WindowState

    def sums(ns, c=0):
        a = np.zeros((len(ns), _NCOL), dtype=object)
        a[:, :] = 0
        for i, n in enumerate(ns):
            a[i, 0], a[i, 3] = n, c  # n_all, c
        return a

    ws = WindowState("all", None, 0, 1, 0, False)
    ws.add(["a", "b"], sums([5, 2**29], c=1))
    assert ws.ints.dtype == np.int32
    ws.add(["a"], sums([2], c=1), sign=-1)
    assert ws.ints.dtype == np.int32 and ws.ints[ws.ids["a"], 0] == 3
    # b: 2^29 + 2^28 + 2^28 = 2^30 by the two rows of one add: could reach the bound → int64
    ws.add(["b", "b"], sums([2**28, 2**28]))
    assert ws.ints.dtype == np.int64
    ws.add(["b", "b"], sums([2**30, 2**30]))  # 3 · 2^30 = 3 221 225 472 > 2^31: wrapped in int32
    assert int(ws.ints[ws.ids["b"], 0]) == 3 * 2**30 and ws.trials() == 3 * 2**30 + 3
    # c: a got +1 then −1 (the subtraction's); b +1 once (its later rows carry c = 0)
    assert int(ws.ints[ws.ids["a"], 3]) == 0 and int(ws.ints[ws.ids["b"], 3]) == 1


def test_window_counts_promoted_by_a_subtraction_keep_their_values_through_compaction():
    """The int32 bound holds for subtractions too (|row| + Σ|subtracted|), and a promoted window's
    rows keep int64 and their values when compacted. Values by hand."""
    import numpy as np

    from relyscope.scoring.live import _NCOL, WindowState

    def sums(n):
        a = np.zeros((1, _NCOL), dtype=object)
        a[:, :] = 0
        a[0, 0] = n
        return a

    ws = WindowState("all", None, 0, 1, 0, False)
    for t in ("a", "b", "c"):
        ws.add([t], sums(5))
    ws.add(["a"], sums(2**30), sign=-1)  # 5 − 2^30: reaches the bound from below
    assert ws.ints.dtype == np.int64
    ws.add(["b"], sums(5), sign=-1)  # b left without trials
    ws.add(["c"], sums(5), sign=-1)  # c too: 1 live row of 3 → compacted
    ws.compact()
    assert ws.tasks == ["a"] and ws.ints.dtype == np.int64 and int(ws.ints[0, 0]) == 5 - 2**30
