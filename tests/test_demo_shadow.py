"""`relyscope demo` end to end, as `make demo` runs it: production traffic, shadow replays against
three versions served by a real replay-target process, robustness with CIs and two gate verdicts."""

from __future__ import annotations

import json
import subprocess

import pytest

from relyscope.testing import RELYSCOPE_BIN


@pytest.mark.slow
def test_demo_shows_robustness_and_gates(tmp_path):
    r = subprocess.run([str(RELYSCOPE_BIN), "demo", "--format", "json", "--data-dir", str(tmp_path / "demo")],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    groups = {(g["version"], g["run_kind"]): g for g in rep["groups"]}
    prod = groups[("1.0.0", "production")]
    assert prod["trials"] == 24 * 5 and prod["metrics"]["R_Rob"]["value"] is None  # production is only watched
    for v in ("1.0.0", "1.0.1", "1.1.0"):
        g = groups[(v, "shadow")]
        assert g["tasks"] == 24 and g["trials"] == 24 * 12  # (nominal + prompt + fault + env) × 3 per task
        for key in ("R_fault", "R_env", "R_prompt"):
            m = g["metrics"][key]
            assert m["value"] is not None and 0 <= m["value"] <= 1 and m["ci"] is not None
            assert m["ci"][0] <= m["value"] <= m["ci"][1]
    # same code, same seeds: the equal candidate's replays are the incumbent's, exactly — durations
    # too (a simulated clock: with the real one C_res, R_Con and R differed by jitter)
    same = ("success_rate", "R_fault", "R_env", "R_prompt", "C_res", "R_Con", "R")
    assert [groups[("1.0.0", "shadow")]["metrics"][k]["value"] for k in same] == \
        [groups[("1.0.1", "shadow")]["metrics"][k]["value"] for k in same]
    verdicts = {g["candidate"]: g["verdict"] for g in rep["gates"]}
    assert verdicts == {"1.0.1": "pass", "1.1.0": "block"}
    worse = next(g for g in rep["gates"] if g["candidate"] == "1.1.0")
    assert any(x["name"] == "success_rate" and x["verdict"] == "block" for x in worse["reasons"])
    assert "next steps:" in r.stderr and "keep a sidecar running" in r.stderr
