"""Incremental scores from the ClickHouse rollups (relyscope.scoring.rollup) equal the batch
score of the same trials — every metric, value, interval and count, for every window — including
after late outcomes, late spans that re-finalize a trial (new end time, actions, outcome), a trial
re-keyed with a tombstone, and a restart of the scorer (a new Rollup on the same store)."""

from __future__ import annotations

import dataclasses
import re
import random
import time
import uuid

import pytest

from live_traffic import make_trial
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.policy import load_policy
from relyscope.scorers.review import policy_for, score_reviewed
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.scoring.stats import score_stats
from relyscope.store import Store
from test_scoring_stats import assert_same

POLICY = load_policy(__import__("pathlib").Path(__import__("relyscope").__file__).parent / "scorers/example_policy.yaml")
WINDOWS = (300, 3600, 86400, 7 * 86400, None)
N_BOOT = 100
NOW = time.time()
GROUPS = (("support", "1.0", "production"), ("support", "2.0", "production"), ("other", "1.0", "canary"))


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("rollup") / "data")


@pytest.fixture()
def store(chdb_path):
    st = Store(f"chdb://{chdb_path}", database="r" + uuid.uuid4().hex[:10])
    yield st


def traffic(seed: int, n: int, start: int = 0) -> list:
    """Trials over the last ~9 days, denser recently, in three groups and 25 tasks."""
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        age = rng.choice((rng.uniform(0, 240), rng.uniform(0, 3000), rng.uniform(0, 80000), rng.uniform(0, 8e5)))
        g = rng.choice(GROUPS)
        out.append(make_trial(rng, i, task=f"t{rng.randint(0, 24):02d}", end_ns=int((NOW - age) * 1e9),
                              agent=g[0], version=g[1], run_kind=g[2]))
    return out


def check_all_windows(store: Store, rollup: Rollup) -> None:
    for g in GROUPS:
        for w in WINDOWS:
            since = window_start(NOW, w)
            trials = store.load_trials(agent=g[0], version=g[1], run_kind=g[2], since_ns=since * 10**9)
            trials = sorted(apply_outcomes(trials, store.outcomes()), key=lambda t: t.task_id)
            batch, _ = score_reviewed(trials, POLICY, n_boot=N_BOOT, seed=0, max_k=5)
            inc = score_stats(rollup.window_stats(g, since, w), n_boot=N_BOOT, seed=0, max_k=5,
                              safety_measured=policy_for(POLICY, g[0]) is not None)
            assert batch.trials == len(trials)
            try:
                assert_same(batch, inc)
            except AssertionError as e:
                raise AssertionError(f"group {g} window {w}: {e}") from e


def test_incremental_equals_batch_through_late_changes_and_restart(store):
    trials = traffic(1, 600)
    store.insert_trials(trials[:400])
    rollup = Rollup(store, POLICY, traj_sample=1000)
    assert rollup.sync() == set(GROUPS)
    store.insert_trials(trials[400:])  # a second batch arrives
    rollup.sync()
    check_all_windows(store, rollup)

    # late outcomes: by trial id and by trace id, overriding span outcomes and unknowns (§6 item 2)
    rng = random.Random(5)
    for t in rng.sample(trials, 60):
        if rng.random() < 0.5:
            store.insert_outcome(t.trial_id, "trial", rng.choice(("success", "failure")), None, "feedback")
        else:
            store.insert_outcome(t.trace_id, "trace", rng.choice(("success", "failure")), None, "feedback")
    changed = rollup.sync()
    assert changed  # the groups of those trials
    check_all_windows(store, rollup)

    # late spans re-finalize trials: new revision, later end (another bucket/window), other
    # actions and outcome, sometimes another task
    refinal = []
    for t in rng.sample(trials, 40):
        refinal.append(dataclasses.replace(
            t, revision=2, end_ns=int((NOW - rng.uniform(0, 200)) * 1e9), outcome=rng.choice(("success", "failure")),
            steps=t.steps[:1] + t.steps, task_id=t.task_id if rng.random() < 0.7 else "t99"))
    store.insert_trials(refinal)
    # a provisional trial re-keyed when its real root arrived: tombstone + new id, same trace
    old = trials[7]
    store.insert_trials([dataclasses.replace(old, status="superseded"),
                         dataclasses.replace(old, trial_id=old.trial_id + "-r", revision=2)])
    rollup.sync()
    check_all_windows(store, rollup)

    # restart: a new scorer on the same store continues from the stored watermarks
    restarted = Rollup(store, POLICY, traj_sample=1000)
    assert restarted.sync() == set()  # nothing new: nothing re-folded
    store.insert_trials(traffic(2, 150, start=10_000))
    store.insert_outcome(trials[3].trial_id, "trial", "failure", None, "feedback")
    restarted.sync()
    check_all_windows(store, restarted)

    # a rebuild from the history gives the same statistics
    assert restarted.rebuild() == set(GROUPS)
    check_all_windows(store, restarted)


def test_trajectory_sample_is_most_recent_m(store):
    """With M = 2, C_traj of a task uses its two most recent successful runs only."""
    rng = random.Random(3)
    base = make_trial(rng, 0, task="x", end_ns=int(NOW * 1e9))
    base = dataclasses.replace(base, status="complete", perturbation_family=None, outcome="success")
    runs = [dataclasses.replace(base, trial_id=f"m{i}", trace_id=f"{i + 900:032x}",
                                end_ns=base.end_ns - (10 - i) * 10**9,
                                steps=base.steps[:1] * (i + 1)) for i in range(5)]
    store.insert_trials(runs)
    rollup = Rollup(store, None, traj_sample=2)
    rollup.sync()
    g = (base.agent_name, base.agent_version, base.run_kind)
    st = rollup.window_stats(g, 0, None)
    assert st.trajectories == [[runs[4].actions, runs[3].actions]]
    inc = score_stats(st, safety_measured=False, n_boot=0)
    # two runs of one action, lengths 5 and 4: JSD of identical distributions = 0 → C_traj_d = 1;
    # Levenshtein 1 over max length 5 → C_traj_s = 0.8
    assert inc.metrics["C_traj_d"].value == pytest.approx(1.0)
    assert inc.metrics["C_traj_s"].value == pytest.approx(0.8)


def test_retention_drops_old_minute_buckets_and_keeps_all_time(store):
    """Minute buckets expire after RELYSCOPE_ROLLUP_MINUTE_TTL_DAYS (here 2 days); the all-time
    level keeps every trial; a TTL shorter than the minute-level windows is refused."""
    old = [dataclasses.replace(t, end_ns=int((NOW - 5 * 86400) * 1e9), start_ns=int((NOW - 5 * 86400 - 1) * 1e9))
           for t in traffic(9, 30)]
    new = traffic(10, 20, start=500)
    store.insert_trials(old + new)
    rollup = Rollup(store, None, minute_ttl_days=2)
    rollup.sync()
    q = "SELECT level, sum(n_all) FROM {db}.task_stats GROUP BY level ORDER BY level"
    store.query("OPTIMIZE TABLE {db}.task_stats FINAL")
    levels = dict(store.query(q))
    recent_minute = sum(1 for t in new if t.end_ns >= (NOW - 2 * 86400) * 1e9)
    assert levels[1] == recent_minute and levels[3] == 50
    assert levels[2] == 50  # hour buckets are kept 400 days
    with pytest.raises(ValueError):
        Rollup(store, None, minute_ttl_days=0.5)


def test_cluster_ddl_variant_parses_and_is_replicated(store):
    """The cluster variant (not run against a cluster: chDB has none) parses in ClickHouse's own
    parser (formatQuery), runs every statement ON CLUSTER, keeps no non-replicated MergeTree, and
    has a Distributed table per stored rollup table; inserts shard by trial id."""
    from relyscope.scoring.rollup import ROLLUP_TABLES, cluster_schema

    ddl = cluster_schema("relyscope_cluster")
    for stmt in ddl:
        sql = stmt.replace("{db}", "relyscope")
        assert store.query("SELECT formatQuery(%(q)s)", {"q": sql})[0][0], sql
        assert "ON CLUSTER 'relyscope_cluster'" in stmt
        assert not re.search(r"ENGINE = (Summing|Replacing)?MergeTree", stmt), stmt
    dist = {re.search(r"\{db\}\.(\w+)_dist ", s).group(1) for s in ddl if "ENGINE = Distributed" in s}
    assert dist == (set(ROLLUP_TABLES) - {"scoring_state"}) | {"contrib_log"}
    ins = next(s for s in ddl if "contrib_log_dist" in s)
    assert ins.endswith("cityHash64(trial_id))")
    state = next(s for s in ddl if "{db}.scoring_state ON CLUSTER" in s)
    assert "/clickhouse/tables/all/" in state


def test_undecided_trials_are_kept_only_for_a_judge(store):
    """Complete trials left ``unknown`` are queued for an LLM judge only when one is configured:
    without a judge nothing consumes the queue, and the scoring stage kept up to 10 000 whole
    trials in it (issue 10: RSS grew ~5 KiB per stored trial)."""
    rng = random.Random(7)
    trials = [dataclasses.replace(make_trial(rng, i, task="t00", end_ns=int((NOW - 60) * 1e9)),
                                  outcome="unknown", status="complete") for i in range(20)]
    store.insert_trials(trials)
    no_judge = Rollup(store, POLICY, traj_sample=1000)
    no_judge.sync()
    assert no_judge.undecided == []
    judged = Rollup(store, POLICY, judge=True, traj_sample=1000)
    judged.sync()
    assert sorted(t.trial_id for t in judged.undecided) == sorted(t.trial_id for t in trials)
