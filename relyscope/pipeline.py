"""The sidecar's data path, wired once: receive → spool → normalize → assemble → store → score.

``Pipeline.accept`` is called by both OTLP receivers. It decodes and validates the request (reply
details for partial success), appends the request body to the durable spool, and only then
returns — so an acknowledged span is on disk. One worker thread takes batches in spool order,
normalizes the spans, stores them, feeds the trajectory builder, stores finalized trials, and
commits the spool up to the last record whose traces are all finalized. On start, whatever the spool
still holds is replayed; duplicates are harmless (spans and trials are keyed, ReplacingMergeTree).

A scorer thread recomputes the scores of groups (agent, version, run kind) whose trials changed,
every ``score_interval_s``, stores them and hands them to the gauges.

Errors: :class:`Backpressure` (retryable: spool full) and
:class:`relyscope.collector.otlp.OTLPRequestError` (permanent: the request is unusable) are raised to
the receivers, which map them to OTLP status codes.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from relyscope.collector import redaction
from relyscope.collector.normalize import normalize
from relyscope.collector.otlp import DecodeResult, Limits, OTLPRequestError, decode_http
from relyscope.collector.otlp import _decompress as decompress  # TODO: public name
from relyscope.collector.spool import Spool, SpoolFull
from relyscope.config import Settings
from relyscope.model import Trial
from relyscope.scorers.profile import GroupScore, score_group
from relyscope.store import Store, StoreUnavailable

__all__ = ["Pipeline", "Backpressure", "Stats", "GroupKey"]

log = logging.getLogger("relyscope.pipeline")

GroupKey = tuple[str, str, str]  # (agent, version, run_kind)

# spool record: 1 tag byte + body. The tag says how to decode it again on replay.
_TAG_PROTO = b"P"
_TAG_JSON = b"J"


class Backpressure(Exception):
    """Retryable: the spool is full. Receivers answer RESOURCE_EXHAUSTED / 503 + Retry-After."""

    retry_after_s = 5


@dataclass
class Stats:
    """Self-observability counters (exported on /metrics)."""

    received: int = 0
    accepted: int = 0
    rejected: collections.Counter = field(default_factory=collections.Counter)
    warnings: collections.Counter = field(default_factory=collections.Counter)
    deduplicated: int = 0
    requests: collections.Counter = field(default_factory=collections.Counter)  # by outcome
    trials_finalized: int = 0
    store_errors: int = 0
    store_write_seconds: list = field(default_factory=list)  # recent samples, drained by exporter
    backpressure: int = 0


def reason_of(message: str) -> str:
    """Bounded reject-reason label from a decoder message (for ``rejected_total{reason}``)."""
    m = message.lower()
    for key, label in (("traceid", "invalid_trace_id"), ("trace id", "invalid_trace_id"),
                       ("trace_id", "invalid_trace_id"), ("spanid", "invalid_span_id"),
                       ("span id", "invalid_span_id"), ("span_id", "invalid_span_id"),
                       ("internal", "internal")):
        if key in m:
            return label
    return "invalid_span"


class Pipeline:
    """Owns the spool, the worker and scorer threads, the trajectory builder and the latest scores.

    Thread-safety: ``accept`` is safe from any thread (receivers call it concurrently); the builder
    is touched only by the worker thread.
    """

    def __init__(self, settings: Settings, store: Store, *, clock: Callable[[], float] = time.monotonic):
        from relyscope.trajectory import TrajectoryBuilder

        self.settings = settings
        self.store = store
        self.clock = clock
        self.limits = Limits(max_body_bytes=settings.max_body_bytes,
                             max_attributes=settings.max_attributes,
                             max_attribute_length=settings.max_attribute_length)
        self.redactor = redaction.Redactor(settings.redact_deny, settings.redact_patterns)
        spool_dir = settings.spool_dir or _default_spool_dir(store.dsn)
        self.spool = Spool(spool_dir, max_bytes=settings.spool_max_bytes)
        self.builder = TrajectoryBuilder(grace_s=settings.grace_period_s,
                                         root_timeout_s=settings.root_timeout_s)
        self.stats = Stats()
        self.scores: dict[GroupKey, GroupScore] = {}
        self._dirty_groups: set[GroupKey] = set()
        self._cv = threading.Condition()
        self._mem: collections.OrderedDict[int, DecodeResult] = collections.OrderedDict()
        self._next_seq: int | None = None  # next spool sequence the worker processes
        self._record_traces: collections.deque[tuple[int, set[str]]] = collections.deque()
        self._stop = threading.Event()
        self._flush_req = 0
        self._flush_done = 0
        self._threads: list[threading.Thread] = []
        self._score_lock = threading.Lock()
        self._last_error: str | None = None
        self.ready = False
        self._open_traces = 0
        self._extras: dict[GroupKey, dict] = {}

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Replay the spool, then start the worker and scorer threads."""
        if self.spool.pending_records:
            log.info("replaying %d spooled batches", self.spool.pending_records)
            self._next_seq = self.spool.committed_seq + 1
        for target, name in ((self._work_loop, "relyscope-worker"), (self._score_loop, "relyscope-scorer")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.ready = True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop threads after draining what is queued; close the spool. Idempotent."""
        if self._stop.is_set():
            return
        try:
            self.flush(timeout_s=timeout_s, finalize=False)
        except Exception:  # noqa: BLE001 - shutting down anyway; the spool keeps the data
            log.exception("flush at shutdown failed")
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout_s)
        self.spool.close()

    @property
    def queue_depth(self) -> int:
        """Spooled batches not yet processed by the worker."""
        nxt = self._next_seq
        return 0 if nxt is None else max(0, self.spool.last_seq - nxt + 1)

    @property
    def open_traces(self) -> int:
        """Traces buffered and not yet finalized (as of the worker's last pass)."""
        return self._open_traces

    # ---- receiving ------------------------------------------------------------------------------
    def accept(self, body: bytes, content_type: str | None, content_encoding: str | None = None) -> DecodeResult:
        """Decode, validate and durably spool one OTLP/HTTP or OTLP/gRPC (protobuf) request.

        Returns the decode result (rejected spans and reasons for the partial-success reply).
        Raises OTLPRequestError (permanent) or Backpressure (retryable). Safe from any thread.
        """
        body = decompress(body, content_encoding, self.limits)
        result = decode_http(body, content_type, None, self.limits)
        n_total = len(result.spans) + result.rejected
        self.stats.received += n_total
        for msg in result.errors:
            self.stats.rejected[reason_of(msg)] += 1
        self.stats.warnings.update(result.warnings)
        if not result.spans:
            return result
        is_json = (content_type or "").split(";")[0].strip().lower() == "application/json"
        # spool the decompressed body, so replay needs no decompression
        payload = (_TAG_JSON if is_json else _TAG_PROTO) + body
        with self._cv:
            try:
                seq = self.spool.append(payload)
            except SpoolFull:
                self.stats.backpressure += 1
                raise Backpressure("spool full") from None
            if self._next_seq is None:
                self._next_seq = seq
            if len(self._mem) < self.settings.queue_max_batches:
                self._mem[seq] = result
            self.stats.accepted += len(result.spans)
            self._cv.notify_all()
        return result

    # ---- worker ---------------------------------------------------------------------------------
    def _take(self) -> tuple[int, DecodeResult] | None:
        """Next batch in spool order, from memory or re-read from the spool."""
        with self._cv:
            seq = self._next_seq
            if seq is None:
                return None
            res = self._mem.pop(seq, None)
            if res is not None:
                return seq, res
        recs = self.spool.read_from(seq, max_records=1)
        if not recs:
            return None
        rseq, payload = recs[0]
        tag, body = payload[:1], payload[1:]
        try:
            res = decode_http(body, "application/json" if tag == _TAG_JSON else "application/x-protobuf",
                              None, self.limits)
        except OTLPRequestError:
            res = DecodeResult(spans=[], rejected=0, errors=[], warnings=collections.Counter())
        with self._cv:
            self._mem.pop(rseq, None)
        return rseq, res

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            try:
                did = self._work_once()
            except Exception:  # noqa: BLE001 - a stage boundary: log, keep running
                log.exception("worker iteration failed")
                did = False
                time.sleep(0.5)
            if not did:
                with self._cv:
                    if self._flush_req != self._flush_done and self._queue_empty():
                        self._finalize_all()
                        self._flush_done = self._flush_req
                        self._cv.notify_all()
                        continue
                    self._cv.wait(timeout=0.2)

    def _queue_empty(self) -> bool:
        return self._next_seq is None or self._next_seq > self.spool.last_seq

    def _work_once(self) -> bool:
        now = self.clock()
        took = self._take() if not self._queue_empty() else None
        did = False
        if took is not None:
            seq, res = took
            spans = [self.redactor.apply(s) for s in res.spans]
            try:
                self.store.insert_spans(spans)
            except StoreUnavailable as e:
                self.stats.store_errors += 1
                self._last_error = str(e)
                with self._cv:
                    self._mem[seq] = res  # retry the same batch later; the spool still holds it
                    self._mem.move_to_end(seq, last=False)
                time.sleep(0.5)
                return False
            self.stats.store_write_seconds.append(self.store.last_write_s)
            new = self.builder.add(((s, normalize(s)) for s in spans), now)
            self.stats.deduplicated += len(spans) - new
            self._record_traces.append((seq, {s.trace_id for s in spans}))
            with self._cv:
                self._next_seq = seq + 1
            did = True
        self._emit(self.builder.poll(now))
        self._commit_spool()
        self._open_traces = self.builder.open_traces
        return did

    def _emit(self, trials: list[Trial]) -> None:
        if not trials:
            return
        while True:
            try:
                self.store.insert_trials(trials)
                break
            except StoreUnavailable as e:
                self.stats.store_errors += 1
                self._last_error = str(e)
                if self._stop.is_set():
                    return
                time.sleep(0.5)
        self.stats.trials_finalized += len(trials)
        with self._score_lock:
            self._dirty_groups.update((t.agent_name, t.agent_version, t.run_kind) for t in trials)

    def _commit_spool(self) -> None:
        """Commit spool records whose traces are all finalized (then a crash cannot lose them)."""
        open_ids = self.builder.open_trace_ids()
        last = None
        while self._record_traces and not (self._record_traces[0][1] & open_ids):
            last = self._record_traces.popleft()[0]
        if last is not None:
            self.spool.commit(last)

    def _finalize_all(self) -> None:
        self._emit(self.builder.flush(self.clock()))
        self._commit_spool()

    # ---- flush / scoring ------------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0, *, finalize: bool = True) -> bool:
        """Wait until everything accepted so far is stored; with ``finalize`` also finalize every
        open trace now (no grace wait) and rescore. Returns False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            if not finalize:
                while not self._queue_empty():
                    if not self._cv.wait(timeout=max(0.0, deadline - time.monotonic())):
                        if time.monotonic() >= deadline:
                            return False
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
        while not self._stop.wait(self.settings.score_interval_s):
            try:
                self.rescore()
            except Exception:  # noqa: BLE001
                log.exception("scoring failed")

    def report_extras(self, scores: dict) -> dict:
        """Per-group additions to the report (violations, attribution, worst tasks)."""
        return {g: self._extras[g] for g in scores if g in self._extras}

    def rescore(self, *, all_groups: bool = False) -> dict[GroupKey, GroupScore]:
        """Recompute scores of changed groups (or all) from the store; store and publish them."""
        with self._score_lock:
            groups = set(self._dirty_groups)
            self._dirty_groups.clear()
        trials = self.store.load_trials()
        by_group: dict[GroupKey, list[Trial]] = collections.defaultdict(list)
        for t in trials:
            by_group[(t.agent_name, t.agent_version, t.run_kind)].append(t)
        if all_groups:
            groups = set(by_group)
        rows = []
        for g in groups:
            if g not in by_group:
                continue
            gs = score_group(by_group[g], n_boot=self.settings.n_boot, seed=0)
            self.scores[g] = gs
            rows += score_rows(g, gs, by_group[g], n_boot=self.settings.n_boot)
        try:
            self.store.insert_scores(rows)
        except StoreUnavailable as e:
            self._last_error = str(e)
        return dict(self.scores)


def score_rows(group: GroupKey, gs: GroupScore, trials: list[Trial], *, n_boot: int) -> list[dict]:
    """Rows for the ``scores`` table (one per metric), each naming how it was made."""
    import json
    import math

    from relyscope.semconv import FORMULA_SET

    start = min((t.start_ns for t in trials), default=0) / 1e9
    end = max((t.end_ns for t in trials), default=0) / 1e9
    now = time.time()
    rows = []
    for metric, mv in gs.metrics.items():
        rows.append({
            "formula_set": FORMULA_SET, "agent": group[0], "version": group[1], "run_kind": group[2],
            "metric": metric, "value": None if math.isnan(mv.value) else mv.value,
            "ci_low": mv.ci[0] if mv.ci else None, "ci_high": mv.ci[1] if mv.ci else None,
            "n_tasks": mv.n_tasks, "n_trials": mv.n_trials, "window_start": start,
            "window_end": end, "n_boot": n_boot, "params": json.dumps({"ci": 0.95, "seed": 0}),
            "computed_at": now,
        })
    return rows


def _default_spool_dir(dsn: str) -> str:
    if dsn.startswith("chdb://") and not dsn.startswith("chdb://memory"):
        return os.path.join(os.path.dirname(dsn[len("chdb://"):].rstrip("/")), "spool")
    return os.path.abspath(os.path.join(".relyscope", "spool"))
