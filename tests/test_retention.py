"""Retention (relyscope.store.schema): TTLs per table, by when relyscope stored each row, applied
on create and reconciled on an existing store; rows past them really expire in chDB while the
rollups, and so the live scores of every window, stay as they were.

Expected TTL seconds are days × 86 400 worked out by hand in the literals below."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from pydantic import ValidationError

from live_traffic import make_trial
from relyscope.config import Settings
from relyscope.model import CanonicalSpan
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.review import score_reviewed
from relyscope.scoring.rollup import Rollup, window_start
from relyscope.scoring.stats import score_stats
from relyscope.store import Store
from relyscope.store.schema import Retention, apply_retention, current_ttl, ttl_clauses
from test_scoring_stats import assert_same

DAY_NS = 86_400 * 10**9
WINDOWS = (300, 3600, 86400, 7 * 86400, None)
GROUP = ("support", "1.0", "production")


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("retention") / "data")


def _db() -> str:
    return "ret" + uuid.uuid4().hex[:10]


def _show(store: Store, table: str) -> str:
    return store.query(f"SHOW CREATE TABLE {{db}}.{table}")[0][0]


def test_ttls_on_create_follow_the_settings(chdb_path):
    """A new store gets one TTL per table, each counted from the column that records when relyscope
    stored the row; contrib and scoring_state (needed to retract and to resume) never expire."""
    ret = Retention(spans_days=3, trials_days=10, scores_days=50, rollup_minute_days=2, rollup_hour_days=60,
                    traj_sample_days=20)
    st = Store(f"chdb://{chdb_path}", database=_db(), retention=ret)
    Rollup(st, None, minute_ttl_days=2, hour_ttl_days=60, traj_ttl_days=20).sync()
    want = {
        "otel_traces": "TTL toDateTime(IngestedAt) + toIntervalSecond(259200)",          # 3 d
        "trials": "TTL toDateTime(intDiv(version_ns, 1000000000)) + toIntervalSecond(864000)",  # 10 d
        "grades": "TTL toDateTime(intDiv(version_ns, 1000000000)) + toIntervalSecond(864000)",
        "outcomes": "TTL toDateTime(posted_at) + toIntervalSecond(864000)",
        "judgements": "TTL toDateTime(judged_at) + toIntervalSecond(864000)",
        "shadow_samples": "TTL toDateTime(decided_at) + toIntervalSecond(864000)",
        "shadow_replays": "TTL toDateTime(intDiv(version_ns, 1000000000)) + toIntervalSecond(864000)",
        "scores": "TTL toDateTime(computed_at) + toIntervalSecond(4320000)",              # 50 d
        "gate_verdicts": "TTL toDateTime(evaluated_at) + toIntervalSecond(4320000)",      # as scores
        "task_stats": "TTL bucket + toIntervalSecond(172800) WHERE level = 1, bucket + toIntervalSecond(5184000) "
                      "WHERE level = 2",                                                     # 2 d, 60 d
        "conf_stats": "TTL bucket + toIntervalSecond(172800) WHERE level = 1, bucket + toIntervalSecond(5184000) "
                      "WHERE level = 2",
        "traj_sample": "TTL toDateTime(intDiv(version_ns, 1000000000)) + toIntervalSecond(1728000)",  # 20 d
    }
    for table, clause in want.items():
        assert clause in _show(st, table), table
        q = st.query("SELECT create_table_query FROM system.tables WHERE database = %(d)s AND name = %(t)s",
                     {"d": st.db, "t": table})[0][0]
        assert clause in q, table
    for table in ("contrib", "scoring_state"):
        assert " TTL " not in _show(st, table), table


def test_an_existing_store_is_altered_when_the_settings_change_and_only_then(chdb_path):
    db = _db()
    old = Store(f"chdb://{chdb_path}", database=db)  # no retention: tables made without TTLs
    assert current_ttl(old._client, db, "trials") is None
    st = Store(f"chdb://{chdb_path}", database=db, retention=Retention())
    assert "toIntervalSecond(1209600)" in _show(st, "otel_traces")  # default 14 d
    assert " TTL " not in _show(st, "trials")  # only once rolled up (test below)
    assert st.apply_retention() and "toIntervalSecond(7776000)" in _show(st, "trials")  # default 90 d
    client = st._client
    # same settings again: nothing to alter (a MODIFY TTL rewrites every part on a server)
    assert apply_retention(client, db, ttl_clauses(Retention())) == []
    # one setting changed: exactly that table is altered
    ran = apply_retention(client, db, {"otel_traces": ttl_clauses(Retention(spans_days=1))["otel_traces"]})
    assert ran == [f"ALTER TABLE {db}.otel_traces MODIFY TTL toDateTime(IngestedAt) + toIntervalSecond(86400)"]
    assert "toIntervalSecond(86400)" in _show(st, "otel_traces")
    # scores kept for ever: the TTL is removed
    ran = apply_retention(client, db, {"scores": ttl_clauses(Retention(scores_days=None))["scores"]})
    assert ran == [f"ALTER TABLE {db}.scores REMOVE TTL"] and " TTL " not in _show(st, "scores")
    # a reconnect with the settings reconciles through the Store itself
    st2 = Store(f"chdb://{chdb_path}", database=db, retention=Retention(spans_days=2, trials_days=5))
    assert "toIntervalSecond(172800)" in _show(st2, "otel_traces")
    assert st2.apply_retention() == [f"ALTER TABLE {db}.{t} MODIFY TTL {e} + toIntervalSecond(432000)" for t, e in (
        ("trials", "toDateTime(intDiv(version_ns, 1000000000))"), ("outcomes", "toDateTime(posted_at)"),
        ("judgements", "toDateTime(judged_at)"), ("grades", "toDateTime(intDiv(version_ns, 1000000000))"),
        ("shadow_samples", "toDateTime(decided_at)"),
        ("shadow_replays", "toDateTime(intDiv(version_ns, 1000000000))"))]
    assert "toIntervalSecond(432000)" in _show(st2, "trials")
    assert "toIntervalSecond(34560000)" in _show(st2, "scores")  # 400 d again


def test_settings_refuse_an_order_where_rows_outlive_what_is_made_of_them():
    Settings(spans_ttl_days=7, trials_ttl_days=30)
    with pytest.raises(ValidationError, match="spans must not outlive trials"):
        Settings(spans_ttl_days=40, trials_ttl_days=30)
    with pytest.raises(ValidationError, match="must not outlive the scores and hour rollups"):
        Settings(trials_ttl_days=500)  # hour rollups 400 d
    with pytest.raises(ValidationError, match="must not outlive the scores and hour rollups"):
        Settings(trials_ttl_days=60, scores_ttl_days=30)
    Settings(scores_ttl_days=None)  # scores kept for ever
    r = Retention.from_settings(Settings(spans_ttl_days=1, trials_ttl_days=2, scores_ttl_days=3))
    assert (r.spans_days, r.trials_days, r.scores_days, r.rollup_hour_days) == (1, 2, 3, 400)


def _span(i: int) -> CanonicalSpan:
    now = time.time_ns()
    return CanonicalSpan(trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id="", name="run", kind=1,
                         start_ns=now - 10**9, end_ns=now)


def _age(store: Store, staging: Store, table: str, col: str, expr: str) -> None:
    """Copy ``table`` from ``staging`` into ``store`` with its storage-time column set back by
    ``expr`` (rows as if stored days ago; the TTL is by storage time)."""
    store._client.command(f"INSERT INTO {store.db}.{table} SELECT * REPLACE ({expr} AS {col}) "
                          f"FROM {staging.db}.{table}")


def test_rows_past_their_ttl_expire_while_rollups_and_window_scores_stay(chdb_path):
    """Spans stored 2 days ago, trials and outcomes stored 5 days ago (TTLs 1 d and 3 d) are
    deleted by a merge; recent rows are kept; score rows 10 days old survive (400 d). The rollups
    do not change, so every window's live score still equals the batch score of all the trials,
    computed before the expiry; a later sync finds nothing to retract."""
    db, staging_db = _db(), _db()
    stage = Store(f"chdb://{chdb_path}", database=staging_db)  # no TTL: a place to make rows
    st = Store(f"chdb://{chdb_path}", database=db)
    rng = random.Random(7)
    now = time.time()
    # runs that ended over the last 6 days (windows) and within the last hour, 12 tasks
    old = [make_trial(rng, i, task=f"t{rng.randint(0, 11)}", end_ns=int((now - rng.uniform(0, 5 * 86400)) * 1e9))
           for i in range(120)]
    new = [make_trial(rng, i, task=f"t{rng.randint(0, 11)}", end_ns=int((now - rng.uniform(0, 3000)) * 1e9))
           for i in range(120, 200)]
    stage.insert_trials(old)
    stage.insert_outcome(old[0].trial_id, "trial", "success", None, "api")
    stage.insert_spans([_span(i) for i in range(5)])
    _age(st, stage, "trials", "version_ns", f"version_ns - {5 * DAY_NS}")
    _age(st, stage, "outcomes", "posted_at", "posted_at - INTERVAL 5 DAY")
    _age(st, stage, "otel_traces", "IngestedAt", "IngestedAt - INTERVAL 2 DAY")
    st.insert_trials(new)
    st.insert_spans([_span(i) for i in range(5, 8)])
    st.insert_scores([{"formula_set": "f", "agent": "a", "version": "v", "run_kind": "production", "metric": "R",
                       "value": 0.5, "ci_low": None, "ci_high": None, "n_tasks": 1, "n_trials": 1,
                       "window_start": now - 20 * 86400, "window_end": now - 10 * 86400, "n_boot": 0,
                       "params": "{}", "computed_at": now - 10 * 86400, "inputs": "x"}])
    rollup = Rollup(st, None)
    assert rollup.sync() == {GROUP}
    batch = {}
    for w in WINDOWS:
        since = window_start(now, w)
        trials = st.load_trials(since_ns=since * 10**9)
        trials = sorted(apply_outcomes(trials, st.outcomes()), key=lambda t: t.task_id)
        batch[w] = score_reviewed(trials, None, n_boot=50, seed=0, max_k=3)[0]
        assert batch[w].trials == len(trials) > 0
    assert batch[None].trials == 200

    st = Store(f"chdb://{chdb_path}", database=db, retention=Retention(spans_days=1, trials_days=3))
    rollup = Rollup(st, None)  # a restart with the retention set
    assert rollup.sync() == set()  # nothing new; the TTLs of trials & co. are applied after it
    for table in ("trials", "outcomes", "otel_traces", "scores", "task_stats", "conf_stats", "contrib"):
        st.query(f"OPTIMIZE TABLE {{db}}.{table} FINAL")
    assert st.count_trials() == 80 and {t.trial_id for t in st.load_trials()} == {t.trial_id for t in new}
    assert st.outcomes() == {}
    assert sorted(k[1] for k in st.span_keys()) == [f"{i:016x}" for i in range(5, 8)]
    assert st.query("SELECT count() FROM {db}.scores")[0][0] == 1
    assert st.query("SELECT count() FROM {db}.contrib FINAL WHERE alive")[0][0] == 200

    assert rollup.sync() == set()  # the deletions are not changes: nothing retracted
    for w in WINDOWS:
        inc = score_stats(rollup.window_stats(GROUP, window_start(now, w), w), n_boot=50, seed=0, max_k=3,
                          safety_measured=False)
        try:
            assert_same(batch[w], inc)
        except AssertionError as e:
            raise AssertionError(f"window {w}: {e}") from e


def test_a_store_older_than_its_rollups_keeps_its_trials_until_they_are_rolled_up(chdb_path):
    """A store whose trials were stored days ago and never rolled up (made before the rollups, or
    with RELYSCOPE_INCREMENTAL_SCORING=false) gets retention: its trials must reach the rollups
    before they may expire. Failed before the fix: the TTL was set when the store opened, and the
    merge deleted the 120 old trials before the first sync, so all-time counted 80."""
    db, staging_db = _db(), _db()
    stage = Store(f"chdb://{chdb_path}", database=staging_db)
    st = Store(f"chdb://{chdb_path}", database=db)
    rng = random.Random(11)
    now = time.time()
    stage.insert_trials([make_trial(rng, i, task=f"t{i % 7}", end_ns=int((now - 6 * 86400 + i) * 1e9))
                         for i in range(120)])
    _age(st, stage, "trials", "version_ns", f"version_ns - {5 * DAY_NS}")
    st.insert_trials([make_trial(rng, i, task=f"t{i % 7}", end_ns=int((now - 60 + i / 10) * 1e9))
                      for i in range(120, 200)])
    st = Store(f"chdb://{chdb_path}", database=db, retention=Retention(spans_days=1, trials_days=3))
    st.query("OPTIMIZE TABLE {db}.trials FINAL")  # a merge before the first scoring cycle
    assert st.count_trials() == 200
    rollup = Rollup(st, None)
    rollup.sync()
    assert rollup.group_sizes() == {GROUP: 200}
    st.query("OPTIMIZE TABLE {db}.trials FINAL")
    assert st.count_trials() == 80 and rollup.group_sizes() == {GROUP: 200}


def test_the_sidecar_applies_its_retention_settings_at_start(tmp_path):
    """RELYSCOPE_*_TTL_DAYS reach the store of a real `relyscope serve`; a wrong order refuses to
    start, naming the settings."""
    import subprocess

    from relyscope.testing import RELYSCOPE_BIN, start_sidecar

    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_SPANS_TTL_DAYS": "1", "RELYSCOPE_TRIALS_TTL_DAYS": "2",
                                            "RELYSCOPE_ROLLUP_HOUR_TTL_DAYS": "3"})
    try:
        sc.flush()  # the first scoring cycle creates the rollups
    finally:
        assert sc.kill() == 0
        for f in (sc.proc.stdout, sc.proc.stderr):
            if f:
                f.close()
    st = Store(f"chdb://{tmp_path}/data")  # no retention: reads the TTLs as they are
    try:
        assert "TTL toDateTime(IngestedAt) + toIntervalSecond(86400)" in _show(st, "otel_traces")
        assert "toIntervalSecond(172800)" in _show(st, "trials") and "toIntervalSecond(172800)" in _show(st, "grades")
        assert "bucket + toIntervalSecond(259200) WHERE level = 2" in _show(st, "task_stats")
    finally:
        st.close()
    r = subprocess.run([str(RELYSCOPE_BIN), "serve"], capture_output=True, text=True, timeout=120,
                       env={**sc.env, "RELYSCOPE_SPANS_TTL_DAYS": "5", "RELYSCOPE_TRIALS_TTL_DAYS": "2"})
    assert r.returncode == 2 and "spans must not outlive trials" in r.stderr.replace("\n", " ")


_TTL_FIELDS = ("spans_ttl_days", "trials_ttl_days", "scores_ttl_days", "rollup_minute_ttl_days",
               "rollup_hour_ttl_days", "traj_sample_ttl_days")


def test_chdb_datetime_plus_interval_wraps_past_2106_and_20000_days_does_not():
    """The bound's reason, on the real engine: 30 000 d from now wraps (UInt32 seconds end
    2106-02-07), 20 000 d (the largest retention accepted) stays in the future."""
    import chdb

    wrapped = chdb.query("SELECT toYear(toDateTime(now()) + toIntervalSecond(86400 * 30000))", "CSV").data()
    assert int(wrapped) < 2026
    ok = chdb.query("SELECT toDateTime(now()) + toIntervalSecond(86400 * 20000) > now()", "CSV").data()
    assert ok.strip() == "1"


def test_a_retention_that_would_overflow_clickhouse_datetime_is_refused(monkeypatch):
    """RELYSCOPE_*_TTL_DAYS=36500 (100 years) used to be accepted and expired every row at once."""
    with pytest.raises(ValidationError) as e:
        Settings(**{f: 36500 for f in _TTL_FIELDS})
    msg = str(e.value)
    for f in ("spans_ttl_days", "trials_ttl_days", "rollup_hour_ttl_days", "traj_sample_ttl_days"):
        assert f"RELYSCOPE_{f.upper()}=36500" in msg and "use a smaller value" in msg
    assert "RELYSCOPE_SCORES_TTL_DAYS=36500" in msg and "use null" in msg  # scores: None = for ever
    Settings(spans_ttl_days=20000, trials_ttl_days=20000, scores_ttl_days=None, rollup_hour_ttl_days=20000,
             rollup_minute_ttl_days=20000, traj_sample_ttl_days=20000)  # the bound itself is fine
    with pytest.raises(ValueError, match="20000"):
        Retention(rollup_hour_days=36500)
    with pytest.raises(ValueError, match="20000"):
        Rollup(None, None, hour_ttl_days=36500)
    for bad in ("inf", "nan", "1e300", "-inf"):
        for f in _TTL_FIELDS:
            monkeypatch.setenv(f"RELYSCOPE_{f.upper()}", bad)
            with pytest.raises(ValidationError) as e:
                Settings()
            assert f in str(e.value), (f, bad)
            monkeypatch.delenv(f"RELYSCOPE_{f.upper()}")


def test_relyscope_schema_reports_a_bad_retention_naming_the_variable_without_a_traceback():
    import os
    import subprocess
    import sys

    for var, bad in (("RELYSCOPE_SPANS_TTL_DAYS", "inf"), ("RELYSCOPE_ROLLUP_HOUR_TTL_DAYS", "1e300"),
                     ("RELYSCOPE_SCORES_TTL_DAYS", "nan")):
        r = subprocess.run([sys.executable, "-m", "relyscope.cli.main", "schema"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, var: bad})
        assert r.returncode == 2, (var, r.stderr)
        assert var in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "CREATE" not in r.stdout
