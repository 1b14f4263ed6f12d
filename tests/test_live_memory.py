"""The in-memory window statistics (relyscope.scoring.live) equal what the ClickHouse rollups
hold for the same window (Rollup.window_stats) and score like the batch scorer on the same trials
— through a second batch, late outcomes, re-finalized trials (new end, task, outcome, actions), a
re-keyed trial, retracted runs of a full trajectory sample (refilled), a restart (reload) and the
windows sliding forward (the buckets they leave subtracted). And the scoring stage publishes
every window's point estimates from memory while long windows keep the CIs of their last refresh."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid

import pytest

from live_traffic import make_trial
from relyscope.config import Settings
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.review import policy_for, score_reviewed
from relyscope.scoring.live import LiveStats, same_stats
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.scoring.stage import ScoreStage
from relyscope.scoring.stats import score_stats
from relyscope.scoring.windows import parse_windows
from relyscope.store import Store
from relyscope.testing import OffsetClock
from test_live_rollup import GROUPS, NOW, POLICY, traffic
from test_scoring_stats import assert_same

WINDOWS = parse_windows("5m,1h,24h,7d,all")
N_BOOT = 60


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("live") / "data")


@pytest.fixture()
def store(chdb_path):
    st = Store(f"chdb://{chdb_path}", database="m" + uuid.uuid4().hex[:10])
    yield st
    st.close()  # one embedded engine per process: the next module opens another path


def check(store: Store, lives: list[LiveStats], now: float) -> None:
    """Every window of every group: memory == rollups (sums, histogram, trajectory sample) for
    each LiveStats (one with M = 3, one with M large), and scores == batch scores (the large-M
    one: its sample is every successful run) — with CIs for short windows, point estimates for the
    long ones (their memory keeps the histogram pooled)."""
    for live in lives:
        for g in GROUPS:
            for name, length in WINDOWS:
                since = window_start(now, length)
                mine, ref = live.stats(g, name), live.rollup.window_stats(g, since, length)
                assert same_stats(mine, ref, pooled=live.window(g, name).pooled), (live.m, g, name)
                # the pooled twin point estimates read equals the per-task histogram summed over tasks
                pooled: dict = {}
                for _, q, p, n in mine.hist:
                    acc = pooled.setdefault(q, [0, 0])
                    acc[0] += p
                    acc[1] += n
                want = sorted((q, p, n) for q, (p, n) in pooled.items() if p or n)
                if not live.window(g, name).pooled:
                    assert live.stats(g, name, trajectories=False, points_only=True).pooled_hist == want, (g, name)
    full = lives[-1]
    for g in GROUPS:
        for name, length in WINDOWS:
            since = window_start(now, length)
            trials = store.load_trials(agent=g[0], version=g[1], run_kind=g[2], since_ns=since * 10**9)
            trials = sorted(apply_outcomes(trials, store.outcomes()), key=lambda t: t.task_id)
            pooled = full.window(g, name).pooled
            nb = 0 if pooled else N_BOOT
            batch, _ = score_reviewed(trials, POLICY, n_boot=nb, seed=0, max_k=5)
            # with the sample's action lists, and as the stage scores point estimates: without
            # them, from the per-task values kept in memory (recomputed for changed tasks only)
            for lists in (True, False):
                inc = score_stats(full.stats(g, name, trajectories=lists), n_boot=nb, seed=0, max_k=5,
                                  safety_measured=policy_for(POLICY, g[0]) is not None)
                try:
                    assert_same(batch, inc)
                except AssertionError as e:
                    raise AssertionError(f"group {g} window {name} (lists {lists}): {e}") from e


def sync(rollup: Rollup, lives: list[LiveStats]) -> None:
    rollup.sync()
    for live in lives:
        live.apply(rollup.rows)
    rollup.rows = []


def test_memory_equals_rollups_and_batch_through_changes_restart_and_sliding(store):
    trials = traffic(1, 500)
    store.insert_trials(trials[:300])
    rollup = Rollup(store, POLICY, traj_sample=3)
    rollup.sync()
    rollup.rows = []
    lives = [LiveStats(rollup, WINDOWS), LiveStats(Rollup(store, POLICY, traj_sample=1000), WINDOWS)]
    for live in lives:
        for g in GROUPS:
            live.load(g, NOW)
    store.insert_trials(trials[300:])
    sync(rollup, lives)
    check(store, lives, NOW)

    rng = random.Random(7)
    for t in rng.sample(trials, 50):  # late outcomes by trial and by trace id
        key, kind = (t.trial_id, "trial") if rng.random() < 0.5 else (t.trace_id, "trace")
        store.insert_outcome(key, kind, rng.choice(("success", "failure")), None, "feedback")
    sync(rollup, lives)
    check(store, lives, NOW)

    # re-finalized: later end (other bucket), other outcome/actions, sometimes another task; the
    # most recent successful runs of a task among them, so full samples lose runs and refill
    refinal = []
    for t in rng.sample(trials, 40):
        refinal.append(dataclasses.replace(
            t, revision=2, end_ns=int((NOW - rng.uniform(0, 200)) * 1e9), outcome=rng.choice(("success", "failure")),
            steps=t.steps[:1] + t.steps, task_id=t.task_id if rng.random() < 0.7 else "t99"))
    old = trials[11]
    store.insert_trials(refinal + [dataclasses.replace(old, status="superseded"),
                                   dataclasses.replace(old, trial_id=old.trial_id + "-r", revision=2)])
    sync(rollup, lives)
    check(store, lives, NOW)

    # restart: fresh memory loaded from the rollups equals the memory kept up to date
    restarted = [LiveStats(live.rollup, WINDOWS) for live in lives]
    for live in restarted:
        for g in GROUPS:
            live.load(g, NOW)
    check(store, restarted, NOW)

    # the windows slide: 7 min, 3 h, 2 days later (minute and hour buckets leave; 5m empties)
    for later in (NOW + 420, NOW + 3 * 3600, NOW + 2 * 86400):
        for g in GROUPS:  # one group at a time, and all groups in one read per bucket range
            lives[0].advance(g, later)
        lives[1].advance_all(list(GROUPS), later)
        check(store, lives, later)
    assert all(live.mismatches == 0 for live in lives)


def test_check_finds_and_repairs_a_difference(store):
    store.insert_trials(traffic(3, 120))
    rollup = Rollup(store, POLICY)
    rollup.sync()
    live = LiveStats(rollup, WINDOWS)
    g = GROUPS[0]
    live.load(g, NOW)
    ws = live.window(g, "all")
    ws.ints[0, 0] += 1  # a lost update
    assert live.check(g, "all", NOW) is False and live.mismatches == 1
    assert live.check(g, "all", NOW) is True
    assert same_stats(live.stats(g, "all"), rollup.window_stats(g, 0, None), pooled=True)


def test_stage_publishes_points_every_cycle_and_long_cis_on_cadence(chdb_path):
    """With a CI cadence longer than the test, a second cycle's new trial moves the point
    estimates of every window at once; the 5m/1h windows get fresh CIs, the 24h/7d/all ones keep
    their previous CIs; a flush (all_groups) refreshes them to the batch result."""
    db = "s" + uuid.uuid4().hex[:10]
    store = Store(f"chdb://{chdb_path}", database=db)
    now_s = time.time()  # the stage reads the clock: NOW (module import) may be minutes old in a full run
    rng = random.Random(4)
    base = [make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9), agent="a") for i in range(60)]
    base = [dataclasses.replace(t, status="complete", perturbation_family=None,
                                outcome="success" if i % 3 else "failure") for i, t in enumerate(base)]
    store.insert_trials(base)
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=3600, score_ci_every_cycle="5m,1h",
                        store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    stage.rescore(all_groups=True)
    g = ("a", "1.0", "production")
    first = {w: stage.window_scores[w][g] for w, _ in WINDOWS}
    extra = [dataclasses.replace(base[0], trial_id=f"x{i}", trace_id=f"{9000 + i:032x}", outcome="failure",
                                 end_ns=int((now_s - 5) * 1e9)) for i in range(6)]
    store.insert_trials(extra)
    stage.rescore()
    now = stage.window_scores
    for w, _ in WINDOWS:
        sr_then, sr_now = first[w].metrics["success_rate"], now[w][g].metrics["success_rate"]
        assert sr_now.value == pytest.approx(sum(1 for i in range(60) if i % 3) / 66)
        if w in ("5m", "1h"):
            assert sr_now.ci != sr_then.ci  # recomputed
        else:
            assert sr_now.ci == sr_then.ci  # the last refresh's CI
    stage.rescore(all_groups=True)
    trials = sorted(store.load_trials(agent="a"), key=lambda t: t.task_id)
    batch, _ = score_reviewed(trials, None, n_boot=N_BOOT, seed=0, max_k=settings.max_k)
    assert_same(batch, stage.window_scores["all"][g])
    store.close()


def test_background_ci_refreshes_are_published_by_the_next_cycle(chdb_path):
    """RELYSCOPE_SCORE_CI_BACKGROUND (default): a due refresh runs on the CI thread, and a later
    cycle publishes it — the long windows' CIs then equal the batch scorer's on the same trials
    (same B, same seed), drift is computed, and the primary window's scores row is written."""
    store = Store(f"chdb://{chdb_path}", database="b" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(9)
    base = [dataclasses.replace(make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9), agent="a"),
                                status="complete", perturbation_family=None, outcome="success" if i % 3 else "failure")
            for i in range(60)]
    store.insert_trials(base)
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=3600, store=f"chdb://{chdb_path}")
    assert settings.score_ci_background
    stage = ScoreStage(settings, store, None)
    try:
        stage.rescore(all_groups=True)
        g = ("a", "1.0", "production")
        extra = [dataclasses.replace(base[0], trial_id=f"x{i}", trace_id=f"{9100 + i:032x}", outcome="failure",
                                     end_ns=int((now_s - 5) * 1e9)) for i in range(6)]
        store.insert_trials(extra)
        stage.settings = settings.model_copy(update={"score_ci_interval_s": 0.0})  # every changed CI due now
        stage.rescore()
        assert {k for k in stage._ci_jobs} >= {(g, "all"), (g, "24h"), (g, "drift")}
        for fut, _, _ in list(stage._ci_jobs.values()):
            fut.result(timeout=60)
        stage.rescore()  # publishes them
        assert stage.last_background[0] >= 3
        trials = sorted(store.load_trials(agent="a"), key=lambda t: t.task_id)
        batch, _ = score_reviewed(trials, None, n_boot=N_BOOT, seed=0, max_k=settings.max_k)
        for w in ("24h", "7d", "all"):  # every trial ended within the last 2 minutes
            assert_same(batch, stage.window_scores[w][g])
        assert g in stage.drift and "success_rate" in stage.drift[g]
        rows = store.query("SELECT count() FROM {db}.scores WHERE agent = 'a' AND n_boot = %(b)s", {"b": N_BOOT})
        assert rows[0][0] > 0
    finally:
        stage.close()
        store.close()


def test_a_window_ci_is_refreshed_once_enough_of_its_trials_changed(chdb_path):
    """RELYSCOPE_SCORE_CI_MIN_CHANGE (5 %): past the interval, a window's CI is recomputed only
    once ≥ 5 % of its trials (at the last refresh) were added, re-graded or slid out — 2 new
    trials in 100 are not enough, 6 more are — or once it is RELYSCOPE_SCORE_CI_MAX_AGE_S old."""
    store = Store(f"chdb://{chdb_path}", database="c" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(11)

    def batch(lo, hi):
        return [dataclasses.replace(make_trial(rng, i, task=f"t{i % 10}", end_ns=int((now_s - 60 - i % 50) * 1e9),
                                               agent="a"), trace_id=f"{7000 + i:032x}", trial_id=f"c{i}")
                for i in range(lo, hi)]

    store.insert_trials(batch(0, 100))
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=0.001, score_ci_background=False,
                        store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    try:
        stage.rescore(all_groups=True)
        g, key = ("a", "1.0", "production"), (("a", "1.0", "production"), "all")
        at = stage._ci_at[key]
        time.sleep(0.01)
        store.insert_trials(batch(100, 102))  # 2 of 100: below 5 %
        stage.rescore()
        assert stage._ci_at[key] == at and stage.window_scores["all"][g].trials == 102
        time.sleep(0.01)
        store.insert_trials(batch(102, 108))  # 8 of 100 since the refresh
        stage.rescore()
        assert stage._ci_at[key] > at
        at = stage._ci_at[key]
        time.sleep(0.01)
        store.insert_trials(batch(108, 109))
        stage.rescore()
        assert stage._ci_at[key] == at
        stage.settings = settings.model_copy(update={"score_ci_max_age_s": 0.001})
        time.sleep(0.01)
        store.insert_trials(batch(109, 110))
        stage.rescore()
        assert stage._ci_at[key] > at
    finally:
        stage.close()
        store.close()


def test_a_background_refresh_that_failed_is_retried_once_the_store_answers(chdb_path):
    """A due refresh (8 of 100 trials changed: above RELYSCOPE_SCORE_CI_MIN_CHANGE) whose
    ClickHouse read fails on the CI thread stays due: once the store answers again the next cycles
    recompute it (CIs = the batch scorer's), without waiting for another 5 % of changes or
    RELYSCOPE_SCORE_CI_MAX_AGE_S. It used to be recorded as refreshed at the failed attempt."""
    import threading

    store = Store(f"chdb://{chdb_path}", database="f" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(13)

    def batch(lo, hi):
        return [dataclasses.replace(make_trial(rng, i, task=f"t{i % 10}", end_ns=int((now_s - 60 - i % 50) * 1e9),
                                               agent="a"), trace_id=f"{6000 + i:032x}", trial_id=f"f{i}",
                                    status="complete", perturbation_family=None,
                                    outcome="success" if i % 3 else "failure")
                for i in range(lo, hi)]

    store.insert_trials(batch(0, 100))
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=0.001, score_ci_max_age_s=3600,
                        store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    g = ("a", "1.0", "production")
    key = (g, "all")
    gate = threading.Event()
    try:
        stage.rescore(all_groups=True)
        at = stage._ci_at[key]
        time.sleep(0.01)
        store.insert_trials(batch(100, 108))
        blocker = stage._ci_pool.submit(gate.wait, 60)  # the CI thread is busy: the jobs queue
        stage.rescore()
        assert key in stage._ci_jobs
        store.query("RENAME TABLE {db}.task_stats TO {db}.task_stats_away")  # the window read fails
        gate.set()
        blocker.result(timeout=60)
        fut = stage._ci_jobs[key][0]
        with pytest.raises(Exception):
            fut.result(timeout=60)
        store.query("RENAME TABLE {db}.task_stats_away TO {db}.task_stats")  # the store answers again
        for _ in range(3):
            time.sleep(0.01)
            stage.rescore()
            for f, _, _ in list(stage._ci_jobs.values()):
                f.result(timeout=60)
        assert stage._ci_at[key] > at
        trials = sorted(store.load_trials(agent="a"), key=lambda t: t.task_id)
        ref, _ = score_reviewed(trials, None, n_boot=N_BOOT, seed=0, max_k=settings.max_k)
        assert_same(ref, stage.window_scores["all"][g])
    finally:
        gate.set()
        stage.close()
        store.close()


def test_a_flush_refreshes_cis_whose_background_refresh_is_still_pending(chdb_path):
    """A flush (rescore with all_groups) refreshes every changed CI at once, also those whose
    background refresh is queued behind a busy CI thread: its CIs equal the batch scorer's on the
    same trials, and the superseded job's result, when it comes, is not published over them. They
    used to be skipped (a job was pending), so the flush answered the CIs of before the change."""
    import threading

    store = Store(f"chdb://{chdb_path}", database="p" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(17)
    base = [dataclasses.replace(make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9), agent="a"),
                                status="complete", perturbation_family=None, outcome="success" if i % 3 else "failure")
            for i in range(60)]
    store.insert_trials(base)
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=0.0, store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    gate = threading.Event()
    g = ("a", "1.0", "production")
    try:
        stage.rescore(all_groups=True)
        extra = [dataclasses.replace(base[0], trial_id=f"p{i}", trace_id=f"{9300 + i:032x}", outcome="failure",
                                     end_ns=int((now_s - 5) * 1e9)) for i in range(6)]
        store.insert_trials(extra)
        blocker = stage._ci_pool.submit(gate.wait, 60)
        stage.rescore()
        assert (g, "all") in stage._ci_jobs
        stage.rescore(all_groups=True)  # the flush
        trials = sorted(store.load_trials(agent="a"), key=lambda t: t.task_id)
        batch, _ = score_reviewed(trials, None, n_boot=N_BOOT, seed=0, max_k=settings.max_k)
        for w in ("24h", "7d", "all"):
            assert_same(batch, stage.window_scores[w][g])
        gate.set()
        blocker.result(timeout=60)
        for f, _, _ in list(stage._ci_jobs.values()):
            f.result(timeout=60)
        stage.rescore()
        for w in ("24h", "7d", "all"):
            assert_same(batch, stage.window_scores[w][g])
    finally:
        gate.set()
        stage.close()
        store.close()


def test_a_clock_stepped_back_does_not_stop_ci_refreshes(chdb_path):
    """A CI computed while the wall clock read an hour ahead (the clock was then stepped back, e.g.
    by NTP after a VM resume): its age is unknown, not negative, so it is refreshed once the window
    changed enough (8 of 100 trials) — instead of an hour plus score_ci_interval_s later."""
    store = Store(f"chdb://{chdb_path}", database="k" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(19)

    def batch(lo, hi):
        return [dataclasses.replace(make_trial(rng, i, task=f"t{i % 10}", end_ns=int((now_s - 60 - i % 50) * 1e9),
                                               agent="a"), trace_id=f"{5000 + i:032x}", trial_id=f"k{i}")
                for i in range(lo, hi)]

    store.insert_trials(batch(0, 100))
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=0.001, score_ci_background=False,
                        store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    key = (("a", "1.0", "production"), "all")
    try:
        stage.rescore(all_groups=True)
        ahead = time.time() + 3600
        stage._ci_at = {k: ahead for k in stage._ci_at}  # as stamped by the clock before its step back
        store.insert_trials(batch(100, 108))
        for _ in range(3):
            stage.rescore()
            time.sleep(0.05)
        assert stage._ci_at[key] < ahead
        # and with fewer changes than RELYSCOPE_SCORE_CI_MIN_CHANGE: an unknown age is past the max age
        stage._ci_at = {k: ahead for k in stage._ci_at}
        store.insert_trials(batch(108, 109))
        for _ in range(3):
            stage.rescore()
            time.sleep(0.05)
        assert stage._ci_at[key] < ahead
    finally:
        stage.close()
        store.close()


def test_background_refreshes_collected_by_a_cycle_that_failed_are_not_lost(chdb_path):
    """The store fails part way through the cycle that collects finished background refreshes
    (here the consistency check's read): once it answers again, the drift and the long windows'
    CIs those refreshes computed are published (CIs = the batch scorer's), though the next refresh
    is an interval away. The failed cycle used to drop them, marked as refreshed."""
    store = Store(f"chdb://{chdb_path}", database="q" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(23)
    base = [dataclasses.replace(make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9), agent="a"),
                                status="complete", perturbation_family=None, outcome="success" if i % 3 else "failure")
            for i in range(60)]
    store.insert_trials(base)
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=3600, store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    g = ("a", "1.0", "production")
    try:
        stage.rescore(all_groups=True)
        stage.drift.pop(g, None)
        extra = [dataclasses.replace(base[0], trial_id=f"q{i}", trace_id=f"{9500 + i:032x}", outcome="failure",
                                     end_ns=int((now_s - 5) * 1e9)) for i in range(6)]
        store.insert_trials(extra)
        stage.settings = settings.model_copy(update={"score_ci_interval_s": 0.0})
        stage.rescore()
        assert {(g, "all"), (g, "drift")} <= set(stage._ci_jobs)
        for f, _, _ in list(stage._ci_jobs.values()):
            f.result(timeout=60)
        stage.settings = settings.model_copy(update={"live_check_interval_s": 0.001})  # refreshes an hour away
        # the consistency check inside the cycle (as after two background checks without a
        # verdict), so the cycle fails on the table renamed away after collecting the refreshes
        real_check = stage._check_some
        stage._check_some = lambda live, groups, now, background=False: real_check(live, groups, now)
        store.query("RENAME TABLE {db}.conf_stats TO {db}.conf_stats_away")
        time.sleep(0.05)
        with pytest.raises(Exception):
            stage.rescore()
        store.query("RENAME TABLE {db}.conf_stats_away TO {db}.conf_stats")
        stage.settings = settings
        stage._check_some = real_check
        stage.rescore()
        assert g in stage.drift and "success_rate" in stage.drift[g]
        trials = sorted(store.load_trials(agent="a"), key=lambda t: t.task_id)
        batch, _ = score_reviewed(trials, None, n_boot=N_BOOT, seed=0, max_k=settings.max_k)
        for w in ("24h", "7d", "all"):
            assert_same(batch, stage.window_scores[w][g])
    finally:
        stage.close()
        store.close()


def test_a_clock_stepped_back_does_not_stop_report_section_refreshes(chdb_path):
    """Report sections made while the wall clock read an hour ahead: a changed group's are
    remade by the next cycle (their age is unknown), not an hour plus a minute later."""
    store = Store(f"chdb://{chdb_path}", database="r" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(29)

    def batch(lo, hi):
        return [dataclasses.replace(make_trial(rng, i, task=f"t{i % 10}", end_ns=int((now_s - 60 - i % 50) * 1e9),
                                               agent="a"), trace_id=f"{4000 + i:032x}", trial_id=f"r{i}")
                for i in range(lo, hi)]

    store.insert_trials(batch(0, 40))
    stage = ScoreStage(Settings(n_boot=0, store=f"chdb://{chdb_path}"), store, None)
    g = ("a", "1.0", "production")
    try:
        stage.rescore(all_groups=True)
        ahead = time.time() + 3600
        stage._reviewed_at[g] = ahead  # as stamped by the clock before its step back
        store.insert_trials(batch(40, 44))
        stage.rescore()
        assert stage._reviewed_at[g] < ahead
    finally:
        stage.close()
        store.close()


def test_a_ci_older_than_its_value_is_marked_stale_in_scores_report_and_gauges(chdb_path):
    """Between CI refreshes a live window publishes new values with the last refresh's
    intervals. 100 successes in 10 tasks give success_rate 1 with CI [1, 1]; 2 failures more (2 %
    changed: no refresh) make it 100/102, outside that interval. The score must say so (metric
    ``ci_stale``, ``ci_as_of`` = the refresh, ``ci_trials`` = 100), the report marks it with a note
    naming success_rate, the age gauge is > 0; after a refresh none of it remains."""
    from relyscope.cli.render import render_report
    from relyscope.exporter.report import build_report

    store = Store(f"chdb://{chdb_path}", database="s" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(5)

    def batch(lo, hi, outcome):
        return [dataclasses.replace(make_trial(rng, i, task=f"t{i % 10}", end_ns=int((now_s - 60 - i % 50) * 1e9),
                                               agent="a"),
                                    trace_id=f"{9000 + i:032x}", trial_id=f"s{i}", outcome=outcome,
                                    status="complete", perturbation_family=None, tool_errors=0)
                for i in range(lo, hi)]

    store.insert_trials(batch(0, 100, "success"))
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=0.001, score_ci_background=False,
                        store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    g, key = ("a", "1.0", "production"), (("a", "1.0", "production"), "all")
    try:
        stage.rescore(all_groups=True)
        gs = stage.window_scores["all"][g]
        assert gs.metrics["success_rate"].value == 1.0 and gs.metrics["success_rate"].ci == (1.0, 1.0)
        assert gs.ci_as_of is None and not gs.metrics["success_rate"].ci_stale
        at = stage._ci_at[key]
        time.sleep(0.01)
        store.insert_trials(batch(100, 102, "failure"))
        stage.rescore()
        gs = stage.window_scores["all"][g]
        mv = gs.metrics["success_rate"]
        assert mv.value == pytest.approx(100 / 102) and mv.ci == (1.0, 1.0) and mv.ci_stale
        assert gs.ci_as_of == at and gs.ci_trials == 100 and gs.trials == 102
        assert gs.to_json()["metrics"]["success_rate"]["ci_stale"] is True
        assert gs.to_json()["bootstrap"]["ci_trials"] == 100
        rep = build_report({g: gs}, window="all")
        grp = rep["groups"][0]
        assert grp["metrics"]["success_rate"]["ci_stale"] is True and grp["ci_trials"] == 100
        notes = [n for n in grp.get("notes", []) if n.startswith("CIs marked *")]
        assert len(notes) == 1 and "over 100 trials (now 102)" in notes[0]
        assert "outside theirs now: success_rate" in notes[0]
        import io

        from rich.console import Console
        buf = io.StringIO()
        render_report(rep, Console(file=buf, width=200))
        assert "[1.000, 1.000]*" in buf.getvalue()

        class _P:  # the attributes the collector reads
            scores = stage.scores
            scoring = stage

            def report_extras(self, scores):
                return {}

        from prometheus_client import Histogram

        from relyscope.exporter.prom import _ReliabilityCollector

        fam = next(f for f in _ReliabilityCollector(_P(), Histogram("h", "h", registry=None),
                                                     Histogram("c", "c", registry=None)).collect()
                   if f.name == "relyscope_score_ci_age_seconds")  # yielded before the self metrics
        ages = [s.value for s in fam.samples if s.labels["window"] == "all" and s.labels["agent"] == "a"]
        assert len(ages) == 1 and ages[0] > 0
        time.sleep(0.01)
        store.insert_trials(batch(102, 110, "failure"))  # 10 of 100 since the refresh
        stage.rescore()
        gs = stage.window_scores["all"][g]
        assert stage._ci_at[key] > at and gs.ci_as_of is None and gs.ci_trials is None
        assert not any(m.ci_stale for m in gs.metrics.values())
        assert not [n for n in build_report({g: gs}, window="all")["groups"][0].get("notes", [])
                    if n.startswith("CIs marked *")]
    finally:
        stage.close()
        store.close()


def test_drift_of_a_group_that_is_gone_is_not_published_any_more(chdb_path):
    """A group whose every trial was re-keyed to another version (late spans re-finalizing the
    runs) leaves the rollups: its scores disappear, and so must its drift — a drift flag kept
    for a gone group would keep its alert firing for ever."""
    store = Store(f"chdb://{chdb_path}", database="g" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(3)

    def batch(version, ver_ns):
        out = []
        for i in range(120):
            age = 60 + (i % 40) * 60 if i < 60 else 2 * 3600 + (i % 40) * 300  # last hour, then the 24 h before
            t = make_trial(rng, i, task=f"t{i % 12}", end_ns=int((now_s - age) * 1e9), agent="a", version=version)
            out.append(dataclasses.replace(t, trace_id=f"{5000 + i:032x}", trial_id=f"g{i}", outcome="success" if i % 3 else "failure",
                                           status="complete", perturbation_family=None))
        return out

    store.insert_trials(batch("1.0", None))
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=0.001, score_ci_background=False,
                        store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    old, new = ("a", "1.0", "production"), ("a", "2.0", "production")
    try:
        stage.rescore(all_groups=True)
        assert old in stage.drift and old in stage.window_scores["1h"]
        time.sleep(0.01)
        # re-keyed as the trajectory builder does it: the new rows, and a tombstone per old key
        store.insert_trials(batch("2.0", None) + [dataclasses.replace(t, status="superseded") for t in batch("1.0", None)])
        stage.rescore()
        assert old not in stage.window_scores["1h"] and new in stage.window_scores["1h"]
        assert old not in stage.drift
        stage.rescore()
        assert old not in stage.drift
    finally:
        stage.close()
        store.close()


def test_background_refreshes_start_only_once_the_cycle_that_queued_them_ended(chdb_path):
    """A refresh queued by a cycle runs in the gap before the next one: started mid-cycle, it
    took the core and the GIL from the rest of that cycle (2 cores). The cycle is made slow after
    the submissions (its last phases sleep 0.5 s); every job must start after it returned."""
    store = Store(f"chdb://{chdb_path}", database="w" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(12)
    base = [dataclasses.replace(make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9), agent="a"),
                                status="complete", perturbation_family=None, outcome="success" if i % 3 else "failure")
            for i in range(60)]
    store.insert_trials(base)
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=3600, store=f"chdb://{chdb_path}")
    stage = ScoreStage(settings, store, None)
    starts: list[float] = []  # when each window refresh began its bootstrap on the CI thread
    import threading

    import relyscope.scoring.stage as stage_mod

    real_stats = stage_mod.score_stats

    def spy_score_stats(*a, **kw):
        if threading.current_thread().name.startswith("relyscope-ci"):
            starts.append(time.monotonic())
        return real_stats(*a, **kw)

    try:
        stage.rescore(all_groups=True)
        store.insert_trials([dataclasses.replace(base[0], trial_id=f"w{i}", trace_id=f"{9300 + i:032x}",
                                                 outcome="failure", end_ns=int((now_s - 5) * 1e9)) for i in range(6)])
        stage.settings = settings.model_copy(update={"score_ci_interval_s": 0.0})
        real_check = stage._check_some

        def slow_check(*a, **kw):  # after every submission of the cycle
            time.sleep(0.5)
            return real_check(*a, **kw)

        stage._check_some = slow_check
        stage_mod.score_stats = spy_score_stats
        stage.rescore()
        ended = time.monotonic()
        jobs = list(stage._ci_jobs.values())
        assert len(jobs) >= 2
        for fut, _, _ in jobs:
            fut.result(timeout=60)
        assert starts and min(starts) >= ended, (min(starts) - ended if starts else None)
    finally:
        stage_mod.score_stats = real_stats
        stage.close()
        store.close()


def test_a_background_refresh_waits_out_a_cycle_between_bootstrap_chunks(chdb_path, monkeypatch):
    """The CI thread's bootstrap hands the core back to a scoring cycle: before each chunk of
    replicates it waits while a cycle is under way (``_between_cycles`` cleared), and the time
    it waited is not counted as its work. One replicate per chunk here (``_CHUNK_ELEMS`` = 1), so
    a refresh at B = N_BOOT pauses N_BOOT times; its CI equals the one computed without pauses."""
    import threading

    from relyscope.scorers import bootstrap as B

    store = Store(f"chdb://{chdb_path}", database="y" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(5)
    store.insert_trials([dataclasses.replace(make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9),
                                                        agent="a"), status="complete", perturbation_family=None)
                         for i in range(40)])
    stage = ScoreStage(Settings(n_boot=N_BOOT, store=f"chdb://{chdb_path}"), store, None)
    try:
        stage.rescore(all_groups=True)
        g = ("a", "1.0", "production")
        want = stage.window_scores["all"][g].metrics["success_rate"].ci
        monkeypatch.setattr(B, "_CHUNK_ELEMS", 1)
        stage._between_cycles.clear()  # a cycle is under way
        done: list = []
        job = threading.Thread(target=lambda: done.append(stage._ci_window_job(g, None, 0, None, False)))
        started = time.perf_counter()
        waits: list[float] = []
        real = stage._paused
        first, go = threading.Event(), threading.Event()

        def counting():
            pause = real()

            def p():
                waits.append(time.perf_counter())
                if len(waits) == 1:  # hold the first chunk until the test has started a cycle
                    first.set()
                    go.wait(10)
                pause()
            return p
        monkeypatch.setattr(stage, "_paused", counting)
        stage._between_cycles.set()  # the job's first wait passes ...
        job.start()
        assert first.wait(10)
        stage._between_cycles.clear()  # ... then a cycle starts: the job stops at this chunk
        go.set()
        time.sleep(0.5)
        assert job.is_alive() and len(waits) == 1
        stage._between_cycles.set()
        job.join(10)
        assert not job.is_alive()
        gs, _, _, took = done[0]
        assert len(waits) == N_BOOT
        assert gs.metrics["success_rate"].ci == want
        assert took < time.perf_counter() - started - 0.4  # the ≥ 0.5 s of waiting is not work
    finally:
        stage.close()
        store.close()


def _checked_every_cycle(chdb_path: str, prefix: str, seed: int):
    """A store of 60 trials of agent "a" over 6 tasks (a third failures) and a stage that checks
    every window every cycle (``live_check_interval_s`` 1 ms, background on): store, stage, the
    trials, the clock they were made at."""
    store = Store(f"chdb://{chdb_path}", database=prefix + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(seed)
    base = [dataclasses.replace(make_trial(rng, i, task=f"t{i % 6}", end_ns=int((now_s - 30 - i) * 1e9), agent="a"),
                                status="complete", outcome="success" if i % 3 else "failure") for i in range(60)]
    store.insert_trials(base)
    settings = Settings(n_boot=N_BOOT, score_ci_interval_s=3600, live_check_interval_s=0.001,
                        store=f"chdb://{chdb_path}")
    return store, ScoreStage(settings, store, None), base, now_s


def test_background_consistency_checks_repair_a_difference_next_cycle_and_give_no_verdict_across_a_sync(chdb_path):
    """RELYSCOPE_SCORE_CI_BACKGROUND: a due consistency check compares a copy of the window's
    memory with ClickHouse on the CI thread. A lost update in memory is found there and the next
    cycle checks the window again and reloads it (one mismatch counted; memory == rollups after);
    a check whose read would come after another sync gives no verdict, and after two of those the
    window is checked inside the cycle."""
    import threading

    store, stage, base, now_s = _checked_every_cycle(chdb_path, "k", 31)
    n = [0]

    def more():  # one new trial per cycle: every group changes, every window is due a check
        n[0] += 1
        store.insert_trials([dataclasses.replace(base[0], trial_id=f"k{n[0]}", trace_id=f"{9700 + n[0]:032x}",
                                                 end_ns=int((now_s - 5) * 1e9))])

    g = ("a", "1.0", "production")
    try:
        stage.rescore(all_groups=True)
        live = stage.live()
        more()
        stage.rescore()
        jobs = dict(stage._check_jobs)
        assert {(g, w) for w, _ in WINDOWS} <= set(jobs)  # none checked inside the cycle
        assert all(f.result(timeout=60) is True for f, _ in jobs.values())

        live.window(g, "all").ints[0, 0] += 1  # a lost update
        more()
        stage.rescore()
        assert stage._check_jobs[(g, "all")][0].result(timeout=60) is False
        assert live.mismatches == 0  # found on the check thread; repaired by the cycle
        more()
        stage.rescore()
        assert live.mismatches == 1
        assert same_stats(live.stats(g, "all"), stage.rollup().window_stats(g, 0, None), pooled=True)
        for f, _ in stage._check_jobs.values():
            f.result(timeout=60)

        for skips in (1, 2):
            gate = threading.Event()
            stage._check_pool.submit(gate.wait, 60)  # holds the check thread until the sync below
            more()
            stage.rescore()
            fut = stage._check_jobs[(g, "all")][0]
            more()
            stage.rollup().sync()  # between the copy of the memory and the read
            gate.set()
            assert fut.result(timeout=60) is None
            more()
            stage.rescore()
            if skips == 1:
                assert stage._check_skips[(g, "all")] == 1 and (g, "all") in stage._check_jobs
                stage._check_jobs.pop((g, "all"))[0].result(timeout=60)
        assert (g, "all") not in stage._check_jobs and (g, "all") not in stage._check_skips  # in the cycle
        assert live.mismatches == 1
        assert same_stats(live.stats(g, "all"), stage.rollup().window_stats(g, 0, None), pooled=True)

        stage.close()  # a cycle after close checks inside the cycle (no pool takes work any more)
        more()
        stage.rescore()
        assert not stage._check_jobs
    finally:
        stage.close()
        store.close()


def test_a_difference_found_in_the_background_stays_due_when_its_recheck_fails(chdb_path):
    """The cycle after a background check found a difference re-checks the window; if that read
    fails (ClickHouse table away) the re-check stays due — the next cycle repairs it — instead of
    the window counting as checked until its next periodic check an interval later."""
    store, stage, base, now_s = _checked_every_cycle(chdb_path, "f", 37)
    g = ("a", "1.0", "production")
    try:
        stage.rescore(all_groups=True)
        live = stage.live()
        live.window(g, "all").ints[0, 0] += 1  # a lost update
        store.insert_trials([dataclasses.replace(base[0], trial_id="f1", trace_id=f"{9800:032x}",
                                                 end_ns=int((now_s - 5) * 1e9))])
        stage.rescore()
        assert stage._check_jobs[(g, "all")][0].result(timeout=60) is False
        store.query("RENAME TABLE {db}.conf_stats TO {db}.conf_stats_away")
        with pytest.raises(Exception):
            stage.rescore()  # nothing new to sync: the re-check's read is what fails
        store.query("RENAME TABLE {db}.conf_stats_away TO {db}.conf_stats")
        assert (g, "all") in stage._recheck and live.mismatches == 0
        stage.rescore()
        assert live.mismatches == 1 and not stage._recheck
        assert same_stats(live.stats(g, "all"), stage.rollup().window_stats(g, 0, None), pooled=True)
    finally:
        stage.close()
        store.close()


def test_cycles_slide_their_windows_from_the_buckets_read_after_the_last_cycle(chdb_path, monkeypatch):
    """RELYSCOPE_SCORE_CI_BACKGROUND: after a cycle, the check thread reads the buckets the
    windows will leave by the next one (its clock guessed one cycle step ahead); the next cycle
    slides them from that read instead of reading them itself. The windows then equal the rollups
    at their starts (every window, every cycle), and a sync that comes between a read and the
    cycle (here a direct one) makes that cycle read for itself."""
    import relyscope.scoring.stage as stage_mod

    store = Store(f"chdb://{chdb_path}", database="s" + uuid.uuid4().hex[:10])
    now_s = time.time()
    rng = random.Random(41)
    g = ("a", "1.0", "production")
    base = [dataclasses.replace(make_trial(rng, i, task=f"t{i % 4}", end_ns=int((now_s - 5 - 10 * i) * 1e9), agent="a"),
                                status="complete", outcome="success" if i % 3 else "failure") for i in range(48)]
    store.insert_trials(base)
    clock = OffsetClock()
    monkeypatch.setattr(stage_mod, "time", clock)
    stage = ScoreStage(Settings(n_boot=N_BOOT, score_ci_interval_s=3600, live_check_interval_s=3600,
                                store=f"chdb://{chdb_path}"), store, None)
    n = [0]

    def cycle() -> None:
        clock.offset += 70  # every cycle crosses a minute: the 5m and 1h windows slide each time
        n[0] += 1
        store.insert_trials([dataclasses.replace(base[0], trial_id=f"s{n[0]}", trace_id=f"{9900 + n[0]:032x}",
                                                 end_ns=int((clock.time() - 2) * 1e9))])
        stage.rescore()
        live, ru = stage.live(), stage.rollup()
        for name, length in WINDOWS:
            ws = live.window(g, name)
            assert ws.since == window_start(clock.time(), length) or abs(clock.time() % 60) < 2, name
            assert same_stats(live.stats(g, name), ru.window_stats(g, ws.since, length), pooled=ws.pooled), (n[0], name)
        if stage._slide_job is not None:
            stage._slide_job[0].result(timeout=60)  # the read ahead, done before the next cycle

    try:
        stage.rescore(all_groups=True)
        cycle()  # the first step is guessed from the score interval (10 s): no slide planned yet
        assert stage.slides_read_ahead == 0
        cycle()  # the next ones from the last step (70 s)
        cycle()
        made = stage.slides_read_ahead
        cycle()
        assert stage.slides_read_ahead > made >= 2  # the 5m and 1h windows, each cycle
        made = stage.slides_read_ahead
        assert stage._slide_job is not None
        stage.rollup().sync()  # a sync between the read and the next cycle
        stage._rows += stage.rollup().rows
        stage.rollup().rows = []
        cycle()
        assert stage.slides_read_ahead == made  # slid by reads of its own
        cycle()
        assert stage.slides_read_ahead > made
        assert stage.live().mismatches == 0
    finally:
        stage.close()
        store.close()
