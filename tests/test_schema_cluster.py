"""The schema module (relyscope.store.schema) and ``relyscope schema``: one list of DDL for every
table and view of a store, and its cluster variant.

What runs where: the single-node DDL printed by the CLI is executed in chDB and must create exactly
the tables and views the Store and the Rollup create. The cluster variant cannot run here (chDB has
no clusters and no Keeper: its ReplicatedMergeTree needs ``{shard}`` macros and a ZooKeeper, and
``ON CLUSTER`` names a cluster it does not have): each statement is parsed by ClickHouse's own
parser (``formatQuery`` in chDB), and undoing the documented transformations must give back the
single-node statements exactly, so the cluster variant is the same schema."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest

from relyscope.scoring.rollup import Rollup
from relyscope.store import Store
from relyscope.store.schema import SHARD_KEYS, Retention, cluster_schema, statements


@pytest.fixture(scope="module")
def chdb(tmp_path_factory):
    return f"chdb://{tmp_path_factory.mktemp('schema') / 'data'}"


def _objects(store: Store, db: str) -> dict[str, str]:
    return dict(store.query("SELECT name, engine FROM system.tables WHERE database = %(d)s", {"d": db}))


def _cli(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "relyscope.cli.main", "schema", *args], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return [s.strip() for s in out.split(";\n") if s.strip()]


def test_printed_ddl_runs_in_chdb_and_creates_every_table_and_view(chdb):
    ref = Store(chdb, database="ref" + uuid.uuid4().hex[:8], retention=Retention())
    Rollup(ref, None).sync()  # the TTLs of trials & co. come with the first sync
    want = _objects(ref, ref.db)
    assert {"otel_traces", "trials", "outcomes", "scores", "judgements", "grades", "shadow_samples",
            "shadow_replays", "contrib_log", "task_stats", "task_stats_mv", "conf_stats", "conf_stats_mv",
            "traj_sample", "traj_sample_mv", "contrib", "contrib_mv", "scoring_state"} <= set(want)
    db = "cli" + uuid.uuid4().hex[:8]
    ddl = _cli("--database", db)
    for stmt in ddl:
        ref._client.command(stmt)
    assert _objects(ref, db) == want
    # the TTLs in the printed CREATEs are those the Store and the Rollup set
    for table in ("otel_traces", "trials", "scores", "task_stats", "traj_sample"):
        ttl = [re.search(r"\sTTL\s(.*?)(?:\sSETTINGS\s.*)?$", ref.query(
            "SELECT create_table_query FROM system.tables WHERE database = %(d)s AND name = %(t)s",
            {"d": d, "t": table})[0][0]).group(1) for d in (ref.db, db)]
        assert ttl[0] == ttl[1], table


def _undo(stmt: str) -> str:
    """The cluster transformations, undone (what the docstring of cluster_schema says they are)."""
    stmt = stmt.replace(" ON CLUSTER 'c1'", "")
    stmt = re.sub(r"Replicated(\w*)MergeTree\('/clickhouse/tables/[^']*', '\{replica\}'(?:, )?", r"\1MergeTree(", stmt)
    return stmt.replace("MergeTree()", "MergeTree")


def test_cluster_variant_is_the_same_schema_replicated_and_distributed(chdb):
    st = Store(chdb, database="cl" + uuid.uuid4().hex[:8])
    fmt = lambda s: st.query("SELECT formatQuery(%(q)s)", {"q": s.replace("{db}", "relyscope")})[0][0]  # noqa: E731
    single = statements(Retention())
    ddl = cluster_schema("c1", Retention())
    for stmt in ddl:  # ClickHouse's parser accepts every statement
        assert fmt(stmt), stmt
        assert "ON CLUSTER 'c1'" in stmt, stmt
        assert not re.search(r"ENGINE = (Summing|Replacing)?MergeTree", stmt), stmt
    dist = [s for s in ddl if "ENGINE = Distributed" in s]
    rest = [s for s in ddl if "ENGINE = Distributed" not in s]
    assert [fmt(_undo(s)) for s in rest] == [fmt(s) for s in single]
    # a Distributed table beside every stored table but the deployment-wide watermarks, and for
    # contrib_log (inserts go through it so −old/+new of a change meet on one shard)
    stored = {m.group(1) for s in single if (m := re.match(r"\s*CREATE TABLE IF NOT EXISTS \{db\}\.(\w+)", s))
              and "MergeTree" in s}
    named = {re.match(r"CREATE TABLE IF NOT EXISTS \{db\}\.(\w+)_dist ", s).group(1) for s in dist}
    assert named == (stored - {"scoring_state"}) | {"contrib_log"}
    state = next(s for s in ddl if "{db}.scoring_state ON CLUSTER" in s)
    assert "'/clickhouse/tables/all/{database}/scoring_state', '{replica}'" in state
    # each sharding key is a valid expression over its table's columns (run on the local tables)
    Rollup(st, None)
    for s in dist:
        m = re.search(r"\{db\}\.(\w+)_dist .*Distributed\('c1', currentDatabase\(\), (\w+), (.+)\)$", s)
        assert m and m.group(1) == m.group(2) and m.group(3) == SHARD_KEYS.get(m.group(1), "rand()"), s
        st.query(f"SELECT {m.group(3)} FROM {{db}}.{m.group(1)} LIMIT 0")
    # the rows ReplacingMergeTree replaces share a shard: the key's columns are in the sorting key
    # (otel_traces: TraceId; trials: trace_id, of which a trial id is a function)
    for table in ("otel_traces", "grades", "judgements", "shadow_samples", "shadow_replays", "contrib", "scores"):
        key = st.query("SELECT sorting_key FROM system.tables WHERE database = %(d)s AND name = %(t)s",
                       {"d": st.db, "t": table})[0][0]
        cols = re.findall(r"\b(\w+)\b", SHARD_KEYS[table].replace("cityHash64", ""))
        assert set(cols) <= {c.strip() for c in key.split(",")}, (table, key)
    # the CLI prints the same statements
    assert _cli("--cluster", "c1", "--database", "relyscope") == [s.replace("{db}", "relyscope").strip() for s in ddl]


def test_cluster_name_must_be_an_identifier():
    with pytest.raises(ValueError):
        cluster_schema("c1'; DROP TABLE x; --")
    r = subprocess.run([sys.executable, "-m", "relyscope.cli.main", "schema", "--cluster", "a b"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2


def _schema_rc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relyscope.cli.main", "schema", *args],
                          capture_output=True, text=True, timeout=120)


def test_database_and_zk_path_that_would_corrupt_the_ddl_are_refused():
    """They go into the DDL verbatim: ``x; drop`` used to print ``CREATE DATABASE IF NOT EXISTS
    x; drop;``, a quote in --zk-path broke the literal, a path without {table} put every table on
    one Keeper node, and ``--cluster ""`` silently printed the single-node DDL."""
    for args, hint in ((("--database", "x; drop"), "--database"), (("--database", "1x"), "--database"),
                       (("--database", "a-b"), "--database"),
                       (("--cluster", "c1", "--zk-path", "/a'b/{shard}/{table}"), "--zk-path"),
                       (("--cluster", "c1", "--zk-path", "/a\\b/{shard}/{table}"), "--zk-path"),
                       (("--cluster", "c1", "--zk-path", "/no/macros"), "--zk-path"),
                       (("--cluster", "c1", "--zk-path", "/t/{shard}"), "--zk-path"),
                       (("--cluster", "c1", "--zk-path", "/t/{table}"), "--zk-path"),
                       (("--cluster", ""), "--cluster"), (("--cluster", " "), "--cluster")):
        r = _schema_rc(*args)
        assert r.returncode == 2, (args, r.stdout[:200], r.stderr)
        assert hint in r.stderr and "CREATE" not in r.stdout, (args, r.stderr)
    with pytest.raises(ValueError, match="lacks"):
        cluster_schema("c1", zk_path="/no/macros")
    # a custom path with both macros is fine, and every replicated table gets its own path
    ddl = _cli("--cluster", "c1", "--database", "db_1", "--zk-path", "/ch/{shard}/x/{table}")
    paths = [m.group(1) for s in ddl for m in [re.search(r"MergeTree\('([^']*)'", s)] if m]
    assert len(paths) == len(set(paths)) > 5
    assert "/ch/{shard}/x/trials" in paths and "/ch/all/x/scoring_state" in paths
    assert ddl[0] == "CREATE DATABASE IF NOT EXISTS db_1 ON CLUSTER 'c1'"
