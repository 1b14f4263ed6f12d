"""The table a person reads: group title with its run kind, undefined values as —, extras."""

from __future__ import annotations

from rich.console import Console

from relyscope.cli.render import render_history, render_report


def _text(fn, *args) -> str:
    c = Console(record=True, width=200)
    fn(*args, c)
    return c.export_text()


def test_report_table_shows_run_kind_values_and_undefined_dash():
    rep = {"formula_set": "relyscope-v1", "groups": [{
        "agent": "a", "version": "1", "run_kind": "offline", "tasks": 2, "trials": 4, "invalid_trials": 0,
        "incomplete_trials": 0,
        "metrics": {"pass^1": {"value": 0.5, "ci": [0.25, 0.75], "n_tasks": 2},
                    "P_cal": {"value": None, "ci": None, "n_tasks": 0}},
        "calibration": [{"bin": "0.9–1.0", "trials": 2, "mean_confidence": 0.95, "success_rate": 0.5}],
        "violations": [{"rule": "r1", "type": "pii", "severity": "low", "attempted": 0, "committed": 1, "trials": 1}],
    }]}
    text = _text(render_report, rep)
    assert "a 1 [offline, window all] — 2 tasks, 4 trials" in text  # rich markup must not eat "[offline…]"
    assert "pass^1" in text and "0.5000" in text and "[0.250, 0.750]" in text
    line = next(ln for ln in text.splitlines() if "P_cal" in ln)
    assert "—" in line and "0.0000" not in line
    assert "r1" in text and "calibration" in text


def test_history_table():
    data = {"metric": "pass^1", "points": [
        {"agent": "a", "version": "1", "run_kind": "production", "time": 0.0, "value": 0.5, "ci": [0.4, 0.6], "n_tasks": 3},
        {"agent": "a", "version": "1", "run_kind": "production", "time": 60.0, "value": None, "ci": None, "n_tasks": 0}]}
    text = _text(render_history, data)
    assert "pass^1 over time — a 1 [production]" in text
    assert "1970-01-01 00:00:00" in text and "1970-01-01 00:01:00" in text
    assert "█" * 15 in text  # 0.5 of a 30-wide bar


def test_claim_outcome_mismatches_are_in_the_table():
    """The README says an agent's claims that contradict its outcome are "counted in the report":
    the JSON had ``claim_outcome_mismatches``, the table a person reads did not show it."""
    group = {"agent": "a", "version": "1", "run_kind": "production", "tasks": 1, "trials": 9, "metrics": {}}
    text = _text(render_report, {"groups": [{**group, "claim_outcome_mismatches": 23}]})
    assert "claim/outcome mismatches: 23 trials" in text
    assert "mismatch" not in _text(render_report, {"groups": [{**group, "claim_outcome_mismatches": 0}]})
