"""The sidecar's data path, wired once: receive → spool → normalize → assemble → store → score.

``Pipeline.accept`` is called by both OTLP receivers. It validates the request
(:func:`relyscope.collector.otlp.validate_http`: the reply details for partial success, equal to
what a full decode would answer, without building spans), appends the decompressed request body to
the durable spool, and only then returns — so an acknowledged span is on disk (``fdatasync``-ed).
The body (or, for OTLP/JSON, whose validation is the full decode, the decoded batch) is also kept
in a bounded in-memory queue (``queue_max_batches`` batches, ``_MEM_MAX_BYTES`` of bodies) so the
worker need not re-read it; the worker decodes protobuf bodies itself. A batch that did not fit,
or one replayed after a restart, is re-read from the spool.

One worker thread takes batches in spool order — decoded in that thread, or with
``decode_workers`` > 1 decoded ahead by that many processes (:mod:`relyscope.decode_pool`) and
taken back in spool order, so nothing below changes — normalizes the spans, stores them, feeds the
trajectory builder, stores finalized trials, and commits the spool up to the last record whose
spans are stored — an open trace never pins the spool. The ids of the traces still open (or
whose trial is not stored yet) are written durably before each commit, and reloaded from the
store on the next start. A store outage never blocks ``accept``: the spool keeps growing
(``SpoolFull`` → :class:`Backpressure` when it is full) and drains when the store returns.
With ``max_backlog_s`` set, a sidecar slower than its senders refuses requests (retryable) while
storing is further behind than that (:meth:`Pipeline.backlog_s`), so freshness stays bounded;
it is off while the store fails or a record is retried, and the backlog a restart or a long
failure leaves is exempt.
Retryable store errors back off (0.5 s doubling up to ``store_retry_max_s``); a record refused
with a data error is quarantined after ``quarantine_after_s`` (:meth:`Pipeline._unstorable`).

On start, whatever the spool still holds is replayed. Duplicates are harmless (spans and trials
are keyed, ReplacingMergeTree). A replayed record may hold only the *late* spans of a trace whose
earlier records were committed before the crash; the trace is then completed from the spans the
store already holds (:meth:`relyscope.store.Store.load_spans`) before it is re-assembled, so it yields the same
trial (same id) rather than a partial one.

A scorer thread (:class:`relyscope.scoring.ScoreStage`, owned here as ``self.scoring``) recomputes
the scores of groups (agent, version, run kind) whose trials changed, every ``score_interval_s``,
stores them and hands them to the gauges.

Errors: :class:`Backpressure` (retryable: spool full, or ``max_backlog_s`` exceeded) and
:class:`relyscope.collector.otlp.OTLPRequestError` (permanent: the request is unusable, or larger
than the whole spool) are raised to the receivers, which map them to OTLP status codes.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from relyscope.collector import fastpath
from relyscope.collector.decoding import ingest_setup
from relyscope.collector.normalize import normalize
from relyscope.collector.otlp import (
    DecodeResult,
    OTLPRequestError,
    Validation,
    decode_http,
    validate_http,
)
from relyscope.collector.otlp import decompress
from relyscope.collector.records import TAG_JSON, TAG_PROTO
from relyscope.collector.spool import HEADER_SIZE, Spool, SpoolFull
from relyscope.config import Settings
from relyscope.decode_pool import DecodePool, OrderedPrefetch, resolve_workers
from relyscope.memory import gc_paused
from relyscope.model import CanonicalSpan, Trial
from relyscope.scorers.policy import Policy, load_policy
from relyscope.scorers.profile import GroupScore
from relyscope.scoring import GroupKey, ScoreStage, grade_rows_of, score_rows  # noqa: F401 (re-exported)
from relyscope.collector import quarantine
from relyscope.collector.budget import InflightBudget
from relyscope.store import Store, StoreRejected, StoreUnavailable
from relyscope.trajectory.clock import place_on_clock
from relyscope.store.clickhouse import SpanColumns

__all__ = ["Pipeline", "Backpressure", "Stats", "GroupKey", "spool_segment_bytes", "default_spool_dir"]

log = logging.getLogger("relyscope.pipeline")

# spool record: 1 tag byte + body. The tag says how to decode it again on replay.
_TAG_PROTO, _TAG_JSON = TAG_PROTO, TAG_JSON
_INSERT_BATCH_SPANS = 8192  # spans per ClickHouse insert (several spool records)

_STORE_RETRY_S = 0.5  # first pause before retrying a failed store write; doubles per failure
_OPEN_STATE = "open_traces.json"  # spool state: ids of traces open at the last commit
_MIN_STRIKES = 3  # attempts before a record refused with a data error is quarantined
_MAX_SEGMENT_BYTES = 64 << 20
_MEM_MAX_BYTES = 64 << 20  # spooled bodies kept in memory for the worker (beyond: re-read)
_RATE_ALPHA = 0.2  # weight of the latest batch in the worker's seconds-per-record average (backlog_s)
_PREFETCH_RECORDS_PER_WORKER = 8  # records decoded ahead per decode process (decode_workers > 1)


class Backpressure(Exception):
    """Retryable: the spool is full, the in-flight byte budget is spent, or storing is further
    behind than ``max_backlog_s``. Receivers answer RESOURCE_EXHAUSTED / 503 + Retry-After."""

    retry_after_s = 2  # a full spool frees a segment within seconds once the store drains


#: why a request was refused with the retryable signal (``relyscope_backpressure_total{reason}``):
#: the durable spool is full, the in-flight byte budget of requests being received is spent, or
#: storing is further behind than ``RELYSCOPE_MAX_BACKLOG_S``
BACKPRESSURE_REASONS = ("spool_full", "inflight_budget", "backlog")


@dataclass
class Stats:
    """Self-observability counters (exported on /metrics)."""

    received: int = 0
    accepted: int = 0
    rejected: collections.Counter = field(default_factory=collections.Counter)
    warnings: collections.Counter = field(default_factory=collections.Counter)
    deduplicated: int = 0
    #: spans written to the store by the worker (re-sent duplicates included: the store keeps one)
    stored: int = 0
    #: OTLP requests refused before their body was read, by reason: ``unauthenticated`` (a missing
    #: or wrong bearer token: the exporter logs a 401, the sidecar showed nothing)
    requests_refused: collections.Counter = field(default_factory=collections.Counter)
    _refused_logged_at: float = 0.0
    trials_finalized: int = 0
    #: finalized trials that ended after the sidecar's clock, placed on it (trajectory.clock)
    trials_clock_ahead: int = 0
    store_errors: int = 0
    # recent write latencies, drained by the exporter's histogram; bounded if nobody scrapes
    store_write_seconds: collections.deque = field(default_factory=lambda: collections.deque(maxlen=4096))
    backpressure: int = 0  # requests refused with the retryable signal, all reasons
    #: the same by reason (:data:`BACKPRESSURE_REASONS`); :meth:`refused` counts both
    backpressure_by: collections.Counter = field(default_factory=collections.Counter)
    # stored spans by redaction flag: "redacted" (the policy changed the span), "redacted_identity"
    # (an identity value or the span name got its keyed token)
    redacted: collections.Counter = field(default_factory=collections.Counter)

    def refused_request(self, reason: str) -> None:
        """Count one OTLP request refused before its body was read (``requests_refused``); a
        warning names the reason at most once a minute (a misconfigured exporter retries often)."""
        self.requests_refused[reason] += 1
        now = time.monotonic()
        if now - self._refused_logged_at >= 60.0:
            self._refused_logged_at = now
            log.warning("OTLP requests refused: %s so far (%s: check the exporter's bearer token and "
                        "RELYSCOPE_AUTH_TOKEN)", dict(self.requests_refused), reason)

    def refused(self, reason: str) -> None:
        """Count one request refused with the retryable signal, for ``reason`` (one of
        :data:`BACKPRESSURE_REASONS`)."""
        self.backpressure += 1
        self.backpressure_by[reason] += 1


def spool_segment_bytes(settings: Settings) -> int:
    """Segment size of the spool, bytes: ``settings.spool_segment_bytes`` when that setting exists
    and is set, else ``min(64 MiB, spool_max_bytes // 8)`` — the spool frees space per whole
    segment, so a cap of several segments keeps a full spool from being one undeletable segment.
    Always within ``(HEADER_SIZE, spool_max_bytes]`` as :class:`Spool` requires."""
    cap = settings.spool_max_bytes
    explicit = getattr(settings, "spool_segment_bytes", None)
    size = explicit if explicit else min(_MAX_SEGMENT_BYTES, cap // 8)
    return max(HEADER_SIZE + 1, min(int(size), cap))


#: how long /healthz shows a decode-pool restart as last_error (status degraded), seconds
_DECODE_ERROR_SHOWN_S = 300.0


class Pipeline:
    """Owns the spool, the worker and scorer threads, the trajectory builder and the latest scores.

    Thread-safety: ``accept`` is safe from any thread (receivers call it concurrently) and never
    waits for the store; the builder, the pending trials and the record→traces list are touched
    only by the worker thread. ``self._cv`` guards ``_mem``, ``_next_seq`` and the flush counters;
    it is never held across a store call or a spool append.
    """

    def __init__(self, settings: Settings, store: Store, *, clock: Callable[[], float] = time.monotonic):
        from relyscope.trajectory import TrajectoryBuilder

        self.settings = settings
        self.store = store
        self.clock = clock
        # fail fast on a bad policy file (PolicyError names the file and field)
        self.policy: Policy | None = load_policy(settings.policy_file) if settings.policy_file else None
        spool_dir = settings.spool_dir or default_spool_dir(store.dsn)
        # limits, redaction and decode path: built where `relyscope score` builds them too; the
        # identity-token key kept beside the spool (unless RELYSCOPE_REDACT_KEY), so equal ids
        # stay equal across restarts
        setup = ingest_setup(settings, key_file=spool_dir.rstrip("/") + ".redact-key")
        self.limits = setup.limits
        self.redactor = setup.redactor
        # the hot path (relyscope.collector.fastpath) or the reference it is tested against
        self._fast = setup.fast
        # how a spool record is decoded: picklable, so decode_workers > 1 runs it in processes
        # (fast: redacted, normalized and laid out as insert columns there too)
        self._decode_fn: Callable[[bytes], DecodeResult] = setup.decode_record
        self._prefetch: OrderedPrefetch | None = None  # set by start() when decode_workers > 1
        #: decode processes in use once started (1: the worker thread decodes; ``decode_workers``
        #: resolved by :func:`relyscope.decode_pool.resolve_workers`)
        self.decode_workers = 1
        self.inflight = InflightBudget(settings.max_inflight_bytes)  # shared by both receivers
        self.spool_dir = spool_dir
        self.spool = Spool(spool_dir, max_bytes=settings.spool_max_bytes,
                           segment_bytes=spool_segment_bytes(settings))
        # evicted finalized traces are forgotten: a late span reloads its trace from the store
        # (_rehydrate), so the cache bound costs a query, never a fragment trial
        self.builder = TrajectoryBuilder(grace_s=settings.grace_period_s,
                                         root_timeout_s=settings.root_timeout_s,
                                         retain_s=settings.finalized_retain_s,
                                         retain_bytes=settings.finalized_cache_bytes, forget_evicted=True,
                                         open_max_bytes=settings.open_traces_max_bytes)
        self.stats = Stats()
        self._cv = threading.Condition()
        # seq -> decoded batch (JSON, or a batch the store refused) or spool payload (protobuf)
        self._mem: collections.OrderedDict[int, DecodeResult | bytes] = collections.OrderedDict()
        self._mem_bytes = 0  # memory charged for the entries of _mem
        self._mem_cost: dict[int, int] = {}
        # next spool sequence the worker processes; everything committed is done
        self._next_seq: int = self.spool.committed_seq + 1
        # records already in the spool when it was opened are a replay (see _rehydrate)
        self._replay_until: int = self.spool.last_seq
        self._rehydrated: set[str] = set()
        self._single_until = 0  # process spool records one at a time up to this sequence
        # record → (first refusal with a data error, monotonic s; refusals so far)
        self._strikes: dict[int, tuple[float, int]] = {}
        self._trial_strikes: dict[str, tuple[float, int]] = {}  # trial id → same, for trials
        self._failures = 0  # consecutive failed store writes (backoff exponent)
        self.quarantine_dir = quarantine.quarantine_dir(spool_dir)
        self._restored = False  # open traces of the previous run reloaded (see _restore_open)
        self._persisted_open: frozenset[str] | None = None  # last open-trace list written
        self._pending_trials: list[Trial] = []  # finalized, not yet stored (store down)
        self._retry_at = 0.0  # monotonic time before which the worker does not retry the store
        self._store_failing = False
        #: records up to this sequence are exempt from ``max_backlog_s``: appended before this start
        #: (replayed) or before the store recovered from a long failure (the backlog it left)
        self._backlog_from = self.spool.last_seq
        #: wall time (ns) the worker passed ``_backlog_from``; None while it is still draining that
        #: exempt backlog (records behind it wait from this moment on, not from their append)
        self._exempt_done_ns: int | None = None if self.spool.last_seq > self.spool.committed_seq else 0
        #: monotonic time the store started failing or refusing a record (None: working)
        self._impaired_since: float | None = None
        #: moving average of the worker's wall seconds per spool record over full batches (None
        #: until one is stored: a small batch is mostly fixed cost and would overstate it)
        self._s_per_record: float | None = None
        self._stop = threading.Event()
        self._flush_req = 0
        self._flush_done = 0
        self._threads: list[threading.Thread] = []
        self._last_error: str | None = None
        self.ready = False
        self._draining = False
        self._last_accept = 0.0  # monotonic time of the last spooled request
        self._append_failed_at: float | None = None  # monotonic time of the last failed append
        self._open_traces = 0
        # the worker's last batch was full and more records wait: the scorer postpones its cycle
        self._backlogged = False
        self.scoring = ScoreStage(settings, store, self.policy, stop=self._stop,
                                  store_error=lambda e: setattr(self, "_last_error", str(e)),
                                  busy=lambda: self._backlogged, max_defer=settings.score_max_defer)
        # shadow replays and release gates (relyscope.shadow): the stage is attached by the sidecar
        from relyscope.scorers.gate import default_gate_policy, load_gate_policy

        self.gate_policy = load_gate_policy(settings.gate_policy_file) if settings.gate_policy_file \
            else default_gate_policy()
        from relyscope.shadow.verdicts import GateVerdicts

        #: (agent, baseline, candidate, mode) → the latest published GateResult, kept in the store
        self.gate_results = GateVerdicts(store, self.gate_policy)
        self.shadow = None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker (which first replays what the spool holds) and the scorer thread."""
        self.gate_results.load()  # the verdicts published before a restart (again at reads if the store is down)
        if self.spool.pending_records:
            log.info("replaying %d spooled batches", self.spool.pending_records)
        self._start_decoding()
        for target, name in ((self._work_loop, "relyscope-worker"), (self._score_loop, "relyscope-scorer")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.ready = True

    def _start_decoding(self) -> None:
        """Start the decode processes ``decode_workers`` resolves to (none for 1); sets
        :attr:`decode_workers`. With ``auto``, a pool that cannot start (no POSIX semaphores: a
        container without /dev/shm) leaves the decode in the worker thread, with a warning; an
        explicit number raises instead."""
        workers = resolve_workers(self.settings.decode_workers)
        if workers > 1 and self._prefetch is None:
            try:
                pool = DecodePool(_ahead_of(self._decode_fn), workers)
            except Exception as e:  # noqa: BLE001 - e.g. no POSIX semaphores
                if self.settings.decode_workers != "auto":
                    raise
                log.warning("cannot start %d decode processes (%s); decoding in the worker thread", workers, e)
            else:
                self._prefetch = OrderedPrefetch(pool, max_records=_PREFETCH_RECORDS_PER_WORKER * workers,
                                                 max_bytes=_MEM_MAX_BYTES,
                                                 timeout_s=self.settings.decode_timeout_s)
        self.decode_workers = self._prefetch.pool.workers if self._prefetch is not None else 1

    def drain(self, timeout_s: float, *, quiet_s: float = 1.0) -> bool:
        """First half of a graceful stop, while the receivers still answer: readiness turns to
        ``stopping``, ``accept`` keeps spooling (an acknowledged span is durable either way), and
        the worker keeps storing. Returns True once nothing arrived for ``quiet_s`` and the queue
        is empty (or the store is failing, so waiting would not drain it), False at ``timeout_s``.
        Then close the receivers and call :meth:`shutdown`."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                now = time.monotonic()
                if now - self._last_accept >= quiet_s and (self._queue_empty() or self._store_failing):
                    return True
                if now >= deadline:
                    log.warning("stop: still receiving or draining after %.1f s; %d batches left in the spool",
                                timeout_s, self.queue_depth)
                    return False
                self._cv.wait(timeout=min(0.1, deadline - now))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop after storing what is queued (at most ``timeout_s``; at once while the store is
        failing — the spool keeps everything uncommitted for the next start); close the spool.
        Open traces are not finalized: their records stay in the spool and are replayed.
        Idempotent."""
        if self._stop.is_set():
            return
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not self._queue_empty() and not self._store_failing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("shutdown: %d batches left in the spool for the next start", self.queue_depth)
                    break
                self._cv.wait(timeout=min(remaining, 0.2))
            self._stop.set()
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout_s)
        if self._prefetch is not None:
            self._prefetch.reset(0)
            self._prefetch.pool.close()
        self.spool.close()

    @property
    def last_error(self) -> str | None:
        """The last store error seen (for /healthz), or None; else a decode-pool restart (a worker
        died or hung) in the last ``_DECODE_ERROR_SHOWN_S`` seconds, or None."""
        if self._last_error is None and self._prefetch is not None and self._prefetch.last_restart:
            at, why = self._prefetch.last_restart
            if time.time() - at < _DECODE_ERROR_SHOWN_S:
                return why
        return self._last_error

    @property
    def decode_restarts(self) -> int:
        """Decode-pool restarts since start (a worker died or gave no result in decode_timeout_s)."""
        return self._prefetch.restarts if self._prefetch is not None else 0

    @property
    def queue_depth(self) -> int:
        """Spooled batches not yet processed by the worker."""
        return max(0, self.spool.last_seq - self._next_seq + 1)

    @property
    def open_traces(self) -> int:
        """Traces buffered and not yet finalized (as of the worker's last pass)."""
        return self._open_traces

    # ---- probes ---------------------------------------------------------------------------------
    def liveness(self) -> str | None:
        """None while the process works (worker and scorer threads run, the spool is usable), else
        why a restart is needed. A store outage or a full spool is *not* a liveness failure: a
        restart would not help and the spool keeps the data."""
        if self._threads and not all(t.is_alive() for t in self._threads) and not self._stop.is_set():
            return "worker thread died"
        if self.spool.failed:
            return f"spool unusable: {self.spool.failed}"
        return None

    def readiness(self) -> str | None:
        """None while new data would be accepted, else the reason it would be refused now:
        ``starting``, ``stopping``, ``spool_full`` (≥ 95 % of ``spool_max_bytes``), ``disk_full``
        (under 1 MiB free on the spool's file system) or ``spool_write_failed`` (an append failed
        with an OSError in the last 10 s and none succeeded since), or the liveness failure."""
        if not self.ready:
            return "stopping" if self._stop.is_set() or self._draining else "starting"
        dead = self.liveness()
        if dead:
            return dead
        if self._draining:
            return "stopping"
        if self.spool.bytes_used >= self.settings.spool_max_bytes * 0.95:
            return "spool_full"
        try:
            st = os.statvfs(self.spool_dir)
            if st.f_bavail * st.f_frsize < (1 << 20):
                return "disk_full"
        except OSError:
            pass
        failed_at = self._append_failed_at
        if failed_at is not None and time.monotonic() - failed_at < 10.0:
            return "spool_write_failed"
        return None

    def quarantine_summary(self) -> tuple[int, int]:
        """(records, bytes) held in the quarantine directory."""
        return quarantine.summary(self.quarantine_dir)

    # ---- receiving ------------------------------------------------------------------------------
    def accept(self, body: bytes, content_type: str | None, content_encoding: str | None = None) -> Validation:
        """Validate and durably spool one OTLP/HTTP or OTLP/gRPC (protobuf) request.

        Returns the :class:`~relyscope.collector.otlp.Validation` (accepted / rejected counts and
        reasons for the partial-success reply; equal to what ``decode_http`` answers) once the
        request is in the spool; the spans are decoded by the worker. Raises OTLPRequestError
        (permanent; 413 when the request alone exceeds ``spool_max_bytes``) or Backpressure
        (retryable: spool full, shutting down, or storing further behind than ``max_backlog_s``:
        :meth:`backlog_s`); an OSError from the spool (disk) propagates.
        Safe from any thread; never waits for the store.
        """
        self._check_backlog()
        inflated = 0
        raw, body = body, decompress(body, content_encoding, self.limits)
        if body is not raw:
            inflated = len(body)  # a second buffer beside the compressed one the receiver holds
            if not self.inflight.try_acquire(inflated):
                self.stats.refused("inflight_budget")
                raise Backpressure("in-flight byte budget exhausted")
        try:
            return self._accept(body, content_type)
        finally:
            self.inflight.release(inflated)

    def backlog_s(self) -> float:
        """How far storing is behind receiving, seconds (what ``max_backlog_s`` bounds): the
        larger of the age of the oldest spooled record not yet stored (committed) and the time the
        worker needs for the records waiting for it (their count times its recent wall seconds per
        record in full batches) — the first alone undercounts when receiving is faster than
        storing: a backlog only seconds old can take minutes to store. What this start's replay
        or a store failure of at least ``max_backlog_s`` left is not counted, and the records
        queued behind it count their wait from when the worker got past it; 0.0 when the
        worker is caught up."""
        frm, now = self._backlog_from, time.time_ns()
        done = self._exempt_done_ns
        if done is None and self._next_seq - 1 >= frm:  # the exempt backlog is drained
            done = self._exempt_done_ns = now
        age = 0.0 if done is None else min(self.spool.pending_age_s(after=frm), max(0.0, (now - done) / 1e9))
        per = self._s_per_record
        if per is None:
            return age
        waiting = self.spool.last_seq - max(self._next_seq - 1, frm)
        return max(age, waiting * per)

    def _check_backlog(self) -> None:
        """Raise Backpressure when ``max_backlog_s`` is set, the store works and storing is
        further behind than it (:meth:`backlog_s`). Checked before the body is decompressed,
        validated or spooled, so a refusal costs little."""
        bound = self.settings.max_backlog_s
        if bound is None or self._impaired_since is not None:  # the spool absorbs store trouble
            return
        age = self.backlog_s()
        if age > bound:
            self.stats.refused("backlog")
            raise Backpressure(f"storing is {age:.1f} s behind (RELYSCOPE_MAX_BACKLOG_S={bound:g})")

    def _accept(self, body: bytes, content_type: str | None) -> Validation:
        result = validate_http(body, content_type, None, self.limits)
        self.stats.received += result.accepted + result.rejected
        self.stats.rejected.update(result.rejected_by_reason)  # bounded reason codes
        if result.decoded is not None:  # JSON: decoded already; protobuf warnings: by the worker
            self.stats.warnings.update(result.decoded.warnings)
        if not result.accepted:
            return result
        is_json = result.decoded is not None
        # spool the decompressed body, so replay needs no decompression
        payload = (_TAG_JSON if is_json else _TAG_PROTO) + body
        if HEADER_SIZE + len(payload) > self.settings.spool_max_bytes:
            # permanent (a retry cannot succeed): counted, and FAILED_PRECONDITION over gRPC —
            # RESOURCE_EXHAUSTED would make OTLP exporters retry and then drop silently
            self.stats.rejected["too_large_for_spool"] += result.accepted
            raise OTLPRequestError(
                f"request of {len(body)} bytes can never fit in the spool (RELYSCOPE_SPOOL_MAX_BYTES="
                f"{self.settings.spool_max_bytes}); send smaller batches or enlarge the spool",
                413, "FAILED_PRECONDITION")
        # outside self._cv: concurrent appends share one fdatasync (the spool's group commit)
        try:
            seq = self.spool.append(payload)
        except SpoolFull:
            self.stats.refused("spool_full")
            raise Backpressure("spool full") from None
        except ValueError:  # the spool is closed: shutting down
            raise Backpressure("shutting down") from None
        except OSError:  # disk full, I/O error: the receivers answer retryable; readiness says so
            self._append_failed_at = time.monotonic()
            raise
        self._append_failed_at = None
        with self._cv:
            # the worker may have read this record from the spool already: cache only if not
            if seq >= self._next_seq and len(self._mem) < self.settings.queue_max_batches:
                # a decoded JSON batch takes ~2.3x its body in memory; charge 3x
                cost = len(payload) * (3 if is_json else 1)
                if self._mem_bytes + cost <= _MEM_MAX_BYTES:
                    self._mem[seq] = result.decoded if is_json else payload
                    self._mem_cost[seq] = cost
                    self._mem_bytes += cost
            self.stats.accepted += result.accepted
            self._last_accept = time.monotonic()
            self._cv.notify_all()
        return result

    # ---- worker ---------------------------------------------------------------------------------
    def _take(self) -> tuple[int, DecodeResult] | None:
        """Next batch in spool order, decoded: from memory, or re-read from the spool."""
        if self._prefetch is not None:
            return self._take_pooled()
        with self._cv:
            seq = self._next_seq
            res = self._mem.pop(seq, None)
            self._mem_bytes -= self._mem_cost.pop(seq, 0)
        if isinstance(res, DecodeResult):
            return seq, (fastpath.prepare(res, self.redactor) if self._fast else res)
        if res is not None:
            return seq, self._decode_record(seq, res)
        last = self.spool.last_seq
        if seq > last:
            return None
        recs = self.spool.read_from(seq, max_records=1)
        if not recs:
            # every record in [seq, last] is unreadable (corrupt: counted by the spool) or gone
            log.warning("spool records %d..%d unreadable; skipped", seq, last)
            self._advance(last)
            return None
        rseq, payload = recs[0]
        return rseq, self._decode_record(rseq, payload)

    def _decode_record(self, seq: int, payload: bytes) -> DecodeResult:
        """Decode one spool record (tag byte + decompressed body) with ``self._decode_fn`` in this
        thread, and count its warnings (:meth:`_decoded`)."""
        return self._decoded(seq, payload, self._decode_fn(payload))

    def _decoded(self, seq: int, payload: bytes, res: DecodeResult) -> DecodeResult:
        """Protobuf warnings are counted here, once, for records accepted since this start (JSON
        ones were counted by ``accept``; replayed ones when first accepted)."""
        if payload[:1] != _TAG_JSON and seq > self._replay_until:
            self.stats.warnings.update(res.warnings)
        return res

    def _take_pooled(self) -> tuple[int, DecodeResult] | None:
        """As :meth:`_take`, with records decoded ahead by the worker processes
        (``decode_workers`` > 1); results still come in spool order."""
        with self._cv:
            seq = self._next_seq
        got = self._prefetch.take(seq, self._fetch)
        if got is None:
            last = self.spool.last_seq
            if seq <= last:  # every record in [seq, last] is unreadable (counted by the spool) or gone
                log.warning("spool records %d..%d unreadable; skipped", seq, last)
                self._advance(last)
            return None
        rseq, res, payload = got
        if payload is None:  # a decoded JSON batch from memory
            return rseq, (fastpath.prepare(res, self.redactor) if self._fast else res)
        return rseq, self._decoded(rseq, payload, res)

    def _fetch(self, seq: int) -> tuple[int, DecodeResult | bytes] | None:
        """The first record at or after ``seq``: from memory, else re-read from the spool; None
        when none is durable yet (or every one left is unreadable)."""
        with self._cv:
            res = self._mem.pop(seq, None)
            self._mem_bytes -= self._mem_cost.pop(seq, 0)
        if res is not None:
            return seq, res
        if seq > self.spool.last_seq:
            return None
        recs = self.spool.read_from(seq, max_records=1)
        return recs[0] if recs else None

    def _advance(self, seq: int) -> None:
        """Mark every record up to ``seq`` as processed by the worker."""
        with self._cv:
            if seq >= self._next_seq:
                self._next_seq = seq + 1
            self._mem.pop(seq, None)  # cached by an accept racing the spool re-read
            self._mem_bytes -= self._mem_cost.pop(seq, 0)
            self._cv.notify_all()

    def _work_batch(self) -> bool:
        """:meth:`_work_once` with the cyclic GC off for its duration (up to 8 192 spans): the
        batch's objects all live until it is stored, so collecting meanwhile only re-traverses
        them; the first allocation after the batch collects once. This cut the GC share of the
        worker from ~15-20 to ~4 us per span (bench/bench_worker.py). The GC is never off while
        the worker waits."""
        with gc_paused():
            return self._work_once()

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            try:
                did = self._work_batch()
            except Exception:  # noqa: BLE001 - a stage boundary: log, keep running
                log.exception("worker iteration failed")
                did = False
                self._stop.wait(_STORE_RETRY_S)
            if did:
                continue
            with self._cv:
                want = self._flush_req
                flushing = want != self._flush_done and self._queue_empty()
            if flushing:  # finalize outside the lock: the store may be slow or down
                try:
                    ok = self._finalize_all()
                except Exception:  # noqa: BLE001
                    log.exception("flush failed")
                    ok = False
                with self._cv:
                    if ok:
                        self._flush_done = max(self._flush_done, want)
                    self._cv.notify_all()
                if ok:
                    continue
            with self._cv:
                if not self._stop.is_set():
                    self._cv.wait(timeout=0.2)

    def _queue_empty(self) -> bool:
        return self._next_seq > self.spool.last_seq

    def _impaired(self) -> None:
        """The store failed or refused a record: ``max_backlog_s`` stops refusing until it works."""
        if self._impaired_since is None:
            self._impaired_since = time.monotonic()

    def _note_recovery(self) -> None:
        """After a pass of the worker: once the store writes again and no record or trial is
        being retried, the bound applies again; what a failure of at least ``max_backlog_s``
        left behind drains exempt (a brief blip exempts nothing)."""
        if self._impaired_since is None:
            return
        committed = self.spool.committed_seq
        if (self._store_failing or self._pending_trials or self._next_seq <= self._single_until
                or any(q > committed for q in self._strikes)):
            return
        lasted = time.monotonic() - self._impaired_since
        self._impaired_since = None
        bound = self.settings.max_backlog_s
        if bound is not None and lasted >= bound:
            self._backlog_from = max(self._backlog_from, self.spool.last_seq)
            self._exempt_done_ns = None

    def _store_error(self, e: Exception) -> None:
        """A retryable store failure: back off 0.5 s, 1 s, 2 s, … up to ``store_retry_max_s``."""
        self._impaired()
        self.stats.store_errors += 1
        self._last_error = str(e)
        self._store_failing = True
        self._failures += 1
        delay = min(self.settings.store_retry_max_s, _STORE_RETRY_S * 2 ** min(self._failures - 1, 30))
        self._retry_at = time.monotonic() + delay
        with self._cv:
            self._cv.notify_all()  # a draining shutdown stops waiting

    def _store_ok(self) -> None:
        self._store_failing = False
        self._failures = 0
        self._last_error = None

    def _work_once(self) -> bool:
        """Process at most one batch, finalize what is due, commit. True if a batch was stored."""
        if time.monotonic() < self._retry_at:
            return False  # the store failed a moment ago
        now = self.clock()
        if not self._restored and not self._restore_open(now):
            return False
        t_start = time.monotonic()
        # take several spool records and write their spans in one insert: ClickHouse inserts
        # cost ~2x more per span in batches of 512 than of 8192 (bench/README.md)
        batch: list[tuple[int, DecodeResult]] = []
        n_spans = 0
        single = self._next_seq <= self._single_until  # narrowing down an unstorable record
        while n_spans < _INSERT_BATCH_SPANS and len(batch) < (1 if single else 256) and not self._queue_empty():
            took = self._take()
            if took is None:
                break
            batch.append(took)
            n_spans += len(took[1].spans)
            with self._cv:  # tentative: reset below if the write fails
                self._next_seq = max(self._next_seq, took[0] + 1)
        self._backlogged = (n_spans >= _INSERT_BATCH_SPANS or len(batch) >= 256) and not self._queue_empty()
        did = False
        if batch:
            prepared = self._fast and all(fastpath.is_prepared(res) for _, res in batch)
            if prepared:  # redacted and normalized by fastpath.decode_record
                per_record = [(seq, res.spans) for seq, res in batch]
            else:
                per_record = [(seq, [self.redactor.apply(s) for s in res.spans]) for seq, res in batch]
            try:
                # one lookup for the whole batch (not per record): replay after a restart ran at a
                # fifth of the live rate with two FINAL queries per record
                prior, asked = self._rehydrate([s for _, spans in per_record for s in spans])
                if prepared:
                    cols = batch[0][1].columns if len(batch) == 1 else _concat([r.columns for _, r in batch])
                    self.store.insert_span_columns(cols)
                else:
                    self.store.insert_spans([s for _, spans in per_record for s in spans])
            except (StoreUnavailable, StoreRejected) as e:
                # retry later from the spool, which still holds them (memory stays bounded)
                with self._cv:
                    self._next_seq = batch[0][0]
                if isinstance(e, StoreRejected):  # a data error: find the record, retry, quarantine
                    self._unstorable(batch, e)
                else:  # down, or refusing for a passing reason: back off and retry, never drop
                    self._store_error(e)
                return False
            self._store_ok()
            self.stats.stored += n_spans
            for seq, _ in batch:
                self._strikes.pop(seq, None)
            if self.redactor.active:
                for _, spans in per_record:
                    for s in spans:
                        if "redacted" in s.flags:
                            self.stats.redacted["redacted"] += 1
                            if "redacted_identity" in s.flags:
                                self.stats.redacted["redacted_identity"] += 1
            self.stats.store_write_seconds.append(self.store.last_write_s)
            if prior:  # stored spans of these traces (committed records), so they are assembled whole
                self.builder.add(((s, normalize(s)) for s in prior), now)
            self._rehydrated |= asked
            for (seq, spans), (_, res) in zip(per_record, batch):
                sems = res.semantics if prepared else (normalize(s) for s in spans)
                new = self.builder.add(zip(spans, sems), now, res.ahead if prepared else None)
                self.stats.deduplicated += len(spans) - new
                self._advance(seq)
            if self._rehydrated and self._next_seq > self._replay_until:
                self._rehydrated = set()  # replay done
            did = True
        finalized = self.builder.poll(now)
        stored = self._emit(finalized)
        self._commit_spool(state=bool(finalized))
        self._open_traces = self.builder.open_traces
        self._note_recovery()
        if did and (n_spans >= _INSERT_BATCH_SPANS or len(batch) >= 256):  # a full batch, as when behind
            per = (time.monotonic() - t_start) / len(batch)  # decode to commit: what backlog_s multiplies
            old = self._s_per_record
            self._s_per_record = per if old is None else old + _RATE_ALPHA * (per - old)
        return did and stored

    def _unstorable(self, batch: list[tuple[int, DecodeResult]], err: StoreRejected) -> None:
        """An insert was refused with a data error (:class:`StoreRejected`). Narrow down by writing
        one record at a time; a single record refused so for ``quarantine_after_s`` and at least
        ``_MIN_STRIKES`` attempts (backoff between them) is quarantined — kept durably in
        ``<spool dir>.quarantine/`` for ``relyscope quarantine list|replay``, its spans counted
        rejected as ``unstorable`` — so that it cannot block every record behind it forever.
        A retryable error in between does not reset the count; any stored write does (the
        record was not the culprit)."""
        self._impaired()
        self.stats.store_errors += 1
        self._last_error = str(err)
        if len(batch) > 1:
            self._single_until = batch[-1][0]
            self._retry_at = 0.0  # not an outage: narrow down at once
            return
        seq, res = batch[0]
        now = time.monotonic()
        first, n = self._strikes.get(seq, (now, 0))
        n += 1
        self._strikes[seq] = (first, n)
        if n < _MIN_STRIKES or now - first < self.settings.quarantine_after_s:
            self._retry_at = now + min(self.settings.store_retry_max_s, _STORE_RETRY_S * 2 ** (n - 1))
            return
        del self._strikes[seq]
        self._retry_at = 0.0
        recs = self.spool.read_from(seq, max_records=1)
        if recs and recs[0][0] == seq:  # OSError propagates: the record stays, retried next pass
            quarantine.put(self.quarantine_dir, seq, recs[0][1], spans=len(res.spans), error=str(err),
                           code=err.code)
        n_spans = len(res.spans)
        self.stats.rejected["unstorable"] += n_spans
        log.error("spool record %d (%d spans) cannot be stored; quarantined in %s: %s",
                  seq, n_spans, self.quarantine_dir, err)
        self._advance(seq)

    def _rehydrate(self, spans: list[CanonicalSpan]) -> tuple[list[CanonicalSpan], set[str]]:
        """The stored spans of these spans' traces that the builder has no state for — after a
        restart (a replayed record, or a late span of a trace finalized before the restart), or
        of a finalized trace evicted from the builder — so a trace is always assembled whole; and
        declares the trials already stored for them so superseded ones get tombstones. One
        primary-key lookup per batch; the loads only for traces the store holds.
        Raises StoreUnavailable."""
        if not spans:
            return [], set()
        ask = {s.trace_id for s in spans} - self._rehydrated
        ask = {t for t in ask if not self.builder.knows(t)}
        if ask:
            ask = self.store.traces_present(ask)  # fresh traces: nothing stored, nothing to load
        if not ask:
            return [], set()
        for t in self.store.load_trials(trace_ids=ask):
            self.builder.remember_emitted(t.trace_id, [t])
        have = {s.key for s in spans}
        return [s for s in self.store.load_spans(ask) if s.key not in have], ask

    def _emit(self, trials: list[Trial]) -> bool:
        """Store finalized trials (with any earlier ones the store refused). False while the store
        refuses them; they are kept and retried, and their traces' records stay uncommitted.
        A trial ending after the wall clock is first placed on it (:mod:`relyscope.trajectory.clock`)."""
        trials, ahead = place_on_clock(trials, time.time_ns(), self.settings.max_clock_ahead_s)
        self.stats.trials_clock_ahead += ahead
        self._pending_trials.extend(trials)
        if not self._pending_trials:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            self.store.insert_trials(self._pending_trials)
        except StoreUnavailable as e:
            self._store_error(e)
            return False
        except StoreRejected:
            if not self._emit_one_by_one():
                return False
        self._store_ok()
        stored, self._pending_trials = self._pending_trials, []
        if self._trial_strikes:
            for t in stored:
                self._trial_strikes.pop(t.trial_id, None)
        self.stats.trials_finalized += len(stored)
        self.scoring.trials_stored(stored)
        return True

    def _emit_one_by_one(self) -> bool:
        """After a data error on a batch of trials: write them one at a time; a trial refused with
        a data error for ``quarantine_after_s`` (and ``_MIN_STRIKES`` attempts) is dropped and
        counted (``trials_unstorable``) — its spans are stored, so nothing acknowledged is lost.
        True when every pending trial is stored or dropped (``_pending_trials`` then holds the
        stored ones), False to retry later."""
        kept: list[Trial] = []
        ok = True
        now = time.monotonic()
        for t in self._pending_trials:
            try:
                self.store.insert_trials([t])
                kept.append(t)
                self._trial_strikes.pop(t.trial_id, None)  # stored: its earlier refusals are over
            except StoreUnavailable as e:
                self._store_error(e)
                return False
            except StoreRejected as e:
                first, n = self._trial_strikes.get(t.trial_id, (now, 0))
                n += 1
                if n >= _MIN_STRIKES and now - first >= self.settings.quarantine_after_s:
                    self._trial_strikes.pop(t.trial_id, None)
                    self.stats.rejected["trials_unstorable"] += 1
                    log.error("trial %s cannot be stored; dropped (its spans are stored): %s", t.trial_id, e)
                    continue
                self._trial_strikes[t.trial_id] = (first, n)
                self._impaired()
                self.stats.store_errors += 1
                self._last_error = str(e)
                self._retry_at = now + min(self.settings.store_retry_max_s, _STORE_RETRY_S * 2 ** (n - 1))
                ok = False
        if not ok:  # keep the stored ones too: re-writing them is harmless (ReplacingMergeTree)
            return False
        self._pending_trials = kept
        return True

    def _commit_spool(self, *, state: bool = False) -> None:
        """Commit every record the worker has stored (or quarantined), whatever the state of its
        traces, so that an open trace (a rootless one waits ``root_timeout_s``) never pins the
        spool. What such a trace needs after a crash is in the store already; the ids of the
        traces still open — or finalized with a trial not yet stored — are written durably first
        (spool state ``open_traces.json``) and reloaded from the store on the next start
        (:meth:`_restore_open`). ``state``: traces were finalized since (a poll that finalized,
        a flush, the stop): rewrite that list even when no record is left to commit, or the
        traces finalized since would be reloaded and finalized again at every start."""
        with self._cv:
            upto = self._next_seq - 1
        if upto <= self.spool.committed_seq and not state:
            return
        open_ids = frozenset(self.builder.open_trace_ids() | {t.trace_id for t in self._pending_trials})
        if open_ids != self._persisted_open:  # OSError: nothing committed, retried on the next pass
            self.spool.write_state(_OPEN_STATE, json.dumps(sorted(open_ids)).encode())
            self._persisted_open = open_ids
        if upto > self.spool.committed_seq:
            self.spool.commit(upto)

    def _restore_open(self, now: float) -> bool:
        """Once, before the first batch: reload from the store the traces that were open when the
        previous run stopped (their spool records are committed), with the trials already stored
        for them, so they are finalized as if there had been no restart. False (and backoff) while
        the store fails."""
        raw = self.spool.read_state(_OPEN_STATE)
        try:
            ids = sorted(json.loads(raw)) if raw else []
        except ValueError:
            log.error("unreadable %s in the spool: open traces of the previous run are not reloaded", _OPEN_STATE)
            ids = []
        try:
            for i in range(0, len(ids), 1000):
                chunk = [t for t in ids[i:i + 1000] if not self.builder.knows(t)]
                for t in self.store.load_trials(trace_ids=chunk):
                    self.builder.remember_emitted(t.trace_id, [t])
                self.builder.add(((s, normalize(s)) for s in self.store.load_spans(chunk)), now)
        except StoreUnavailable as e:
            self._store_error(e)
            return False
        if ids:
            log.info("reloaded %d open traces of the previous run from the store", len(ids))
        self._restored = True
        self._persisted_open = frozenset(ids)
        return True

    def _finalize_all(self) -> bool:
        stored = self._emit(self.builder.flush(self.clock()))
        self._commit_spool(state=True)
        self._open_traces = self.builder.open_traces
        return stored

    # ---- flush / scoring ------------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0, *, finalize: bool = True) -> bool:
        """Wait until everything accepted so far is stored; with ``finalize`` also finalize every
        open trace now (no grace wait), store the trials and rescore. Returns False on timeout
        (e.g. while the store is down)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            if not finalize:
                while not self._queue_empty():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cv.wait(timeout=remaining)
                return True
            self._flush_req += 1
            want = self._flush_req
            self._cv.notify_all()
            while self._flush_done < want:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cv.wait(timeout=remaining)
        self.rescore(all_groups=True)
        return True

    def _score_loop(self) -> None:
        self.scoring.run()

    @property
    def scores(self) -> dict[GroupKey, GroupScore]:
        """The latest published scores per group (see :class:`relyscope.scoring.ScoreStage`)."""
        return self.scoring.scores

    def load_trials(self, **filters) -> list[Trial]:
        """Trials from the store with their outcomes resolved (metrics.md §6). Filters as
        :meth:`relyscope.store.Store.load_trials`."""
        return self.scoring.load_trials(**filters)

    def report_extras(self, scores: dict, window: str | None = None) -> dict:
        """Per-group additions to the report (violations, attribution, worst tasks, outcome
        counts, notes), each group's with ``sections_scope``: what its sections cover.

        ``window`` (a name of ``scoring.windows``): for a sliding window the sections of a live
        group are rebuilt from its trials that ended in that window (the window's start as the
        metrics align it, :func:`relyscope.scoring.rollup.window_start`; at most the
        ``_REVIEW_RECENT`` most recently stored) — one store read per group per request, never
        per cycle. ``None``, ``all``, offline imports and pooled ``other`` groups keep the
        sections the scorer keeps (all time, over the most recently stored trials); so does a
        group whose window read fails (store down), labelled so."""
        from relyscope.scorers.review import policy_for, review_group
        from relyscope.scoring.rollup import window_start
        from relyscope.scoring.stage import _REVIEW_RECENT

        out = self.scoring.report_extras(scores)
        length = dict(self.scoring.windows).get(window) if window else None
        for g, gs in scores.items():
            ex = out.setdefault(g, {})
            recent = (f", the most recent {_REVIEW_RECENT} trials" if g[2] != "offline"
                      and getattr(gs, "trials", 0) > _REVIEW_RECENT else "")
            ex["sections_scope"] = f"all time{recent}"
            if length is None or g[2] == "offline" or "folded_label_sets" in ex:
                continue
            since = window_start(time.time(), length) * 10**9
            try:
                trials = self.store.load_trials(agent=g[0], version=g[1], run_kind=g[2], since_ns=since,
                                                most_recent=_REVIEW_RECENT)
                trials = self.scoring.rollup().resolve(trials) if self.settings.incremental_scoring \
                    else self.scoring.load_trials(agent=g[0], version=g[1], run_kind=g[2], since_ns=since)
            except StoreUnavailable:
                ex["sections_scope"] = "all time (the window's trials could not be read: store unavailable)"
                continue
            ex.update(review_group(trials, policy_for(self.policy, g[0])).extras)
            ex["sections_scope"] = f"window {window}" + (
                f", the most recent {_REVIEW_RECENT} trials" if len(trials) >= _REVIEW_RECENT else "")
        return {g: ex for g, ex in out.items() if ex}

    def rescore(self, *, all_groups: bool = False) -> dict[GroupKey, GroupScore]:
        """Recompute scores of changed groups (or all) from the store; store and publish them."""
        return self.scoring.rescore(all_groups=all_groups)


def _ahead_of(fn: Callable[[bytes], DecodeResult]) -> Callable[[bytes], DecodeResult]:
    """The decode a decode process runs: the hot path's also assembles the traces a record holds
    whole (``ahead=True``: work the worker thread, the sidecar's serial stage, then skips; bench
    README "assembled ahead"); any other decode unchanged."""
    if isinstance(fn, functools.partial) and fn.func is fastpath.decode_record:
        return functools.partial(fn, ahead=True)
    return fn


def _concat(parts: list) -> "SpanColumns":
    out = SpanColumns()
    for p in parts:
        out.extend(p)
    return out


_KIND_CODE = {"Unspecified": 0, "Internal": 1, "Server": 2, "Client": 3, "Producer": 4, "Consumer": 5}
_STATUS_CODE = {"Unset": 0, "Ok": 1, "Error": 2}


def default_spool_dir(dsn: str) -> str:
    """The spool directory when none is set: ``<store dir>/../spool`` for an embedded store on
    disk, else ``./.relyscope/spool``. ``dsn`` as resolved by :func:`relyscope.store.resolve_dsn`."""
    if dsn.startswith("chdb://") and not dsn.startswith("chdb://memory"):
        return os.path.join(os.path.dirname(dsn[len("chdb://"):].rstrip("/")), "spool")
    return os.path.abspath(os.path.join(".relyscope", "spool"))
