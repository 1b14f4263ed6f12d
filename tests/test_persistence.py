"""Issue 5: per-trial grades and per-group scores are persisted with formula set, window and CI,
and re-scoring is idempotent. Runs the demo (a real sidecar on chDB), then reads its store."""

from __future__ import annotations

import json
import subprocess

from conftest import BIN

from relyscope.scorers.profile import metric_keys
from relyscope.store import Store


def test_demo_persists_scores_and_grades_idempotently(tmp_path):
    data = tmp_path / "demo"
    r = subprocess.run([str(BIN), "demo", "--format", "json", "--no-shadow", "--tasks", "8", "--data-dir", str(data)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)["groups"][0]
    st = Store(f"chdb://{data}/data")
    try:
        rows = st.query("SELECT metric, value, ci_low, ci_high, n_tasks, formula_set, window_start, "
                        "window_end, n_boot FROM {db}.scores FINAL")
        # the demo rescored several times (scorer thread + flush); FINAL keeps one row per metric
        metrics = [row[0] for row in rows]
        assert sorted(metrics) == sorted(metric_keys(5))
        assert len(metrics) == len(set(metrics))
        by = {row[0]: row for row in rows}
        assert {row[5] for row in rows} == {"relyscope-v1"}
        assert by["pass^1"][1] == report["metrics"]["pass^1"]["value"]
        assert [by["C_out"][2], by["C_out"][3]] == report["metrics"]["C_out"]["ci"]
        assert by["R_fault"][1] is None  # undefined stays NULL, never 0
        assert all(row[6] < row[7] for row in rows)  # a real window
        assert {row[8] for row in rows} == {2000}
        grades = st.query("SELECT trial_id, severity, valid, formula_set FROM {db}.grades FINAL")
        assert len(grades) == 40 and len({g[0] for g in grades}) == 40
        # S_comp = 1 − P(s > 0), recomputed from the persisted per-trial severities
        s_comp = 1 - sum(1 for g in grades if g[1] > 0) / len(grades)
        assert abs(s_comp - report["metrics"]["S_comp"]["value"]) < 1e-12
    finally:
        st.close()
