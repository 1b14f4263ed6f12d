"""A live window's intervals before its first bootstrap are shown as pending, not as undefined
(fresh-user trial: for ~15 s after scores first appeared every CI read "—", which the README says
means undefined, with no note)."""

from __future__ import annotations

import io
import math

from rich.console import Console

from relyscope.cli.render import render_report
from relyscope.exporter.report import build_report
from relyscope.scorers.profile import GroupScore, MetricValue
from relyscope.scoring.stage import _with_cis

KEY = ("agent-a", "1.0", "production")


def _point() -> GroupScore:
    return GroupScore(tasks=2, trials=4, invalid_trials=0, incomplete_trials=0,
                      metrics={"success_rate": MetricValue(0.75, None, 2, 4),
                               "P_brier": MetricValue(math.nan, None, 0, 0)})


def test_before_the_first_bootstrap_cis_are_pending_and_said_so():
    gs = _with_cis(_point(), None, n_boot=200)
    assert gs.ci_pending and gs.to_json()["bootstrap"]["ci_pending"] is True
    g = build_report({KEY: gs})["groups"][0]
    assert g["metrics"]["success_rate"] == {"value": 0.75, "ci": None, "n_tasks": 2, "ci_pending": True}
    assert "ci_pending" not in g["metrics"]["P_brier"]  # undefined stays undefined
    assert any("not computed yet" in n for n in g["notes"])
    buf = io.StringIO()
    render_report(build_report({KEY: gs}), Console(file=buf, width=200))
    row = [ln for ln in buf.getvalue().splitlines() if "success_rate" in ln][0]
    assert "pending" in row and "—" not in row


def test_after_a_bootstrap_or_without_one_nothing_is_pending():
    done = _with_cis(_point(), GroupScore(tasks=2, trials=4, invalid_trials=0, incomplete_trials=0,
                                          metrics={"success_rate": MetricValue(0.75, (0.5, 1.0), 2, 4)}),
                     n_boot=200)
    assert not done.ci_pending
    g = build_report({KEY: done})["groups"][0]
    assert g["metrics"]["success_rate"]["ci"] == [0.5, 1.0] and "ci_pending" not in g["metrics"]["success_rate"]
    assert not any("not computed yet" in n for n in g.get("notes", []))
    assert not _with_cis(_point(), None, n_boot=0).ci_pending  # no intervals asked for: none to wait for
