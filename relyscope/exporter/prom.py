"""Prometheus exposition from a private registry (prometheus-client custom collector).

Reliability gauges are built at scrape time from the latest group scores:

- ``relyscope_score{agent,version,run_kind,metric,k,window}`` — the metric value (0–1); ``metric``
  is the metrics.md §11 key (``pass^2``, ``C_out``, …), ``k`` the k of pass@k / pass^k (empty
  otherwise), ``window`` the sliding window it covers (``5m``, ``1h``, ``24h``, ``7d``, ``all`` by
  default: ``RELYSCOPE_SCORE_WINDOWS``; offline imports carry their all-time value in every window).
  Undefined (NaN) metrics are skipped, never exported as 0.
- ``relyscope_score_ci_low`` / ``relyscope_score_ci_high`` — 95 % task-clustered bootstrap bounds.
- ``relyscope_score_tasks`` — tasks the value is based on.
- ``relyscope_score_ci_age_seconds{agent,version,run_kind,window}`` — how much older the group's
  intervals are than its values (0: computed on the values' data; live windows refresh CIs only
  once ``RELYSCOPE_SCORE_CI_MIN_CHANGE`` of their trials changed, or after
  ``RELYSCOPE_SCORE_CI_MAX_AGE_S``).
- ``relyscope_group_trials{agent,version,run_kind,kind=valid|invalid|incomplete,window}``.
- ``relyscope_drift_delta{agent,version,run_kind,metric,k}`` (current − reference window, metrics.md
  §10), ``relyscope_drift_ci_low`` / ``_ci_high`` (its 95 % bootstrap CI) and ``relyscope_drift_flag``
  (1 = CI excludes 0 and |Δ| > ``RELYSCOPE_DRIFT_THRESHOLD``); live groups only.
- ``relyscope_label_sets_folded{run_kind}``: (agent, version) label sets beyond
  ``RELYSCOPE_MAX_LABEL_SETS`` (default 50), scored together under ``agent="other",version="other"``.
- ``relyscope_group_outcome_trials{agent,version,run_kind,outcome=success|failure|unknown}`` — trials
  by resolved outcome (from the report sections: the 5 000 most recently stored trials of a live group, all of an
  offline import); a group whose trials are all ``unknown`` has no success metrics.

Self-observability: ``relyscope_spans_{received,accepted,deduplicated}_total``,
``relyscope_spans_rejected_total{reason}``, ``relyscope_otlp_warnings_total{kind}``,
``relyscope_otlp_requests_refused_total{reason=unauthenticated}``,
``relyscope_spans_redacted_total{kind=redacted|redacted_identity}``, ``relyscope_spool_bytes``, ``relyscope_spool_max_bytes``, ``relyscope_spool_oldest_age_seconds``, ``relyscope_backlog_seconds``, ``relyscope_spool_pending_records``,
``relyscope_queue_depth``, ``relyscope_open_traces``, ``relyscope_trials_finalized_total``, ``relyscope_trials_clock_ahead_total``,
``relyscope_store_write_errors_total``, ``relyscope_decode_worker_restarts_total``,
``relyscope_decode_workers``,
``relyscope_store_write_seconds`` (histogram),
``relyscope_score_cycles_total``, ``relyscope_score_cycles_deferred_total``,
``relyscope_score_cycle_seconds`` (histogram), ``relyscope_scores_age_seconds``,
``relyscope_backpressure_total{reason=spool_full|inflight_budget|backlog}``, ``relyscope_quarantine_records``, ``relyscope_quarantine_bytes``,
``relyscope_finalized_traces_evicted_total``, ``relyscope_finalized_cache_bytes``,
``relyscope_open_traces_bytes``, ``relyscope_open_traces_finalized_early_total``,
``relyscope_traces_assembled_ahead_total``, ``relyscope_inflight_bytes``. No task, trial or trace id is ever a label.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from relyscope.pipeline import BACKPRESSURE_REASONS

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["build_registry"]


class _ReliabilityCollector(Collector):
    def __init__(self, pipeline: "Pipeline", write_hist: Histogram, cycle_hist: Histogram):
        self.p = pipeline
        self.hist = write_hist
        self.cycle_hist = cycle_hist

    def collect(self):
        p = self.p
        labels = ["agent", "version", "run_kind", "metric", "k", "window"]
        val = GaugeMetricFamily("relyscope_score", "Reliability metric value (metrics.md, formula set relyscope-v1)", labels=labels)
        lo = GaugeMetricFamily("relyscope_score_ci_low", "Lower bound of the 95% task-clustered bootstrap CI", labels=labels)
        hi = GaugeMetricFamily("relyscope_score_ci_high", "Upper bound of the 95% task-clustered bootstrap CI", labels=labels)
        nt = GaugeMetricFamily("relyscope_score_tasks", "Tasks the metric value is based on", labels=labels)
        tr = GaugeMetricFamily("relyscope_group_trials", "Trials per group",
                               labels=["agent", "version", "run_kind", "kind", "window"])
        age = GaugeMetricFamily("relyscope_score_ci_age_seconds", "Seconds since the data state the group's "
                                "CIs were computed on, when older than its values' (else 0)",
                                labels=["agent", "version", "run_kind", "window"])
        scoring = getattr(p, "scoring", None)
        by_window = getattr(scoring, "window_scores", None) or {getattr(scoring, "primary_window", "all"): p.scores}
        for window, scores in sorted(by_window.items()):
            self._group(window, scores, val, lo, hi, nt, tr)
            now = time.time()
            for (agent, version, run_kind), gs in sorted(scores.items()):
                as_of = getattr(gs, "ci_as_of", None)
                age.add_metric([agent, version, run_kind, window], 0.0 if as_of is None else max(0.0, now - as_of))
        oc = GaugeMetricFamily("relyscope_group_outcome_trials", "Trials per group by resolved outcome "
                               "(success, failure, unknown: unknown is counted, never dropped)",
                               labels=["agent", "version", "run_kind", "outcome"])
        for (agent, version, run_kind), ex in sorted(p.report_extras(p.scores).items()):
            for outcome, n in (ex.get("outcomes") or {}).items():
                oc.add_metric([agent, version, run_kind, outcome], n)
        yield from (val, lo, hi, nt, tr, age, oc)
        yield from self._drift(getattr(scoring, "drift", None) or {})
        folded = GaugeMetricFamily("relyscope_label_sets_folded", "(agent, version) label sets beyond "
                                   "RELYSCOPE_MAX_LABEL_SETS scored together as agent=version='other'",
                                   labels=["run_kind"])
        for run_kind, n in sorted((getattr(scoring, "folded", None) or {}).items()):
            folded.add_metric([run_kind], n)
        yield folded
        yield from self._self_metrics(p)

    @staticmethod
    def _drift(drift):
        labels = ["agent", "version", "run_kind", "metric", "k"]
        d = GaugeMetricFamily("relyscope_drift_delta", "Current minus reference window value of the metric "
                              "(metrics.md §10; default last 1h vs the 24h before)", labels=labels)
        lo = GaugeMetricFamily("relyscope_drift_ci_low", "Lower bound of the 95% task-clustered bootstrap CI of "
                               "the drift delta", labels=labels)
        hi = GaugeMetricFamily("relyscope_drift_ci_high", "Upper bound of the 95% CI of the drift delta", labels=labels)
        fl = GaugeMetricFamily("relyscope_drift_flag", "1 when the drift CI excludes 0 and |delta| exceeds "
                               "RELYSCOPE_DRIFT_THRESHOLD, else 0", labels=labels)
        for (agent, version, run_kind), per in sorted(drift.items()):
            for name, x in per.items():
                if math.isnan(x.delta):
                    continue
                k = name[5:] if name.startswith(("pass^", "pass@")) else ""
                lv = [agent, version, run_kind, name, k]
                d.add_metric(lv, x.delta)
                fl.add_metric(lv, 1.0 if x.flagged else 0.0)
                if x.ci is not None:
                    lo.add_metric(lv, x.ci[0])
                    hi.add_metric(lv, x.ci[1])
        yield from (d, lo, hi, fl)

    @staticmethod
    def _group(window, scores, val, lo, hi, nt, tr):
        for (agent, version, run_kind), gs in sorted(scores.items()):
            for name, mv in gs.metrics.items():
                if mv.value is None or math.isnan(mv.value):
                    continue
                k = name[5:] if name.startswith(("pass^", "pass@")) else ""
                lv = [agent, version, run_kind, name, k, window]
                val.add_metric(lv, float(mv.value))
                nt.add_metric(lv, mv.n_tasks)
                if mv.ci is not None and not any(math.isnan(c) for c in mv.ci):
                    lo.add_metric(lv, float(mv.ci[0]))
                    hi.add_metric(lv, float(mv.ci[1]))
            incomplete = getattr(gs, "incomplete_trials", 0)
            # kinds partition the trials (a trial both invalid and incomplete counts as invalid)
            tr.add_metric([agent, version, run_kind, "valid", window], gs.trials - gs.invalid_trials - incomplete)
            tr.add_metric([agent, version, run_kind, "invalid", window], gs.invalid_trials)
            tr.add_metric([agent, version, run_kind, "incomplete", window], incomplete)

    def _self_metrics(self, p):
        s = p.stats
        yield CounterMetricFamily("relyscope_spans_received", "Spans received over OTLP", value=s.received)
        yield CounterMetricFamily("relyscope_spans_accepted", "Spans accepted (durably spooled)", value=s.accepted)
        yield CounterMetricFamily("relyscope_spans_stored", "Spans written to the store (rows of otel_traces; "
                                  "a re-sent span again, the store keeps one)", value=s.stored)
        yield CounterMetricFamily("relyscope_spans_deduplicated", "Re-sent spans dropped as duplicates", value=s.deduplicated)
        yield CounterMetricFamily("relyscope_spans_replaced", "Spans that replaced an earlier, different span "
                                  "with the same (trace id, span id)", value=p.builder.replaced)
        rej = CounterMetricFamily("relyscope_spans_rejected", "Spans rejected, by reason", labels=["reason"])
        for reason, n in sorted(s.rejected.items()):
            rej.add_metric([reason], n)
        yield rej
        sig = getattr(self.p, "signal_counts", None)  # OTLP logs / metrics receivers
        if sig is not None:
            yield from sig.families()
        warn = CounterMetricFamily("relyscope_otlp_warnings", "Tolerated deviations and repairs, by kind", labels=["kind"])
        for kind, n in sorted(s.warnings.items()):
            warn.add_metric([kind], n)
        yield warn
        red = CounterMetricFamily("relyscope_spans_redacted", "Stored spans the redaction policy changed, by flag: "
                                  "redacted (any change), redacted_identity (an identity value's secret replaced "
                                  "by its keyed token)", labels=["kind"])
        for kind in ("redacted", "redacted_identity"):
            red.add_metric([kind], s.redacted.get(kind, 0))
        yield red
        refused = CounterMetricFamily("relyscope_otlp_requests_refused", "OTLP requests refused before their body "
                                      "was read, by reason: unauthenticated (missing or wrong bearer token)",
                                      labels=["reason"])
        for reason in ("unauthenticated",):  # 0 included: an alert's rate() sees the first refusal
            refused.add_metric([reason], s.requests_refused.get(reason, 0))
        yield refused
        yield CounterMetricFamily("relyscope_trials_finalized", "Trials finalized (incl. re-finalized)", value=s.trials_finalized)
        yield CounterMetricFamily("relyscope_trials_clock_ahead", "Finalized trials that ended more than "
                                  "RELYSCOPE_MAX_CLOCK_AHEAD_S after the sidecar's clock (the agent host's clock runs "
                                  "ahead): placed at their assembly time, flag clock_ahead",
                                  value=s.trials_clock_ahead)
        yield CounterMetricFamily("relyscope_store_write_errors", "Failed ClickHouse writes", value=s.store_errors)
        yield CounterMetricFamily("relyscope_decode_worker_restarts", "Decode worker pool restarts: a worker "
                                  "died, or gave no result within RELYSCOPE_DECODE_TIMEOUT_S (killed; the record "
                                  "was decoded in the worker thread)", value=getattr(p, "decode_restarts", 0))
        yield GaugeMetricFamily("relyscope_decode_workers", "Processes decoding spool records (1: the worker thread "
                                "decodes); RELYSCOPE_DECODE_WORKERS, auto resolved from the usable CPUs",
                                value=getattr(p, "decode_workers", 1))
        bp = CounterMetricFamily("relyscope_backpressure", "Requests refused with the retryable signal, by reason: "
                                 "spool_full (the durable spool is full), inflight_budget (the byte budget of requests "
                                 "being received is spent), backlog (storing is further behind than "
                                 "RELYSCOPE_MAX_BACKLOG_S)", labels=["reason"])
        for reason in BACKPRESSURE_REASONS:  # every reason, 0 included: rate() sees the first refusal
            bp.add_metric([reason], s.backpressure_by.get(reason, 0))
        yield bp
        yield GaugeMetricFamily("relyscope_spool_bytes", "Bytes in the durable spool", value=p.spool.bytes_used)
        yield GaugeMetricFamily("relyscope_spool_max_bytes", "Capacity of the durable spool", value=p.settings.spool_max_bytes)
        yield GaugeMetricFamily("relyscope_spool_pending_records", "Spool records not yet committed", value=p.spool.pending_records)
        yield GaugeMetricFamily("relyscope_spool_oldest_age_seconds", "Age of the oldest uncommitted spool record", value=p.spool.oldest_pending_age_s)
        yield GaugeMetricFamily("relyscope_backlog_seconds", "How far storing is behind receiving: the larger of the age "
                                "of the oldest spooled record not yet stored and the worker's estimated time for the "
                                "records waiting, without what a store outage or the start's replay left (what "
                                "RELYSCOPE_MAX_BACKLOG_S bounds)", value=p.backlog_s())
        yield GaugeMetricFamily("relyscope_queue_depth", "Spooled batches not yet processed", value=p.queue_depth)
        yield GaugeMetricFamily("relyscope_open_traces", "Traces buffered and not yet finalized", value=p.open_traces)
        yield GaugeMetricFamily("relyscope_open_traces_bytes", "Estimated memory of the open traces "
                                "(bounded by RELYSCOPE_OPEN_TRACES_MAX_BYTES)", value=p.builder.open_bytes)
        yield CounterMetricFamily("relyscope_open_traces_finalized_early", "Open traces finalized before their "
                                  "timeout because the open traces reached RELYSCOPE_OPEN_TRACES_MAX_BYTES",
                                  value=p.builder.finalized_early)
        yield CounterMetricFamily("relyscope_traces_assembled_ahead", "Trace finalizations that took the trials "
                                  "a decode process assembled (the trace was whole in one request); the others "
                                  "are assembled by the worker thread", value=p.builder.assembled_ahead)
        yield CounterMetricFamily("relyscope_finalized_traces_evicted", "Finalized traces evicted from the "
                                  "late-span cache (by age or by RELYSCOPE_FINALIZED_CACHE_BYTES)", value=p.builder.evicted)
        yield GaugeMetricFamily("relyscope_finalized_cache_bytes", "Estimated memory of the finalized traces kept "
                                "for late spans", value=p.builder.retained_bytes)
        yield GaugeMetricFamily("relyscope_inflight_bytes", "Request bytes the OTLP receivers hold now "
                                "(bounded by RELYSCOPE_MAX_INFLIGHT_BYTES)", value=p.inflight.used)
        q_records, q_bytes = p.quarantine_summary()
        yield GaugeMetricFamily("relyscope_quarantine_records", "Spool records the store refused as unstorable, "
                                "kept for `relyscope quarantine replay`", value=q_records)
        yield GaugeMetricFamily("relyscope_quarantine_bytes", "Bytes held in quarantine", value=q_bytes)
        # drain write-latency samples into the histogram
        _drain(s.store_write_seconds, self.hist)
        # exposed here, after the drain: registered on the registry itself, a histogram was
        # collected before this drain and showed each sample one scrape late
        yield from self.hist.collect()
        yield from self._scoring_metrics(p.scoring)

    def _scoring_metrics(self, sc):
        """How fresh the reliability gauges are: cycles done and postponed, their duration, the
        age of the published scores (absent before the first cycle: unknown, not 0)."""
        yield CounterMetricFamily("relyscope_score_cycles", "Scoring cycles completed (each publishes the "
                                  "reliability gauges)", value=sc.cycles_done)
        yield CounterMetricFamily("relyscope_score_cycles_deferred", "Scoring cycles postponed because the worker "
                                  "had a backlog of full batches (at most RELYSCOPE_SCORE_MAX_DEFER, default 5, in a "
                                  "row)", value=sc.deferred_cycles)
        age = GaugeMetricFamily("relyscope_scores_age_seconds", "Seconds since the last scoring cycle completed: "
                                "how old the relyscope_score gauges are (absent before the first cycle)")
        if sc.last_cycle_end is not None:
            age.add_metric([], max(0.0, time.time() - sc.last_cycle_end))
        yield age
        _drain(sc.cycle_seconds, self.cycle_hist)
        yield from self.cycle_hist.collect()


def _drain(q, hist: Histogram) -> None:
    """Move the samples queued so far into ``hist``. ``popleft`` is atomic: samples appended
    meanwhile are kept for the next scrape, and a concurrent scrape that emptied the queue first
    ends this one (``len`` then popping raised IndexError, a 500 on /metrics)."""
    for _ in range(len(q)):
        try:
            v = q.popleft()
        except IndexError:
            return
        hist.observe(v)


def build_registry(pipeline: "Pipeline") -> CollectorRegistry:
    """A private registry with the reliability collector, the write-latency and the scoring-cycle
    histograms."""
    reg = CollectorRegistry(auto_describe=False)
    # the histograms are exposed by the collector (after it drains the samples into them), not
    # registered on their own
    hist = Histogram("relyscope_store_write_seconds", "ClickHouse write latency (seconds)", registry=None,
                     buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
    cycle = Histogram("relyscope_score_cycle_seconds", "Duration of a scoring cycle (seconds): load, grade "
                      "and score what changed, publish", registry=None,
                      buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
    reg.register(_ReliabilityCollector(pipeline, hist, cycle))
    from relyscope.exporter.shadow_prom import ShadowCollector

    reg.register(ShadowCollector(pipeline))
    return reg
