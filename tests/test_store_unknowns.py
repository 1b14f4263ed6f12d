"""Store changes of issue 11: unknown token counts round-trip as None (a table made before they
could be unknown is widened in place), and span inserts are split so that no block touches more
partitions than ClickHouse's ``max_partitions_per_insert_block`` (D18)."""

from __future__ import annotations

import subprocess
import sys

from relyscope.model import Trial
from relyscope.store.clickhouse import MAX_PARTITIONS_PER_INSERT, Store, _by_partition

OLD_TRIALS = """CREATE TABLE relyscope.trials (
    trial_id String, trace_id String, root_span_id String, task_id String, task_id_source LowCardinality(String),
    agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
    status LowCardinality(String), outcome LowCardinality(String), outcome_source Nullable(String),
    outcome_score Nullable(Float64), claimed_success Nullable(Bool), confidence Nullable(Float64),
    conversation_id Nullable(String), start_time DateTime64(9), end_time DateTime64(9), wall_time_s Float64,
    input_tokens UInt64, output_tokens UInt64, total_tokens UInt64, cost_usd Nullable(Float64),
    model_calls UInt32, tool_calls UInt32, tool_errors UInt32, actions Array(String), steps String,
    flags Array(String), shadow_of Nullable(String), perturbation_family Nullable(String),
    perturbation_strength Nullable(String), revision UInt32, span_count UInt32,
    evaluations String DEFAULT '[]', version_ns UInt64
) ENGINE = ReplacingMergeTree(version_ns) ORDER BY (agent, version, run_kind, trial_id)"""

MAKE_OLD = r"""
import sys, clickhouse_connect
c = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
c.command("CREATE DATABASE IF NOT EXISTS relyscope")
c.command(sys.argv[2])
"""


def _trial(tid: str, tokens) -> Trial:
    return Trial(trial_id=tid, trace_id="t" * 32, root_span_id="r" * 16, task_id="task", task_id_source="attribute",
                 agent_name="a", agent_version="1", run_kind="production", outcome="success",
                 outcome_source="attribute", outcome_score=None, claimed_success=None, confidence=None,
                 conversation_id=None, start_ns=1, end_ns=2, steps=(),
                 input_tokens=tokens[0], output_tokens=tokens[1], total_tokens=tokens[2])


def test_unknown_tokens_round_trip_as_none_after_widening_an_old_table(tmp_path):
    data = tmp_path / "data"
    # a table as the previous release made it (token columns UInt64, no NULL)
    r = subprocess.run([sys.executable, "-c", MAKE_OLD, str(data), OLD_TRIALS], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    st = Store(f"chdb://{data}")
    try:
        types = dict(st.query("SELECT name, type FROM system.columns WHERE database = 'relyscope' "
                              "AND table = 'trials' AND name LIKE '%tokens'"))
        assert types == {"input_tokens": "Nullable(UInt64)", "output_tokens": "Nullable(UInt64)",
                         "total_tokens": "Nullable(UInt64)"}
        st.insert_trials([_trial("known", (100, 20, 120)), _trial("unknown", (None, None, None)),
                          _trial("zero", (0, 0, 0))])
        got = {t.trial_id: (t.input_tokens, t.output_tokens, t.total_tokens) for t in st.load_trials()}
        assert got == {"known": (100, 20, 120), "unknown": (None, None, None), "zero": (0, 0, 0)}
    finally:
        st.close()


def test_inserts_are_split_by_partition():
    day = 86_400 * 10**9
    rows = [[d * day + i] for d in range(250) for i in range(2)]  # 250 days, 2 rows each
    blocks = _by_partition(rows, lambda r: r[0] // day, 50)
    assert [len({r[0] // day for r in b}) for b in blocks] == [50] * 5
    assert sorted(r[0] for b in blocks for r in b) == sorted(r[0] for r in rows)  # nothing lost or doubled
    few = [[5], [3 * day], [5]]
    assert _by_partition(few, lambda r: r[0] // day) == [few]  # fits: one block, order kept
    assert _by_partition([], lambda r: 0) == []
    assert MAX_PARTITIONS_PER_INSERT == 100  # ClickHouse's default max_partitions_per_insert_block


def test_lookups_by_thousands_of_ids_fit_in_a_query(tmp_path):
    """Bug (bench/bench_memory.py): the rollup's lookup of posted outcomes by ~12 000 trial ids
    exceeded ClickHouse's default max_query_size (256 KiB) and scoring failed on every cycle."""
    from relyscope.store import Store

    st = Store(f"chdb://{tmp_path}/data")
    try:
        ids = [f"{i:032x}:{i:016x}" for i in range(12_000)]  # ~600 KB of ids in the query text
        assert st.load_trials(trial_ids=ids) == []
    finally:
        st.close()
