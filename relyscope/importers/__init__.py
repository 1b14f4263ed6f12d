"""Importers: replay recorded agent runs from public benchmarks as relyscope-instrumented spans."""

from __future__ import annotations

from relyscope.importers.tau_bench import count_runs, replay_tau_bench

__all__ = ["count_runs", "replay_tau_bench"]
