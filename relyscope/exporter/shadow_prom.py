"""Prometheus families of shadow replays and release gates (built at scrape time):

- ``relyscope_shadow_decisions_total{decision}`` — sample decisions (sampled, sampled_out,
  not_replayable, over_cap, manual) made by this process;
- ``relyscope_shadow_replays_scheduled_total{family}`` — replays planned, by perturbation family;
- ``relyscope_shadow_replays_total{status}`` — replays finished, by status (completed, failed,
  sandbox_miss, error, timeout, cancelled): each replay counted once;
- ``relyscope_shadow_replays_running`` — replays in flight;
- ``relyscope_shadow_proxy_calls_total{match}`` — tool-proxy answers by match (exact, position,
  live, sandbox_miss, none);
- ``relyscope_shadow_faults_injected_total{type}``;
- ``relyscope_shadow_side_effects_recorded_total{side_effect}`` — side-effecting calls recorded
  and never executed;
- ``relyscope_shadow_paused`` (0/1);
- ``relyscope_gate_verdict{agent,baseline,candidate,mode,verdict}`` — 1 for the verdict of the
  latest gate evaluation of each comparison under the sidecar's configured gate policy (pass,
  block, inconclusive, error), 0 for the others; what-if runs under another request policy are
  not exported (``relyscope.exporter.shadow_api``);
- ``relyscope_gate_delta{agent,baseline,candidate,mode,metric}`` (+ ``_ci_low`` / ``_ci_high``) —
  candidate − baseline of each gated metric.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from relyscope.pipeline import Pipeline

__all__ = ["ShadowCollector"]

_VERDICTS = ("pass", "block", "inconclusive", "error")
_KNOWN = {
    "decisions": ("sampled", "sampled_out", "not_replayable", "over_cap", "manual"),
    "scheduled": ("nominal", "prompt", "fault", "env"),
    "replays": ("completed", "failed", "sandbox_miss", "error", "timeout", "cancelled"),
    "proxy": ("exact", "position", "live", "sandbox_miss"),
    "faults": ("timeout", "http_500", "rate_limit", "network_error", "partial_response", "invalid_response",
               "empty_response"),
    "side_effects_recorded": ("write", "irreversible"),
}


class ShadowCollector(Collector):
    def __init__(self, pipeline: "Pipeline"):
        self.p = pipeline

    def collect(self):
        st = getattr(self.p, "shadow", None)
        if st is not None:
            for name, key, label, help_ in (
                ("relyscope_shadow_decisions", "decisions", "decision", "Shadow sample decisions, by decision"),
                ("relyscope_shadow_replays_scheduled", "scheduled", "family", "Shadow replays planned, by family"),
                ("relyscope_shadow_replays", "replays", "status", "Shadow replays finished, by status"),
                ("relyscope_shadow_proxy_calls", "proxy", "match", "Tool-proxy answers, by match"),
                ("relyscope_shadow_faults_injected", "faults", "type", "Faults injected into replays, by type"),
                ("relyscope_shadow_side_effects_recorded", "side_effects_recorded", "side_effect",
                 "Side-effecting tool calls of replays recorded and never executed"),
            ):
                fam = CounterMetricFamily(name, help_, labels=[label])
                # known label values start at 0, so rate() and alert rules see them from the start
                counts = {**dict.fromkeys(_KNOWN.get(key, ()), 0), **st.counts[key]}
                for k, v in sorted(counts.items()):
                    fam.add_metric([str(k)], v)
                yield fam
            yield GaugeMetricFamily("relyscope_shadow_replays_running", "Shadow replays in flight", value=len(st.running))
            yield GaugeMetricFamily("relyscope_shadow_paused", "1 while shadow sampling and dispatch are paused",
                                    value=1.0 if st.paused else 0.0)
        labels = ["agent", "baseline", "candidate", "mode"]
        verdict = GaugeMetricFamily("relyscope_gate_verdict", "Latest release-gate verdict (1 = this verdict)",
                                    labels=labels + ["verdict"])
        delta = GaugeMetricFamily("relyscope_gate_delta", "Gated metric, candidate − baseline", labels=labels + ["metric"])
        lo = GaugeMetricFamily("relyscope_gate_delta_ci_low", "Lower 95% bound of the gated delta", labels=labels + ["metric"])
        hi = GaugeMetricFamily("relyscope_gate_delta_ci_high", "Upper 95% bound of the gated delta", labels=labels + ["metric"])
        gates = getattr(self.p, "gate_results", {})
        if hasattr(gates, "load"):
            gates.load()  # no-op once loaded; retried here while the store was down at start
        for key, res in sorted(gates.items()):
            lv = list(key)
            for v in _VERDICTS:
                verdict.add_metric(lv + [v], 1.0 if res.verdict == v else 0.0)
            for metric, d in sorted(res.deltas.items()):
                if d.delta is None or math.isnan(d.delta):
                    continue
                delta.add_metric(lv + [metric], float(d.delta))
                if d.ci is not None and not any(math.isnan(c) for c in d.ci):
                    lo.add_metric(lv + [metric], float(d.ci[0]))
                    hi.add_metric(lv + [metric], float(d.ci[1]))
        yield from (verdict, delta, lo, hi)
