"""ClickHouse schema, writers and queries, through clickhouse-connect only.

DSNs: ``chdb:///abs/path`` (embedded chDB, the default; one process may hold a data directory),
``chdb://memory`` (in-memory, for ``relyscope score``), or ``http(s)://user:pass@host:8123/db``
(a ClickHouse server). The same SQL runs on both.

Tables (database ``relyscope`` unless the DSN names one):

- ``otel_traces`` — raw spans, columns as the OpenTelemetry Collector ClickHouse exporter's
  ``otel_traces`` (so Grafana's ClickHouse trace view works), plus ``RelyscopeFlags``. Engine
  ReplacingMergeTree ordered by (TraceId, SpanId): a re-sent span is stored once.
- ``trials`` — one row per trial (metrics.md §1), ReplacingMergeTree(version) on trial id, so a
  re-finalized trial replaces its earlier row.
- ``outcomes`` — outcomes posted later to the outcome API (metrics.md §6 item 2).
- ``scores`` — per-group metric values with formula set, window, CI and bootstrap size.
- ``grades`` — per-trial grader output (JSON), ReplacingMergeTree(version) on trial id.
- ``judgements`` — the optional LLM judge's evaluation per trial.

Reads use ``FINAL`` so replaced rows never count twice.

Retention: ``Store(..., retention=Retention(...))`` (the sidecar) gives ``otel_traces`` and
``scores`` their TTLs at each (re)connect (:mod:`relyscope.store.schema`; all DDL, and the
cluster variant, are listed there); the tables the rollups are made from
(:data:`ROLLED_UP_TABLES`) get theirs only from :meth:`Store.apply_retention`, which the rollups
call once they have folded every stored trial — a store that predates the rollups would otherwise
lose its old trials before they were ever rolled up. Without ``retention`` TTLs are left alone.

Errors (:mod:`relyscope.store.errors`): :class:`StoreUnavailable` is retryable (the store is down,
or refused a write for a reason that passes), :class:`StoreRejected` permanent (the rows can never
be stored). Span and trial inserts raise either; every other call raises StoreUnavailable only.

Chaos hook (``fault_file``, ``RELYSCOPE_FAULT_STORE_DOWN_FILE``): while the file exists and is
empty, every write fails and :meth:`Store.ping` answers False, as if the server were down (reads
still answer, so tests can look at the store). A file holding JSON fails inserts with a ClickHouse-shaped error of the given code, while
queries and the ping still answer, e.g. ``{"code": 241}`` (MEMORY_LIMIT_EXCEEDED: transient) or
``{"code": 53, "match": "poison"}`` (TYPE_MISMATCH: permanent, only for inserts whose rows contain
the string ``poison``); optional ``"tables": ["otel_traces"]`` limits it to those tables.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import operator
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Final, Iterable, Sequence
from urllib.parse import parse_qsl, urlparse

import clickhouse_connect
import orjson

from relyscope.model import CanonicalSpan, Evaluation, Op, SpanEvent, Step, Trial

from relyscope.store.errors import StoreError, StoreRejected, StoreUnavailable, classify, error_code
from relyscope.store import escaping as _escaping  # noqa: F401 - installs the fast escape_str
from relyscope.store.without_pandas import pyarrow as _pyarrow

if TYPE_CHECKING:
    from relyscope.store.schema import Retention

__all__ = ["Store", "SpanColumns", "span_columns", "StoreError", "StoreUnavailable", "StoreRejected", "open_store",
           "resolve_dsn", "chdb_path"]


log = logging.getLogger("relyscope.store")

_MAX_QUERY_BYTES = 256 << 20  # see Store._connect
#: Settings of the span and trial inserts. ``optimize_on_insert = 0``: ClickHouse does not run the
#: ReplacingMergeTree's replacing on each inserted block (a sort and merge of the block by the
#: sorting key, to drop the block's own duplicates); duplicates are dropped by the background
#: merges and every read that needs each key once is ``FINAL`` (or ``LIMIT 1 BY``), as for
#: duplicates sent in different inserts. It halved the wall time and cut the CPU of the span
#: insert 2-3x (bench/README.md, issue 13). Sent only where the server lets this user change it
#: (:meth:`Store._write_settings`).
_WRITE_SETTINGS: Final = {"optimize_on_insert": 0}
_WRITE_TABLES: Final = frozenset(("otel_traces", "trials"))
#: ClickHouse error codes of a refused setting: UNKNOWN_SETTING, READONLY, SETTING_CONSTRAINT_VIOLATION
_SETTING_REFUSALS: Final = frozenset((115, 164, 452))

_SPAN_KIND = {0: "Unspecified", 1: "Internal", 2: "Server", 3: "Client", 4: "Producer", 5: "Consumer"}
_STATUS = {0: "Unset", 1: "Ok", 2: "Error"}


def chdb_path(dsn: str) -> str | None:
    """The absolute data directory of an embedded ``chdb://`` DSN, relative paths read from the
    current directory (``chdb:///./x`` and ``chdb://./x`` → ``$PWD/x``); None for other DSNs.
    Creates nothing."""
    if dsn.startswith("chdb://") and not dsn.startswith("chdb://memory"):
        path = dsn[len("chdb://"):]
        if path.startswith("/./") or path.startswith("/../"):
            path = path[1:]
        return os.path.abspath(os.path.expanduser(path))
    return None


#: query parameters of a server DSN whose value may be a secret (clickhouse-connect takes query
#: parameters as connection arguments, ``?access_token=…`` among them): masked by :func:`display_dsn`
_SECRET_PARAM = re.compile(r"pass|secret|token|key|auth|cred", re.IGNORECASE)


def display_dsn(dsn: str) -> str:
    """A DSN fit for a log line or an API answer: a ``chdb://`` path made absolute (as
    :func:`chdb_path`; a relative one says nothing once the process has moved on); of a server DSN
    the user and password left out, the value of a secret query parameter masked and any fragment
    dropped (``http://user:pass@host:8123/db?password=x&secure=1`` →
    ``http://host:8123/db?password=***&secure=1``). Never raises."""
    path = chdb_path(dsn)
    if path is not None:
        return "chdb://" + path
    scheme, sep, rest = dsn.partition("://")
    if not sep:  # not a URL at all: nothing in it can be told apart from a secret
        return "<store DSN not shown: not scheme://…>"
    # everything up to the last "@": a password may itself hold "/", "?", "#" or "@" unescaped
    # (a path or query holding "@" loses its head here, which is the safe side)
    rest = rest.rsplit("@", 1)[-1].split("#", 1)[0]
    base, q, query = rest.partition("?")
    if q:
        pairs = []
        for pair in query.split("&"):
            k, eq, _v = pair.partition("=")
            pairs.append(f"{k}=***" if eq and _SECRET_PARAM.search(k) else pair)
        base = f"{base}?{'&'.join(pairs)}"
    return f"{scheme.lower()}{sep}{base}"


def check_dsn(dsn: str) -> str:
    """``dsn`` checked before anything opens it, the scheme lower-cased (``HTTP://`` →
    ``http://``): ``chdb://…`` (embedded) or ``http(s)://[user[:password]@]host[:port][/database]``.
    Raises ValueError saying what to change; the message shows the DSN only as
    :func:`display_dsn` does (never its user or password). A user or password holding ``/``, ``?``
    or ``#`` must be percent-encoded (``%2F``, ``%3F``, ``%23``; clickhouse-connect decodes them):
    unescaped, the URL's host would end inside the password, and the driver's own error would
    quote a piece of it."""
    scheme, sep, rest = dsn.partition("://")
    scheme = scheme.lower()
    shown = display_dsn(dsn)
    if not sep or scheme not in ("chdb", "http", "https"):
        raise ValueError(f"unrecognised store DSN {shown}: use chdb:///path (embedded), chdb://memory, "
                         "or http(s)://user:password@host:8123/database")
    dsn = f"{scheme}://{rest}"
    if scheme == "chdb":
        return dsn
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" not in authority and "@" in rest:
        raise ValueError(f"store DSN {shown}: the user or password holds '/', '?' or '#' unescaped, so the "
                         "host would be read from inside it; percent-encode them (/ → %2F, ? → %3F, # → %23)")
    parsed = urlparse(dsn)
    if any(k.lower() == "password" for k, _v in parse_qsl(parsed.query, keep_blank_values=True)):
        # clickhouse-connect passes it twice (HttpClient: "multiple values for argument 'password'")
        raise ValueError(f"store DSN {shown}: give the password as http(s)://user:password@host…, not "
                         "as ?password= (percent-encode what it holds of / ? # @ : %)")
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"store DSN {shown}: the port is not a number from 0 to 65535") from None
    if not parsed.hostname:
        raise ValueError(f"store DSN {shown}: no host (http(s)://user:password@host:8123/database)")
    return dsn


def resolve_dsn(dsn: str) -> str:
    """Make a ``chdb://`` path absolute (see :func:`chdb_path`) and create its directory. Raises
    ValueError when that directory cannot be made (a file is there, no permission, /proc)."""
    path = chdb_path(dsn)
    if path is not None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise ValueError(f"store DSN chdb://{path}: cannot use {path} as the embedded store's data "
                             f"directory ({e.strerror or e}): give a directory that exists or can be created") from None
        return "chdb://" + path
    return dsn


#: embedded data directories this process has opened (chDB keeps them open until exit)
_OPENED_HERE: set[str] = set()


def chdb_held_elsewhere(path: str) -> bool:
    """Whether another process holds the chDB data directory ``path``: ClickHouse keeps an
    exclusive ``flock`` on ``<path>/status`` while it runs. Probed without opening the engine
    (which prints its own "Cannot lock file" error to stderr before failing); False for a
    directory this process opened (a second ``flock`` here would conflict with its own) or that
    has no status file yet."""
    if path in _OPENED_HERE:
        return False
    try:
        fd = os.open(os.path.join(path, "status"), os.O_RDONLY)
    except OSError:
        return False
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except (OSError, ImportError):  # no flock here: let the engine decide
        return False
    finally:
        os.close(fd)


def _attr_str(v: Any) -> str:
    """An attribute value as its stored string: str as is, bools ``true``/``false``, ints and
    floats as ``str``/``repr``, bytes as hex, None as ``""``, anything else as JSON."""
    f = _ATTR_STR.get(v.__class__)  # the exact common types: one dict lookup, no isinstance chain
    if f is not None:
        return f(v)
    return _attr_str_any(v)


def _attr_str_any(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if isinstance(v, float) else str(v)
    if isinstance(v, bytes):
        return v.hex()
    if v is None:
        return ""
    return _json_text(v)


def _json_text(v: Any) -> str:
    """``json.dumps(v, default=_json_default, ensure_ascii=False)``, exactly: a non-empty list of
    strings needing no escape (printable, no quote or backslash: what that encoder leaves as is)
    joined directly; anything else through one module-level encoder (``json.dumps`` with options
    builds a ``JSONEncoder`` per call). Array attributes of strings (``gen_ai.response.
    finish_reasons`` on every model call) cost ~2 us each through ``json.dumps``."""
    if v.__class__ is list and v:
        try:
            whole = "".join(v)
        except TypeError:  # not all strings
            return _JSON.encode(v)
        if whole.isprintable() and '"' not in whole and "\\" not in whole:
            return '["' + '", "'.join(v) + '"]'
    return _JSON.encode(v)


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.hex()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, Op):
        return o.value
    return str(o)


_JSON = json.JSONEncoder(default=_json_default, ensure_ascii=False)
_ATTR_STR = {str: str.__str__, bool: lambda v: "true" if v else "false", int: int.__repr__,
             float: float.__repr__, bytes: bytes.hex, list: _json_text, dict: _json_text}


SCHEMA = [
    """CREATE TABLE IF NOT EXISTS {db}.otel_traces (
        Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
        TraceId String CODEC(ZSTD(1)),
        SpanId String CODEC(ZSTD(1)),
        ParentSpanId String CODEC(ZSTD(1)),
        TraceState String CODEC(ZSTD(1)),
        SpanName LowCardinality(String) CODEC(ZSTD(1)),
        SpanKind LowCardinality(String) CODEC(ZSTD(1)),
        ServiceName LowCardinality(String) CODEC(ZSTD(1)),
        ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
        ScopeName String CODEC(ZSTD(1)),
        ScopeVersion String CODEC(ZSTD(1)),
        SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
        Duration UInt64 CODEC(ZSTD(1)),
        StatusCode LowCardinality(String) CODEC(ZSTD(1)),
        StatusMessage String CODEC(ZSTD(1)),
        `Events.Timestamp` Array(DateTime64(9)) CODEC(ZSTD(1)),
        `Events.Name` Array(LowCardinality(String)) CODEC(ZSTD(1)),
        `Events.Attributes` Array(Map(LowCardinality(String), String)) CODEC(ZSTD(1)),
        `Links.TraceId` Array(String) CODEC(ZSTD(1)),
        `Links.SpanId` Array(String) CODEC(ZSTD(1)),
        RelyscopeFlags Array(LowCardinality(String)),
        RelyscopeRawEndNs Nullable(UInt64),
        IngestedAt DateTime64(3) DEFAULT now64(3)
    ) ENGINE = ReplacingMergeTree(IngestedAt)
    PARTITION BY toDate(Timestamp)
    ORDER BY (TraceId, SpanId)""",
    """CREATE TABLE IF NOT EXISTS {db}.trials (
        trial_id String, trace_id String, root_span_id String,
        task_id String, task_id_source LowCardinality(String),
        agent LowCardinality(String), version LowCardinality(String), run_kind LowCardinality(String),
        status LowCardinality(String), outcome LowCardinality(String),
        outcome_source Nullable(String), outcome_score Nullable(Float64),
        claimed_success Nullable(Bool), confidence Nullable(Float64), conversation_id Nullable(String),
        start_time DateTime64(9), end_time DateTime64(9), wall_time_s Float64,
        input_tokens Nullable(UInt64), output_tokens Nullable(UInt64), total_tokens Nullable(UInt64),
        cost_usd Nullable(Float64),
        model_calls UInt32, tool_calls UInt32, tool_errors UInt32,
        actions Array(String), steps String, flags Array(String),
        shadow_of Nullable(String), perturbation_family Nullable(String),
        perturbation_strength Nullable(String), revision UInt32, span_count UInt32,
        evaluations String DEFAULT '[]', version_ns UInt64, task_input Nullable(String)
    ) ENGINE = ReplacingMergeTree(version_ns)
    ORDER BY (agent, version, run_kind, trial_id)""",
    # tables made before token counts could be unknown (None, not 0): widen in place (idempotent)
    "ALTER TABLE {db}.trials MODIFY COLUMN input_tokens Nullable(UInt64)",
    "ALTER TABLE {db}.trials MODIFY COLUMN output_tokens Nullable(UInt64)",
    "ALTER TABLE {db}.trials MODIFY COLUMN total_tokens Nullable(UInt64)",
    """CREATE TABLE IF NOT EXISTS {db}.outcomes (
        key String, key_kind LowCardinality(String), outcome LowCardinality(String),
        score Nullable(Float64), source String, verifier Bool, posted_at DateTime64(9)
    ) ENGINE = MergeTree ORDER BY (key_kind, key, posted_at)""",
    """CREATE TABLE IF NOT EXISTS {db}.scores (
        formula_set LowCardinality(String), agent LowCardinality(String),
        version LowCardinality(String), run_kind LowCardinality(String),
        metric LowCardinality(String), value Nullable(Float64),
        ci_low Nullable(Float64), ci_high Nullable(Float64), n_tasks UInt32, n_trials UInt32,
        window_start DateTime64(3), window_end DateTime64(3), n_boot UInt32, params String,
        computed_at DateTime64(3), inputs String DEFAULT ''
    ) ENGINE = ReplacingMergeTree(computed_at)
    ORDER BY (formula_set, agent, version, run_kind, metric, window_start, window_end, inputs)""",
    """CREATE TABLE IF NOT EXISTS {db}.judgements (
        trial_id String, name LowCardinality(String), score Nullable(Float64), label Nullable(String),
        explanation Nullable(String), model String, judged_at DateTime64(3)
    ) ENGINE = ReplacingMergeTree(judged_at) ORDER BY trial_id""",
    """CREATE TABLE IF NOT EXISTS {db}.grades (
        trial_id String, agent LowCardinality(String), version LowCardinality(String),
        run_kind LowCardinality(String), grade String, severity Float64, attribution LowCardinality(String),
        valid Bool, formula_set LowCardinality(String), version_ns UInt64
    ) ENGINE = ReplacingMergeTree(version_ns) ORDER BY (agent, version, run_kind, trial_id)""",
    # stores created before task_input existed
    "ALTER TABLE {db}.trials ADD COLUMN IF NOT EXISTS task_input Nullable(String)",
    # shadow replays (relyscope.store.shadow): one decision per production trial, one row per replay
    """CREATE TABLE IF NOT EXISTS {db}.shadow_samples (
        trial_id String, agent LowCardinality(String), version LowCardinality(String), task_id String,
        decision LowCardinality(String), reason String, decided_at DateTime64(3)
    ) ENGINE = ReplacingMergeTree(decided_at) ORDER BY trial_id""",
    """CREATE TABLE IF NOT EXISTS {db}.shadow_replays (
        replay_id String, experiment String, shadow_of String, task_id String,
        agent LowCardinality(String), prod_version LowCardinality(String),
        target_version LowCardinality(String), run_kind LowCardinality(String),
        family LowCardinality(String), strength Nullable(String), seed Int64, idx UInt32,
        input Nullable(String), status LowCardinality(String), trace_id String, error String,
        calls String, n_calls UInt32, n_exact UInt32, n_position UInt32, n_live UInt32,
        n_miss UInt32, n_faults UInt32, n_side_effects UInt32,
        scheduled_at DateTime64(3), finished_at Nullable(DateTime64(3)), version_ns UInt64
    ) ENGINE = ReplacingMergeTree(version_ns) ORDER BY replay_id""",
    # the latest published release-gate verdict of each comparison, per gate policy (reloaded at
    # start: relyscope_gate_verdict and the RelyscopeCandidateBlocked alert survive a restart)
    """CREATE TABLE IF NOT EXISTS {db}.gate_verdicts (
        agent String, baseline String, candidate String, mode LowCardinality(String),
        policy String, result String, evaluated_at DateTime64(9)
    ) ENGINE = ReplacingMergeTree(evaluated_at) ORDER BY (agent, baseline, candidate, mode, policy)""",
]

#: the tables of :data:`SCHEMA` (retention: relyscope.store.schema)
STORE_TABLES = ("otel_traces", "trials", "outcomes", "scores", "judgements", "grades", "shadow_samples",
                "shadow_replays", "gate_verdicts")
#: what the rollups are made from (trials, the outcomes and verdicts that resolve them, the replay
#: ledger that resolves replays; grades go with their trials): expired only once rolled up
ROLLED_UP_TABLES = ("trials", "outcomes", "judgements", "grades", "shadow_samples", "shadow_replays")


def _migrate(client, db: str) -> None:
    """Bring tables created by an older version to the current schema (idempotent).

    ``scores.inputs`` (a digest of the trials and outcomes a score was computed from) joined the
    sorting key so that a re-scoring of the same window with different inputs (a late verdict)
    adds a history point instead of replacing the earlier one."""
    have = client.query("SELECT name FROM system.columns WHERE database = %(db)s AND table = 'scores'",
                        parameters={"db": db}).result_rows
    if have and "inputs" not in {r[0] for r in have}:
        client.command(f"ALTER TABLE {db}.scores ADD COLUMN inputs String, MODIFY ORDER BY "
                       "(formula_set, agent, version, run_kind, metric, window_start, window_end, inputs)")


_SPAN_COLS = [
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind",
    "ServiceName", "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration",
    "StatusCode", "StatusMessage", "Events.Timestamp", "Events.Name", "Events.Attributes",
    "Links.TraceId", "Links.SpanId", "RelyscopeFlags", "RelyscopeRawEndNs",
]
_TRIAL_COLS = [
    "trial_id", "trace_id", "root_span_id", "task_id", "task_id_source", "agent", "version",
    "run_kind", "status", "outcome", "outcome_source", "outcome_score", "claimed_success",
    "confidence", "conversation_id", "start_time", "end_time", "wall_time_s", "input_tokens",
    "output_tokens", "total_tokens", "cost_usd", "model_calls", "tool_calls", "tool_errors",
    "actions", "steps", "flags", "shadow_of", "perturbation_family", "perturbation_strength",
    "revision", "span_count", "evaluations", "version_ns", "task_input",
]
#: what a trial read returns, in this order (``version_ns`` only orders and filters the rows)
_TRIAL_READ_COLS = tuple(c for c in _TRIAL_COLS if c != "version_ns")
#: the select list of a trial read: the times as integer ns under their own aliases (a Python
#: datetime keeps only µs; an alias named like its column would also shadow the column in WHERE)
_TRIAL_SELECT = ", ".join(
    f"toUnixTimestamp64Nano({c}) AS {c}_ns" if c in ("start_time", "end_time") else c
    for c in _TRIAL_READ_COLS)
#: the columns of the trials table's key (ORDER BY of its ReplacingMergeTree): every row of one key
#: agrees on them, so a filter on them may run before the latest row of each key is picked
_TRIAL_KEY_COLS = frozenset(("agent", "version", "run_kind", "trial_id"))
_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(Step))

_STEP_FIELD_SET = frozenset(_STEP_FIELDS)  # membership per key per step: a list made loading trials slow


def _evaluation_dict(e: Evaluation) -> dict:
    """``dataclasses.asdict(e)`` (same keys, same order) without its deep copy: ~40x cheaper,
    and it ran once per evaluation of every stored trial."""
    return {"name": e.name, "score": e.score, "label": e.label, "explanation": e.explanation}


_STEP_GET = operator.attrgetter(*_STEP_FIELDS)


def _step_to_dict(s: Step) -> dict:
    d = dict(zip(_STEP_FIELDS, _STEP_GET(s)))  # one C-level getter: ~2x the dict comprehension
    d["op"] = s.op.value
    d["flags"] = sorted(s.flags)
    return d


def _steps_json(steps: Sequence[Step]) -> str:
    """The ``trials.steps`` column: a JSON array of one object per step, its keys the
    :class:`Step` fields in order (``op`` its value, ``flags`` sorted), as ``json.dumps`` of
    :func:`_step_to_dict` gives, serialized by orjson (dataclasses natively: ~4x cheaper, it ran
    for every stored trial). The text is compact and UTF-8 (same JSON values); a non-finite float
    in a step's arguments/result is written ``null`` (valid JSON; ``json.dumps`` wrote the
    non-standard ``NaN``). Whatever orjson refuses (an int beyond 64 bits, a lone surrogate, a
    non-string key) goes through ``json.dumps`` as before."""
    try:
        return orjson.dumps(steps, default=_step_json_default).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps([_step_to_dict(s) for s in steps], default=_json_default, ensure_ascii=False)


def _step_json_default(o: Any) -> Any:
    # :func:`_json_default` with the one type every step has first (its flags): orjson calls it
    # once per step, and the isinstance chain made it 40 % of the steps' serialization
    if o.__class__ is frozenset:
        return sorted(o)
    return _json_default(o)


def _evaluations_json(evs: Sequence[Evaluation]) -> str:
    """The ``trials.evaluations`` column: a JSON array of ``{name, score, label, explanation}``
    (:func:`_evaluation_dict`), by orjson as :func:`_steps_json` (non-ASCII text as UTF-8, not
    ``\\u`` escapes; a non-finite score as ``null``); ``json.dumps`` for what orjson refuses."""
    if not evs:
        return "[]"
    try:
        return orjson.dumps(evs).decode()
    except TypeError:
        return json.dumps([_evaluation_dict(e) for e in evs], ensure_ascii=True)


_OPS: Final = {o.value: o for o in Op}


def _step_from_dict(d: dict) -> Step:
    """A :class:`Step` from one object of the ``trials.steps`` column (keys that are not Step
    fields ignored; ``op`` its value; ``flags`` a list). Raises ValueError for an unknown ``op``,
    TypeError for a missing required field. ``d`` is not changed."""
    op = d.get("op", "unknown")
    o = _OPS.get(op) if op.__class__ is str else None
    if o is None:
        o = Op(op)  # raises on a name it does not know
    f = d.get("flags")
    flags = frozenset(f) if f else _NO_FLAGS
    if tuple(d) == _STEP_FIELDS:  # what _steps_json writes: every field, in order — positional
        v = list(d.values())
        v[_I_OP] = o
        v[_I_FLAGS] = flags
        return Step(*v)
    kw = {k: v for k, v in d.items() if k in _STEP_FIELD_SET}
    kw["op"] = o
    kw["flags"] = flags
    return Step(**kw)


_I_OP: Final = _STEP_FIELDS.index("op")
_I_FLAGS: Final = _STEP_FIELDS.index("flags")
_NO_FLAGS: Final = frozenset()
#: how every ``trials.steps`` text written by ``orjson.dumps`` in :func:`_steps_json` begins (its
#: first key, compact); ``json.dumps`` — the fallback, and every version before orjson — writes
#: ``"span_id": `` with a space
_ORJSON_HEAD: Final = '[{"span_id":"'


def _steps_from_json(text: str) -> tuple[Step, ...]:
    """The ``trials.steps`` column back to steps (the inverse of :func:`_steps_json`).

    A text orjson wrote (:data:`_ORJSON_HEAD`) is parsed by orjson (~2.5x ``json.loads``; the
    scorer reads every new trial's steps); any other by ``json`` as before. orjson reads an integer
    beyond 64 bits as a float and refuses ``NaN``/``Infinity`` and lone surrogate escapes, but
    none of these can be in what it wrote: ``orjson.dumps`` refuses such ints and surrogates
    (:func:`_steps_json` then falls back to ``json.dumps``) and writes non-finite floats as
    ``null``. Same values either way for what the store writes; a compact text from another
    writer holding such an int would be read as a float. Raises ValueError (bad JSON, an unknown
    op) or TypeError (a step missing a required field)."""
    if text.startswith(_ORJSON_HEAD):
        try:
            items = orjson.loads(text)
        except orjson.JSONDecodeError:  # what orjson refuses (not its own output): json gives the old value or error
            items = json.loads(text)
    else:
        items = json.loads(text)
    return tuple([_step_from_dict(x) for x in items])


class Store:
    """ClickHouse access for relyscope. Thread-safe (one lock around the client).

    Raises :class:`StoreUnavailable` (retryable) when the server cannot be reached or a write fails,
    ValueError (at construction) on a DSN :func:`check_dsn` refuses.
    ``lazy=True`` (the sidecar): a ClickHouse *server* that is down at start is connected on first
    use instead of failing the start; an embedded (chDB) store always opens at once.
    """

    def __init__(self, dsn: str, *, database: str = "relyscope", fault_file: str | None = None,
                 lazy: bool = False, retention: "Retention | None" = None):
        self.dsn = resolve_dsn(check_dsn(dsn))  # ValueError on a DSN that cannot be opened as given
        #: :class:`relyscope.store.schema.Retention` applied to the store's tables at every
        #: (re)connect; None (one-off CLI reads): existing TTLs are left as they are
        self.retention = retention
        self.fault_file = fault_file
        self._lock = threading.RLock()
        self._stamps: dict[str, int] = {}  # table → the last version stamp written (stamp_ns)
        parsed = urlparse(self.dsn)
        if parsed.scheme in ("http", "https") and parsed.path.strip("/"):
            database = parsed.path.strip("/")
            self.dsn = parsed._replace(path="").geturl()
        self.db = database
        self.write_errors = 0
        self.last_write_s = 0.0
        self._client = None
        #: what the span / trial inserts send of _WRITE_SETTINGS (set at each connect)
        self._write_opts: dict[str, Any] = {}
        self._closed = False
        try:
            self._connect()
        except StoreUnavailable:
            # a ClickHouse server may be down when the sidecar starts: the spool absorbs the
            # outage and the store is reconnected on first use. An embedded store that cannot
            # open (directory in use, bad path) is a configuration error: fail fast.
            if self.embedded or not lazy:
                raise

    def _connect(self) -> None:
        """Open the client and create the schema (idempotent DDL). Raises StoreUnavailable."""
        path = chdb_path(self.dsn) if self.embedded else None
        in_use = (f"cannot open {display_dsn(self.dsn)}: the data directory is in use by another process (chDB lets "
                  "one process open a data directory; ask the running sidecar with --api instead)")
        if path is not None and chdb_held_elsewhere(path):
            raise StoreUnavailable(in_use)
        try:
            # lookups by id lists (rollup sync, replays, rehydration) bind thousands of ids into the
            # query text: ClickHouse's default max_query_size (256 KiB) refused them under load and
            # scoring stopped for good (found by bench/bench_memory.py)
            client = clickhouse_connect.get_client(dsn=self.dsn, settings={"max_query_size": _MAX_QUERY_BYTES})
            client.command(f"CREATE DATABASE IF NOT EXISTS {self.db}")
            for ddl in SCHEMA:
                client.command(ddl.format(db=self.db))
            _migrate(client, self.db)
            if self.retention is not None:
                self._apply_retention(client, [t for t in STORE_TABLES if t not in ROLLED_UP_TABLES])
        except Exception as e:  # noqa: BLE001 - any driver failure at start is "unavailable"
            msg = str(e)
            if self.embedded and ("Another server instance" in msg or "Cannot lock file" in msg):
                raise StoreUnavailable(in_use) from e
            held = re.search(r"already initialized with path '([^']*)'", msg) if self.embedded else None
            if held:  # this process, not another one, holds a different directory
                raise StoreUnavailable(
                    f"cannot open {display_dsn(self.dsn)}: this process already opened the chDB data directory {held[1]} "
                    "(chDB opens one data directory per process; use that one, or open this one in another "
                    "process)") from e
            raise StoreUnavailable(f"cannot open store {display_dsn(self.dsn)}: {e}") from e
        self._client = client
        self._write_opts = self._write_settings(client)
        if path is not None:
            _OPENED_HERE.add(path)

    @staticmethod
    def _write_settings(client) -> dict[str, Any]:
        """The part of :data:`_WRITE_SETTINGS` this client may send: settings the server lists
        for this user and does not mark readonly (clickhouse-connect would otherwise refuse the
        insert before sending it). A server that still refuses one (a settings-profile
        constraint) has it dropped at the first refusal (:meth:`_without_write_setting`)."""
        out = {}
        server = getattr(client, "server_settings", None) or {}
        for k, v in _WRITE_SETTINGS.items():
            d = server.get(k)
            if d is not None and not getattr(d, "readonly", False):
                out[k] = v
        return out

    def _opts(self, table: str, settings: dict | None) -> dict | None:
        """``settings`` plus the write settings for the span and trial tables (``settings``
        itself, the same object, when nothing is added)."""
        if table not in _WRITE_TABLES or not self._write_opts:
            return settings
        return {**self._write_opts, **(settings or {})}

    def _write_with_settings(self, table: str, settings: dict | None, write) -> None:
        """``write(opts)`` with ``settings`` plus the write settings of ``table`` (:meth:`_opts`);
        once more without the write setting the store refused, if it refused one
        (:meth:`_without_write_setting`). Any other error is raised. Called under ``_lock``."""
        opts = self._opts(table, settings)
        try:
            write(opts)
        except Exception as e:  # noqa: BLE001 - re-raised unless a write setting was refused
            if opts is settings or not self._without_write_setting(e):
                raise
            write(self._opts(table, settings))

    def _without_write_setting(self, e: Exception) -> bool:
        """True (and the setting no longer sent) when ``e`` is a refusal of one of the write
        settings (the caller then writes once more without it): the server's UNKNOWN_SETTING,
        READONLY or SETTING_CONSTRAINT_VIOLATION, or clickhouse-connect's own refusal of a readonly
        setting (a ProgrammingError), naming the setting. Any other error is not (an HTTP
        client's connection error names the setting too: it is in the request's URL)."""
        from clickhouse_connect.driver.exceptions import ProgrammingError

        if error_code(e) not in _SETTING_REFUSALS and not isinstance(e, ProgrammingError):
            return False
        msg = str(e)
        hit = [k for k in self._write_opts if k in msg]
        for k in hit:
            log.warning("the store refused the insert setting %s (%s); inserting without it", k,
                        msg.splitlines()[0][:200])
            del self._write_opts[k]
        return bool(hit)

    def _apply_retention(self, client, tables) -> list[str]:
        from relyscope.store.schema import apply_retention, ttl_clauses

        ttl = ttl_clauses(self.retention)
        return apply_retention(client, self.db, {t: ttl[t] for t in tables})

    def apply_retention(self, tables: Iterable[str] = ROLLED_UP_TABLES) -> list[str]:
        """Give ``tables`` the TTLs of ``self.retention`` (only those that differ are altered);
        returns the statements run; nothing without a retention. Call for
        :data:`ROLLED_UP_TABLES` only when the rollups hold every trial stored so far
        (:meth:`relyscope.scoring.rollup.Rollup.sync` does). Raises StoreUnavailable."""
        if self.retention is None:
            return []
        try:
            with self._lock:
                return self._apply_retention(self._ready_client(), list(tables))
        except StoreUnavailable:
            raise
        except Exception as e:  # noqa: BLE001
            raise StoreUnavailable(f"applying retention failed: {e}") from e

    def _ready_client(self):
        """The client, reconnecting a server store that was down. Call with the lock held."""
        if self._client is None:
            if self._closed:
                raise StoreUnavailable("store closed")
            self._connect()
        return self._client

    @property
    def embedded(self) -> bool:
        return self.dsn.startswith("chdb:")

    def close(self) -> None:
        """Close the client. Idempotent."""
        with self._lock:
            self._closed = True
            c, self._client = getattr(self, "_client", None), None
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass

    # ---- writes ---------------------------------------------------------------------------------
    def _fault(self, table: str, rows: list[list]) -> None:
        """The chaos hook (module docstring). Raises StoreUnavailable, or the driver's own
        ``DatabaseError`` with a ``Code: N.`` message, so classification runs as for a real one."""
        try:
            with open(self.fault_file, "rb") as f:
                raw = f.read()
        except OSError:
            return  # removed meanwhile
        if not raw.strip():
            raise StoreUnavailable(f"store down (fault injected by {self.fault_file})")
        try:
            spec = json.loads(raw)
            code = int(spec["code"])
        except (ValueError, KeyError, TypeError) as e:
            raise StoreUnavailable(f"bad fault file {self.fault_file}: {e}") from None
        if spec.get("tables") and table not in spec["tables"]:
            return
        if spec.get("match") and not any(spec["match"] in str(r) for r in rows):
            return
        from clickhouse_connect.driver.exceptions import DatabaseError

        from relyscope.store.errors import PERMANENT_CODES, TRANSIENT_CODES

        name = PERMANENT_CODES.get(code) or TRANSIENT_CODES.get(code) or "INJECTED"
        raise DatabaseError(f"Code: {code}. DB::Exception: fault injected by {self.fault_file}. ({name})")

    def _insert(self, table: str, rows: list[list], cols: list[str], *, permanent: bool = False,
                settings: dict | None = None) -> None:
        """Insert rows (``settings``: ClickHouse settings of this insert). Raises StoreUnavailable
        (retryable) or — with ``permanent=True`` only — StoreRejected when the rows can never be
        stored (without it a data error is reported as StoreUnavailable, as callers without a
        quarantine expect)."""
        if not rows:
            return
        t0 = time.perf_counter()
        try:
            if self.fault_file and os.path.exists(self.fault_file):
                self._fault(table, rows)
            with self._lock:
                client = self._ready_client()

                def write(opts: dict | None) -> None:
                    try:
                        client.insert(f"{self.db}.{table}", rows, column_names=cols, settings=opts)
                    except UnicodeEncodeError:
                        # a lone surrogate that slipped past decoding: a permanent error for this
                        # data, so repair (U+FFFD) and write once more rather than retry forever
                        client.insert(f"{self.db}.{table}", _scrub(rows), column_names=cols, settings=opts)

                self._write_with_settings(table, settings, write)
        except Exception as e:  # noqa: BLE001 - every driver failure is classified
            self.write_errors += 1
            err = classify(e, f"insert into {table}")
            if isinstance(err, StoreRejected) and not permanent:
                err = StoreUnavailable(str(err), err.code)
            if err is e:
                raise
            raise err from e
        finally:
            self.last_write_s = time.perf_counter() - t0

    def insert_spans(self, spans: Sequence[CanonicalSpan]) -> None:
        """Store raw spans in ``otel_traces``. Raises StoreUnavailable (retryable) or
        StoreRejected (these spans can never be stored)."""
        rows = []
        for s in spans:
            rows.append([
                s.start_ns, s.trace_id, s.span_id, s.parent_span_id, s.trace_state, s.name,
                _SPAN_KIND.get(s.kind, "Unspecified"), str(s.resource.get("service.name", "")),
                {k: _attr_str(v) for k, v in s.resource.items()}, s.scope_name, s.scope_version,
                {k: _attr_str(v) for k, v in s.attributes.items()}, s.duration_ns,
                _STATUS.get(s.status_code, "Unset"), s.status_message,
                [e.time_ns for e in s.events], [e.name for e in s.events],
                [{k: _attr_str(v) for k, v in e.attributes.items()} for e in s.events],
                [l[0] for l in s.links], [l[1] for l in s.links], sorted(s.flags),
                s.raw_end_ns if s.raw_end_ns is not None and s.raw_end_ns >= 0 else None,
            ])
        # UTC days; the server's toDate may use another time zone, where one UTC day touches up to
        # two dates: half the limit of UTC days per block stays within the limit of dates
        for chunk in _by_partition(rows, lambda r: r[0] // _NS_PER_DAY, MAX_PARTITIONS_PER_INSERT // 2):
            self._insert("otel_traces", chunk, _SPAN_COLS, permanent=True)

    def insert_span_columns(self, cols: "SpanColumns") -> None:
        """Store spans given as columns (:class:`SpanColumns`, what :func:`span_columns` and the
        hot-path decoder build): the same rows :meth:`insert_spans` writes for the same spans, sent
        as one Arrow block (``clickhouse_connect`` ``insert_arrow``: chDB and a server both read
        it) instead of one Python row per span. Raises StoreUnavailable or StoreRejected."""
        n = len(cols)
        if not n:
            return
        days = [t // _NS_PER_DAY for t in cols.ts]
        if len(set(days)) <= MAX_PARTITIONS_PER_INSERT // 2:
            self._insert_arrow("otel_traces", cols, None)
            return
        # as _by_partition: blocks in partition order, rows in their order within a partition
        parts: dict[int, list[int]] = {}
        for i, d in enumerate(days):
            parts.setdefault(d, []).append(i)
        keys = sorted(parts)
        step = MAX_PARTITIONS_PER_INSERT // 2
        for i in range(0, len(keys), step):
            self._insert_arrow("otel_traces", cols, [j for k in keys[i:i + step] for j in parts[k]])

    def _insert_arrow(self, table: str, cols: "SpanColumns", take: list[int] | None) -> None:
        """As :meth:`_insert` (permanent errors raised as StoreRejected, timing, chaos hook) for
        one Arrow block of ``cols`` (rows ``take`` only, when given)."""
        t0 = time.perf_counter()
        try:
            if self.fault_file and os.path.exists(self.fault_file):
                rows = cols.rows()
                self._fault(table, rows if take is None else [rows[i] for i in take])
            try:
                tbl = cols.arrow()
            except UnicodeEncodeError:  # a lone surrogate that slipped past decoding, as _insert
                tbl = cols.scrubbed().arrow()
            if take is not None:
                tbl = tbl.take(take)
            with self._lock:
                client = self._ready_client()
                self._write_with_settings(
                    table, None, lambda opts: client.insert_arrow(f"{self.db}.{table}", tbl, settings=opts))
        except Exception as e:  # noqa: BLE001 - every driver failure is classified
            self.write_errors += 1
            err = classify(e, f"insert into {table}")
            if err is e:
                raise
            raise err from e
        finally:
            self.last_write_s = time.perf_counter() - t0

    #: the version column of each table whose rows replace or outrank earlier ones by it
    _STAMPED = {"trials": ("version_ns", "%(now)s"), "outcomes": ("toUnixTimestamp64Nano(posted_at)",
                                                              "fromUnixTimestamp64Nano(%(now)s)"),
                "gate_verdicts": ("toUnixTimestamp64Nano(evaluated_at)", "fromUnixTimestamp64Nano(%(now)s)")}

    def stamp_ns(self, table: str, n: int = 1) -> int:
        """The first of ``n`` consecutive version stamps (Unix ns) for rows of ``table``
        (``trials`` ``version_ns``, ``outcomes`` ``posted_at``): the wall clock, but never at or
        below a stamp this store wrote before, nor below one stored ahead of the clock (read once
        per process: the rows stamped after now, a skip-index read). A wall clock stepped back
        used to give a re-finalized trial a lower version than the row it replaces (the store
        kept the old one) and a later outcome post an earlier stamp (the older post won).
        Raises StoreUnavailable."""
        with self._lock:
            now = time.time_ns()
            last = self._stamps.get(table)
            if last is None:
                col, arg = self._STAMPED[table]
                where = re.sub(r"toUnixTimestamp64Nano\((\w+)\)", r"\1", col)
                rows = self.query(f"SELECT max({col}) FROM {{db}}.{table} WHERE {where} > {arg}", {"now": now})
                last = int(rows[0][0] or 0) if rows else 0
            base = max(now, last + 1)
            self._stamps[table] = base + max(n, 1) - 1
            return base

    def insert_trials(self, trials: Iterable[Trial]) -> None:
        """Store (or replace) trials. Raises StoreUnavailable or StoreRejected."""
        trials = list(trials)
        now = self.stamp_ns("trials", len(trials))
        rows = []
        for i, t in enumerate(trials):
            rows.append([
                t.trial_id, t.trace_id, t.root_span_id, t.task_id, t.task_id_source, t.agent_name,
                t.agent_version, t.run_kind, t.status, t.outcome, t.outcome_source, t.outcome_score,
                t.claimed_success, t.confidence, t.conversation_id, t.start_ns, t.end_ns,
                t.wall_time_s, t.input_tokens, t.output_tokens, t.total_tokens, t.cost_usd,
                t.model_calls, t.tool_calls, t.tool_errors, list(t.actions),
                _steps_json(t.steps),
                sorted(t.flags), t.shadow_of, t.perturbation_family, t.perturbation_strength,
                t.revision, t.span_count,
                _evaluations_json(t.evaluations), now + i,
                t.task_input,
            ])
        self._insert("trials", rows, _TRIAL_COLS, permanent=True)

    def insert_outcome(self, key: str, key_kind: str, outcome: str, score: float | None,
                       source: str, *, verifier: bool = False) -> None:
        """Record an outcome posted to the API (``key_kind`` ``trace`` or ``trial``). Every post is
        kept; :func:`relyscope.scorers.outcomes.apply_outcomes` resolves them (metrics.md §6).
        ``verifier=True``: posted by the application's own environment check (§6 item 1)."""
        self._insert("outcomes", [[key, key_kind, outcome, score, source, verifier, self.stamp_ns("outcomes")]],
                     ["key", "key_kind", "outcome", "score", "source", "verifier", "posted_at"])

    def insert_judgement(self, trial_id: str, ev: Evaluation, model: str) -> None:
        """Store the LLM judge's evaluation of a trial (one per trial; a re-judgement replaces)."""
        self._insert("judgements", [[trial_id, ev.name, ev.score, ev.label, ev.explanation, model, _utcnow()]],
                     ["trial_id", "name", "score", "label", "explanation", "model", "judged_at"])

    def judgements(self) -> dict[str, Evaluation]:
        """trial id → the judge's evaluation."""
        rows = self.query("SELECT trial_id, name, score, label, explanation FROM {db}.judgements FINAL")
        return {r[0]: Evaluation(name=r[1], score=r[2], label=r[3], explanation=r[4]) for r in rows}

    def insert_scores(self, rows: list[dict]) -> None:
        """Store score rows (dicts with the ``scores`` columns; times as Unix seconds or datetimes)."""
        if not rows:
            return
        rows = [{k: (_dt(v) if k in ("window_start", "window_end", "computed_at") else v) for k, v in r.items()}
                for r in rows]
        cols = list(rows[0])
        self._insert("scores", [[r[c] for c in cols] for r in rows], cols)

    def insert_rows(self, table: str, rows: list[dict]) -> None:
        """Insert dict rows (same keys each) into ``table``. Raises StoreUnavailable."""
        if not rows:
            return
        cols = list(rows[0])
        self._insert(table, [[r[c] for c in cols] for r in rows], cols)

    def insert_grades(self, rows: list[dict]) -> None:
        if not rows:
            return
        cols = list(rows[0])
        self._insert("grades", [[r[c] for c in cols] for r in rows], cols)

    # ---- reads ----------------------------------------------------------------------------------
    def query(self, sql: str, parameters: dict | None = None) -> list[tuple]:
        """Run a read query (``{db}`` in the SQL is replaced by the database). Returns rows."""
        try:
            with self._lock:
                return self._ready_client().query(sql.replace("{db}", self.db), parameters=parameters).result_rows
        except StoreUnavailable:
            raise
        except Exception as e:  # noqa: BLE001
            raise StoreUnavailable(f"query failed: {e}") from e

    def insert_gate_verdict(self, key: tuple[str, str, str, str], policy: str, result: dict) -> None:
        """Keep a published gate verdict: ``key`` (agent, baseline, candidate, mode), ``policy``
        the gate policy's digest (:func:`relyscope.scorers.gate.policy_digest`), ``result`` its
        ``GateResult.to_json()``. Raises StoreUnavailable."""
        self._insert("gate_verdicts", [[*key, policy, json.dumps(result, allow_nan=False),
                                        self.stamp_ns("gate_verdicts")]],
                     ["agent", "baseline", "candidate", "mode", "policy", "result", "evaluated_at"])

    def latest_gate_verdicts(self, policy: str) -> dict[tuple[str, str, str, str], dict]:
        """The latest verdict kept under gate policy digest ``policy`` of each (agent, baseline,
        candidate, mode): key → the ``to_json()`` dict. Raises StoreUnavailable."""
        rows = self.query("SELECT agent, baseline, candidate, mode, argMax(result, evaluated_at) "
                          "FROM {db}.gate_verdicts WHERE policy = %(p)s GROUP BY agent, baseline, candidate, mode",
                          {"p": policy})
        return {tuple(r[:4]): json.loads(r[4]) for r in rows}

    def release_memory(self) -> bool:
        """Return the embedded engine's freed memory to the system: ``SYSTEM JEMALLOC PURGE``
        (chDB allocates through its own jemalloc, which keeps freed pages for reuse; glibc's
        ``malloc_trim`` cannot return them). True when it ran; False on a ClickHouse server (its
        memory is not this process's) or a closed store. ~10 ms (max 23–50 ms in
        bench/README.md, ``bench_live_scoring.py``), holding the store lock; there, RSS over idle
        at the max went from about +300 to +216–248 MiB. Raises StoreUnavailable if the engine
        refuses the statement."""
        if not self.embedded:
            return False
        with self._lock:
            if self._client is None:
                return False
            try:
                self._client.command("SYSTEM JEMALLOC PURGE")
            except Exception as e:  # noqa: BLE001
                raise StoreUnavailable(f"SYSTEM JEMALLOC PURGE failed: {e}") from e
        return True

    def count_spans(self) -> int:
        """Stored spans, each (trace id, span id) once."""
        return self.query("SELECT count() FROM {db}.otel_traces FINAL")[0][0]

    def load_spans(self, trace_ids: Iterable[str]) -> list[CanonicalSpan]:
        """The spans stored for ``trace_ids`` (``otel_traces FINAL``), as CanonicalSpans.

        Lossy where the table is: attribute values come back as the strings they were stored as
        (ints ``"10"``, bools ``"true"``, lists/dicts as JSON; the normalizers accept these). Times
        keep full ns; ``raw_end_ns`` from ``RelyscopeRawEndNs``. Raises StoreUnavailable."""
        ids = sorted(set(trace_ids))
        if not ids:
            return []
        rows = self.query(
            "SELECT toUnixTimestamp64Nano(Timestamp), TraceId, SpanId, ParentSpanId, TraceState, SpanName,"
            " SpanKind, ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode,"
            " StatusMessage, arrayMap(x -> toUnixTimestamp64Nano(x), `Events.Timestamp`), `Events.Name`,"
            " `Events.Attributes`, `Links.TraceId`, `Links.SpanId`, RelyscopeFlags, RelyscopeRawEndNs"
            " FROM {db}.otel_traces FINAL WHERE TraceId IN %(ids)s", {"ids": ids})
        kinds = {v: k for k, v in _SPAN_KIND.items()}
        statuses = {v: k for k, v in _STATUS.items()}
        out = []
        for (start, tid, sid, parent, tstate, name, kind, res, scope, scope_v, attrs, dur, status,
             status_msg, ev_ts, ev_names, ev_attrs, l_tids, l_sids, flags, raw_end) in rows:
            out.append(CanonicalSpan(
                trace_id=tid, span_id=sid, parent_span_id=parent, name=name,
                kind=kinds.get(kind, 0), start_ns=int(start), end_ns=int(start) + int(dur),
                status_code=statuses.get(status, 0), status_message=status_msg,
                attributes=dict(attrs), resource=dict(res), scope_name=scope, scope_version=scope_v,
                events=tuple(SpanEvent(n, int(t), dict(a)) for t, n, a in zip(ev_ts, ev_names, ev_attrs)),
                links=tuple(zip(l_tids, l_sids)), trace_state=tstate, flags=frozenset(flags),
                raw_end_ns=int(raw_end) if raw_end is not None else None,
            ))
        return out

    def traces_present(self, trace_ids: Iterable[str]) -> set[str]:
        """Which of ``trace_ids`` already have spans stored (one primary-key lookup)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return set()
        return {r[0] for r in self.query(
            "SELECT DISTINCT TraceId FROM {db}.otel_traces WHERE TraceId IN %(ids)s", {"ids": ids})}

    def ping(self) -> bool:
        """Whether the store answers (and no empty chaos fault file says it is down)."""
        if self.fault_file and os.path.exists(self.fault_file) and not _nonempty(self.fault_file):
            return False
        try:
            return self.query("SELECT 1")[0][0] == 1
        except StoreUnavailable:
            return False

    def score_history(self, metric: str, *, agent: str | None = None, version: str | None = None,
                      run_kind: str | None = None, limit: int = 200) -> list[dict]:
        """One metric over time (from the ``scores`` table): per group, the value, CI and task
        count of every scoring that changed its window or its inputs (a late outcome adds a point),
        oldest first (at most ``limit`` per group, the newest)."""
        where, params = ["metric = %(m)s"], {"m": metric, "lim": limit}
        for col, val in (("agent", agent), ("version", version), ("run_kind", run_kind)):
            if val is not None:
                where.append(f"{col} = %({col})s")
                params[col] = val
        rows = self.query(
            "SELECT agent, version, run_kind, toUnixTimestamp64Milli(computed_at), value, ci_low, ci_high, "
            "n_tasks FROM (SELECT * FROM {db}.scores FINAL WHERE " + " AND ".join(where) +
            " ORDER BY computed_at DESC LIMIT %(lim)s BY agent, version, run_kind) "
            "ORDER BY agent, version, run_kind, computed_at", params)
        return [{"agent": r[0], "version": r[1], "run_kind": r[2], "time": r[3] / 1000.0, "value": r[4],
                 "ci": [r[5], r[6]] if r[5] is not None else None, "n_tasks": r[7]} for r in rows]

    def trial_known(self, key_kind: str, key: str) -> bool:
        """Whether a finalized trial exists for this trial id (``key_kind="trial"``) or trace id."""
        col = "trial_id" if key_kind == "trial" else "trace_id"
        return bool(self.query(f"SELECT count() FROM {{db}}.trials WHERE {col} = %(k)s", {"k": key})[0][0])

    def count_trials(self, *, agent: str | None = None, version: str | None = None,
                     run_kind: str | None = None, task_id: str | None = None,
                     trace_ids: Iterable[str] | None = None) -> int:
        """Number of trials (tombstones skipped) matching the filters of :meth:`load_trials`."""
        where, params = ["status != 'superseded'"], {}
        for col, val in (("agent", agent), ("version", version), ("run_kind", run_kind), ("task_id", task_id)):
            if val is not None:
                where.append(f"{col} = %({col})s")
                params[col] = val
        if trace_ids is not None:
            where.append("trace_id IN %(tids)s")
            params["tids"] = sorted(set(trace_ids)) or [""]
        return int(self.query(f"SELECT count() FROM {{db}}.trials FINAL WHERE {' AND '.join(where)}",
                              params)[0][0])

    def conversation_ids(self, *, agent: str | None = None, version: str | None = None,
                         run_kind: str | None = None, after: str | None = None,
                         limit: int | None = None) -> tuple[list[str], int]:
        """(distinct conversation ids of stored trials in order, ``> after``, at most ``limit``;
        the number of all distinct conversation ids matching the filters)."""
        where, params = ["status != 'superseded'", "conversation_id IS NOT NULL", "conversation_id != ''"], {}
        for col, val in (("agent", agent), ("version", version), ("run_kind", run_kind)):
            if val is not None:
                where.append(f"{col} = %({col})s")
                params[col] = val
        base = f"FROM {{db}}.trials FINAL WHERE {' AND '.join(where)}"
        total = int(self.query(f"SELECT uniqExact(conversation_id) {base}", params)[0][0])
        if after is not None:
            base += " AND conversation_id > %(after)s"
            params["after"] = after
        sql = f"SELECT DISTINCT assumeNotNull(conversation_id) AS c {base} ORDER BY c"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [r[0] for r in self.query(sql, params)], total

    def span_counts(self) -> dict:
        """``{"spans": distinct stored spans, "rows": rows before dedup merges, "trials": n}``."""
        spans = self.count_spans()
        rows = self.query("SELECT count() FROM {db}.otel_traces")[0][0]
        trials = self.query("SELECT count() FROM {db}.trials FINAL WHERE status != 'superseded'")[0][0]
        return {"spans": spans, "rows": rows, "trials": trials}

    def span_keys(self, trace_id: str | None = None) -> list[tuple[str, str]]:
        """(trace id, span id) of stored spans (FINAL), optionally for one trace."""
        if trace_id:
            return self.query("SELECT TraceId, SpanId FROM {db}.otel_traces FINAL WHERE TraceId = %(t)s",
                              {"t": trace_id})
        return self.query("SELECT TraceId, SpanId FROM {db}.otel_traces FINAL")

    def outcomes(self) -> dict[tuple[str, str], list[tuple[str, float | None, str, bool, int]]]:
        """Every posted outcome per (key_kind, key), oldest first:
        (outcome, score, source, verifier, posted_ns)."""
        rows = self.query("SELECT key_kind, key, outcome, score, source, verifier, "
                          "toUnixTimestamp64Nano(posted_at) FROM {db}.outcomes ORDER BY posted_at")
        out: dict = {}
        for r in rows:
            out.setdefault((r[0], r[1]), []).append((r[2], r[3], r[4], bool(r[5]), int(r[6])))
        return out

    def tombstones(self, trial_ids: Iterable[str]) -> list[Trial]:
        """The ``superseded`` rows (tombstones of re-keyed trials) among ``trial_ids``, with their
        ids, groups and times (no steps). Raises StoreUnavailable."""
        where, params = "status = 'superseded' AND trial_id IN %(t)s", {"t": sorted(set(trial_ids)) or [""]}
        rows = self.query("SELECT trial_id, trace_id, root_span_id, task_id, agent, version, run_kind, "
                          "toUnixTimestamp64Nano(start_time), toUnixTimestamp64Nano(end_time) "
                          f"FROM {{db}}.trials FINAL WHERE {where}", params)
        return [Trial(trial_id=r[0], trace_id=r[1], root_span_id=r[2], task_id=r[3], task_id_source="",
                      agent_name=r[4], agent_version=r[5], run_kind=r[6], outcome="unknown", outcome_source=None,
                      outcome_score=None, claimed_success=None, confidence=None, conversation_id=None,
                      start_ns=int(r[7]), end_ns=int(r[8]), steps=(), status="superseded") for r in rows]

    def load_trials(self, *, agent: str | None = None, version: str | None = None,
                    run_kind: str | None = None, since_ns: int | None = None,
                    until_ns: int | None = None, trace_ids: Iterable[str] | None = None,
                    task_id: str | None = None, conversation_ids: Iterable[str] | None = None,
                    trial_ids: Iterable[str] | None = None, task_ids: Iterable[str] | None = None,
                    after_trial_id: str | None = None, limit: int | None = None,
                    most_recent: int | None = None, min_version_ns: int | None = None) -> list[Trial]:
        """Trials (latest revision of each, tombstones skipped), optionally filtered, with the
        outcome their spans carried (posted outcomes are resolved by the scorers, not here).
        Ordered by trial id; ``after_trial_id`` / ``limit`` page through them (keyset paging:
        trial ids strictly greater than ``after_trial_id``, at most ``limit``). ``most_recent``:
        only the N trials stored (finalized) last, whatever their timestamps — a bound by the
        traffic that also holds for backfilled, old-dated runs. ``min_version_ns``: only trials
        whose latest row was stored after it (``version_ns >``), read without ``FINAL`` (the
        version skip index prunes old parts: the cost follows the recent rows, not the table);
        the other filters apply to each key's latest row, as after ``FINAL``."""
        where, params = ["1"], {}
        for col, val in (("agent", agent), ("version", version), ("run_kind", run_kind), ("task_id", task_id)):
            if val is not None:
                where.append(f"{col} = %({col})s")
                params[col] = val
        if since_ns is not None:
            where.append("end_time >= fromUnixTimestamp64Nano(%(since)s)")
            params["since"] = since_ns
        if until_ns is not None:
            where.append("end_time < fromUnixTimestamp64Nano(%(until)s)")
            params["until"] = until_ns
        if trace_ids is not None:
            where.append("trace_id IN %(tids)s")
            params["tids"] = sorted(set(trace_ids)) or [""]
        if trial_ids is not None:
            where.append("trial_id IN %(trids)s")
            params["trids"] = sorted(set(trial_ids)) or [""]
        if conversation_ids is not None:
            where.append("conversation_id IN %(cids)s")
            params["cids"] = sorted(set(conversation_ids)) or [""]
        if after_trial_id is not None:
            where.append("trial_id > %(after)s")
            params["after"] = after_trial_id
        if task_ids is not None:
            where.append("task_id IN %(taskids)s")
            params["taskids"] = sorted(set(task_ids)) or [""]
        where.append("status != 'superseded'")  # tombstones of re-keyed trials (trajectory builder)
        sql = (f"SELECT {_TRIAL_SELECT} "
               f"FROM {{db}}.trials FINAL WHERE {' AND '.join(where)} ORDER BY trial_id")
        if min_version_ns is not None:
            # the latest row of each key among the recent ones is its latest row (as FINAL keeps);
            # only filters on the key's own columns may run before that pick — a filter on a
            # column that can differ between two rows of one key (trace, task, end time, status)
            # runs after it, on the latest row, as it does after FINAL
            inner = [w for w in where if w.split(" ", 1)[0] in _TRIAL_KEY_COLS] + ["version_ns > %(minv)s"]
            outer = [w for w in where if w.split(" ", 1)[0] not in _TRIAL_KEY_COLS]
            params["minv"] = int(min_version_ns)
            sql = (f"SELECT {_TRIAL_SELECT} FROM (SELECT {', '.join(_TRIAL_READ_COLS)}, version_ns FROM {{db}}.trials WHERE {' AND '.join(inner)} "
                   "ORDER BY version_ns DESC LIMIT 1 BY agent, version, run_kind, trial_id) "
                   f"WHERE {' AND '.join(outer)} ORDER BY trial_id")
        if most_recent is not None:
            sql = (f"SELECT * FROM (SELECT {_TRIAL_SELECT}, version_ns "
                   f"FROM {{db}}.trials FINAL WHERE {' AND '.join(where)} ORDER BY version_ns DESC "
                   f"LIMIT {int(most_recent)}) ORDER BY trial_id")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self.query(sql, params)
        out = []
        for r in rows:
            d = dict(zip(_TRIAL_READ_COLS, r))
            t = Trial(
                trial_id=d["trial_id"], trace_id=d["trace_id"], root_span_id=d["root_span_id"],
                task_id=d["task_id"], task_id_source=d["task_id_source"], agent_name=d["agent"],
                agent_version=d["version"], run_kind=d["run_kind"], outcome=d["outcome"],
                outcome_source=d["outcome_source"], outcome_score=d["outcome_score"],
                claimed_success=d["claimed_success"], confidence=d["confidence"],
                conversation_id=d["conversation_id"], start_ns=int(d["start_time"]),
                end_ns=int(d["end_time"]),
                steps=_steps_from_json(d["steps"]),
                input_tokens=d["input_tokens"], output_tokens=d["output_tokens"],
                total_tokens=d["total_tokens"], cost_usd=d["cost_usd"],
                model_calls=d["model_calls"], tool_calls=d["tool_calls"],
                tool_errors=d["tool_errors"], status=d["status"], flags=frozenset(d["flags"]),
                shadow_of=d["shadow_of"], perturbation_family=d["perturbation_family"],
                perturbation_strength=d["perturbation_strength"], revision=d["revision"],
                span_count=d["span_count"],
                evaluations=tuple(Evaluation(**e) for e in json.loads(d["evaluations"] or "[]")),
                task_input=d["task_input"],
            )
            out.append(t)
        return out


class SpanColumns:
    """Spans as the columns of ``otel_traces`` (what :meth:`Store.insert_span_columns` writes):
    one Python list per column, maps and arrays flattened (a count per row, then the keys and
    values of every row in order). Plain lists only, so it pickles (a decode worker process may
    build it). Row ``i`` holds exactly what :meth:`Store.insert_spans` writes for the same span:
    attribute values as their stored strings (:func:`_attr_str`), flags sorted, ``raw_end`` None
    unless it is a non-negative int.

    Shapes: ``ts`` start, Unix ns; ``duration`` ns; ``kind`` / ``status`` their names
    (``"Client"``, ``"Error"``); ``*_n`` counts per row (``ev_attr_n`` per event)."""

    __slots__ = ("ts", "trace_id", "span_id", "parent", "trace_state", "name", "kind", "service",
                 "scope_name", "scope_version", "duration", "status", "status_message",
                 "res_n", "res_k", "res_v", "attr_n", "attr_k", "attr_v",
                 "ev_n", "ev_ts", "ev_name", "ev_attr_n", "ev_attr_k", "ev_attr_v",
                 "link_n", "link_tid", "link_sid", "flag_n", "flags", "raw_end")

    def __init__(self) -> None:
        for f in self.__slots__:
            setattr(self, f, [])

    def __getstate__(self):
        return tuple(getattr(self, f) for f in self.__slots__)

    def __setstate__(self, state) -> None:
        for f, v in zip(self.__slots__, state):
            setattr(self, f, v)

    def __len__(self) -> int:
        return len(self.ts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpanColumns) and self.__getstate__() == other.__getstate__()

    __hash__ = None  # mutable

    def extend(self, other: "SpanColumns") -> None:
        """Append the rows of ``other`` (counts and flat lists both append: offsets are relative)."""
        for f in self.__slots__:
            getattr(self, f).extend(getattr(other, f))

    def add(self, s: CanonicalSpan) -> None:
        """Append one span's row (as :meth:`Store.insert_spans` builds it)."""
        self.ts.append(s.start_ns)
        self.trace_id.append(s.trace_id)
        self.span_id.append(s.span_id)
        self.parent.append(s.parent_span_id)
        self.trace_state.append(s.trace_state)
        self.name.append(s.name)
        self.kind.append(_SPAN_KIND.get(s.kind, "Unspecified"))
        self.service.append(str(s.resource.get("service.name", "")))
        self.scope_name.append(s.scope_name)
        self.scope_version.append(s.scope_version)
        self.duration.append(s.duration_ns)
        self.status.append(_STATUS.get(s.status_code, "Unset"))
        self.status_message.append(s.status_message)
        self.add_map(s.resource, self.res_n, self.res_k, self.res_v)
        self.add_map(s.attributes, self.attr_n, self.attr_k, self.attr_v)
        self.ev_n.append(len(s.events))
        for e in s.events:
            self.ev_ts.append(e.time_ns)
            self.ev_name.append(e.name)
            self.add_map(e.attributes, self.ev_attr_n, self.ev_attr_k, self.ev_attr_v)
        self.link_n.append(len(s.links))
        for lt, ls in s.links:
            self.link_tid.append(lt)
            self.link_sid.append(ls)
        self.flag_n.append(len(s.flags))
        self.flags.extend(sorted(s.flags))
        self.raw_end.append(s.raw_end_ns if s.raw_end_ns is not None and s.raw_end_ns >= 0 else None)

    def add_all(self, spans: Sequence[CanonicalSpan]) -> None:
        """Append the rows of ``spans``, equal to :meth:`add` of each in turn: one comprehension
        per scalar column, and each distinct resource dict (one per OTLP resource: shared by
        all its spans) converted once — ~2x cheaper than :meth:`add` per span."""
        if not spans:
            return
        self.ts.extend([s.start_ns for s in spans])
        self.trace_id.extend([s.trace_id for s in spans])
        self.span_id.extend([s.span_id for s in spans])
        self.parent.extend([s.parent_span_id for s in spans])
        self.trace_state.extend([s.trace_state for s in spans])
        self.name.extend([s.name for s in spans])
        kind = _SPAN_KIND.get
        self.kind.extend([kind(s.kind, "Unspecified") for s in spans])
        self.scope_name.extend([s.scope_name for s in spans])
        self.scope_version.extend([s.scope_version for s in spans])
        self.duration.extend([s.end_ns - s.start_ns for s in spans])
        status = _STATUS.get
        self.status.extend([status(s.status_code, "Unset") for s in spans])
        self.status_message.extend([s.status_message for s in spans])
        self.raw_end.extend([r if r is not None and r >= 0 else None for r in [s.raw_end_ns for s in spans]])
        # resources: (the dict itself, kept alive so its id stays its own, its row parts)
        resources: dict[int, tuple] = {}
        service, res_n, res_k, res_v = self.service, self.res_n, self.res_k, self.res_v
        attr_n, attr_k, attr_v = self.attr_n, self.attr_k, self.attr_v
        ev_n, link_n, flag_n = self.ev_n, self.link_n, self.flag_n
        for s in spans:
            r = s.resource
            got = resources.get(id(r))
            if got is None:
                got = resources[id(r)] = (r, str(r.get("service.name", "")), len(r), list(r),
                                          [v if v.__class__ is str else _attr_str(v) for v in r.values()])
            service.append(got[1])
            res_n.append(got[2])
            res_k.extend(got[3])
            res_v.extend(got[4])
            a = s.attributes
            attr_n.append(len(a))
            attr_k.extend(a)
            attr_v.extend([v if v.__class__ is str else _attr_str(v) for v in a.values()])
            evs = s.events
            ev_n.append(len(evs))
            if evs:
                for e in evs:
                    self.ev_ts.append(e.time_ns)
                    self.ev_name.append(e.name)
                    self.add_map(e.attributes, self.ev_attr_n, self.ev_attr_k, self.ev_attr_v)
            links = s.links
            link_n.append(len(links))
            if links:
                for lt, ls in links:
                    self.link_tid.append(lt)
                    self.link_sid.append(ls)
            fl = s.flags
            flag_n.append(len(fl))
            if fl:
                self.flags.extend(sorted(fl))

    @staticmethod
    def add_map(m: Any, n: list, ks: list, vs: list) -> None:
        n.append(len(m))
        ks.extend(m)
        vs.extend([v if v.__class__ is str else _attr_str(v) for v in m.values()])

    def rows(self) -> list[list]:
        """The rows :meth:`Store.insert_spans` would insert (for the chaos hook and tests)."""
        def maps(n, ks, vs):
            out, i = [], 0
            for c in n:
                out.append(dict(zip(ks[i:i + c], vs[i:i + c])))
                i += c
            return out

        def groups(n, xs):
            out, i = [], 0
            for c in n:
                out.append(list(xs[i:i + c]))
                i += c
            return out

        ev_attrs = groups(self.ev_n, maps(self.ev_attr_n, self.ev_attr_k, self.ev_attr_v))
        return [list(r) for r in zip(
            self.ts, self.trace_id, self.span_id, self.parent, self.trace_state, self.name, self.kind,
            self.service, maps(self.res_n, self.res_k, self.res_v), self.scope_name, self.scope_version,
            maps(self.attr_n, self.attr_k, self.attr_v), self.duration, self.status, self.status_message,
            groups(self.ev_n, self.ev_ts), groups(self.ev_n, self.ev_name), ev_attrs,
            groups(self.link_n, self.link_tid), groups(self.link_n, self.link_sid),
            groups(self.flag_n, self.flags), self.raw_end)]

    def scrubbed(self) -> "SpanColumns":
        """A copy with lone surrogates replaced by U+FFFD in every string (as :func:`_scrub`)."""
        out = SpanColumns()
        for f in self.__slots__:
            setattr(out, f, _scrub(getattr(self, f)))
        return out

    def arrow(self):
        """One ``pyarrow.Table`` with the ``otel_traces`` column names of ``_SPAN_COLS``."""
        import numpy as np

        pa = _pyarrow()

        s, m = pa.string(), pa.map_(pa.string(), pa.string())
        ns = pa.timestamp("ns")

        def offsets(n):
            o = np.zeros(len(n) + 1, dtype=np.int32)
            if n:
                np.cumsum(np.asarray(n, dtype=np.int32), out=o[1:])
            return pa.array(o)

        def mp(n, ks, vs):
            return pa.MapArray.from_arrays(offsets(n), pa.array(ks, s), pa.array(vs, s), type=m)

        def lst(n, values):
            return pa.ListArray.from_arrays(offsets(n), values)

        arrays = [
            pa.array(self.ts, ns), pa.array(self.trace_id, s), pa.array(self.span_id, s),
            pa.array(self.parent, s), pa.array(self.trace_state, s), pa.array(self.name, s),
            pa.array(self.kind, s), pa.array(self.service, s), mp(self.res_n, self.res_k, self.res_v),
            pa.array(self.scope_name, s), pa.array(self.scope_version, s),
            mp(self.attr_n, self.attr_k, self.attr_v), pa.array(self.duration, pa.uint64()),
            pa.array(self.status, s), pa.array(self.status_message, s),
            lst(self.ev_n, pa.array(self.ev_ts, ns)), lst(self.ev_n, pa.array(self.ev_name, s)),
            lst(self.ev_n, mp(self.ev_attr_n, self.ev_attr_k, self.ev_attr_v)),
            lst(self.link_n, pa.array(self.link_tid, s)), lst(self.link_n, pa.array(self.link_sid, s)),
            lst(self.flag_n, pa.array(self.flags, s)), pa.array(self.raw_end, pa.uint64()),
        ]
        return pa.Table.from_arrays(arrays, names=_SPAN_COLS)


def span_columns(spans: Iterable[CanonicalSpan]) -> SpanColumns:
    """:class:`SpanColumns` of these spans (the rows :meth:`Store.insert_spans` builds)."""
    cols = SpanColumns()
    cols.add_all(spans if isinstance(spans, (list, tuple)) else list(spans))
    return cols


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


#: ClickHouse refuses an INSERT block that touches more partitions than the server setting
#: ``max_partitions_per_insert_block`` (default 100) with TOO_MANY_PARTS, for the whole block. The
#: setting may be locked on a shared server, so inserts are split rather than the setting raised.
MAX_PARTITIONS_PER_INSERT = 100
_NS_PER_DAY = 86_400 * 10**9


def _by_partition(rows: list[list], part_of, max_parts: int = MAX_PARTITIONS_PER_INSERT) -> list[list[list]]:
    """Split ``rows`` into insert blocks touching at most ``max_parts`` partitions each
    (``part_of(row)``: the row's partition key, here the UTC day of ``otel_traces.Timestamp``,
    as ``PARTITION BY toDate(Timestamp)``). One block, in the original order, when it already fits
    (the common case); else blocks in partition order. A block is atomic on its own; a retry
    after a partial failure re-inserts earlier blocks, which ReplacingMergeTree deduplicates."""
    parts: dict[Any, list[list]] = {}
    for r in rows:
        parts.setdefault(part_of(r), []).append(r)
    if len(parts) <= max_parts:
        return [rows] if rows else []
    keys = sorted(parts)
    return [[r for k in keys[i:i + max_parts] for r in parts[k]] for i in range(0, len(keys), max_parts)]


_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub(v: Any) -> Any:
    """Replace unencodable code points (lone surrogates) in every string of a row structure."""
    if isinstance(v, str):
        return _SURROGATE.sub("\ufffd", v)
    if isinstance(v, list):
        return [_scrub(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_scrub(x) for x in v)
    if isinstance(v, dict):
        return {_scrub(k): _scrub(x) for k, x in v.items()}
    return v


def _utcnow():
    import datetime as _d

    return _d.datetime.now(_d.timezone.utc)


def _dt(v: Any):
    import datetime as _d

    if isinstance(v, (int, float)):
        return _d.datetime.fromtimestamp(v, _d.timezone.utc)
    return v


def latest_scores_sql() -> str:
    """Latest value of every (formula set, group, metric) in the ``scores`` table."""
    return ("SELECT formula_set, agent, version, run_kind, metric, argMax(value, computed_at), "
            "argMax(ci_low, computed_at), argMax(ci_high, computed_at), argMax(n_tasks, computed_at) "
            "FROM {db}.scores GROUP BY formula_set, agent, version, run_kind, metric")


def open_store(dsn: str) -> Store:
    """Open (and migrate) the store at ``dsn``. Raises :class:`StoreUnavailable`."""
    return Store(dsn)
