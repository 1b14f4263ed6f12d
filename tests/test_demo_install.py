"""Issue 12: ``make demo`` installs only what the demo needs and ends by saying what to do next."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from relyscope.testing import RELYSCOPE_BIN

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_demo_installs_the_sidecar_extra_only():
    out = subprocess.run(["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    installs = [line for line in out.stdout.splitlines() if "pip install" in line]
    assert installs and all(re.search(r"-e '\.\[sidecar\]'", line) for line in installs), out.stdout
    out = subprocess.run(["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "'.[sidecar,dev,frameworks]'" in out.stdout


def test_demo_ends_with_the_next_steps(tmp_path):
    r = subprocess.run([str(RELYSCOPE_BIN), "demo", "--tasks", "2", "--trials", "2", "--no-shadow"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    tail = r.stderr[r.stderr.index("next steps:"):]
    assert "relyscope serve " in tail and "Ctrl-C" in tail
    assert f"serve --store chdb://{tmp_path.resolve()}/.relyscope/demo/data" in tail
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317" in tail
    assert "relyscope demo-agent" in tail
    assert "First ten minutes with your framework" in tail and "/docs" in tail
    # the hinted report of the demo's store works once the demo's sidecar is gone (it said
    # `relyscope report`, which then found no sidecar and no store and exited 1)
    (hint,) = [line.split(":", 1)[1].split() for line in tail.splitlines() if "report --store" in line]
    env_var, cmd = hint[0].split("=", 1), hint[1:]
    assert env_var[0] == "RELYSCOPE_POLICY_FILE" and cmd[0].endswith("relyscope") and cmd[1:3] == ["report", "--store"]
    r = subprocess.run([str(RELYSCOPE_BIN), *cmd[1:], "--n-boot", "0", "--format", "json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180,
                       env={**os.environ, "RELYSCOPE_POLICY_FILE": str(Path(tmp_path, env_var[1]))})
    assert r.returncode == 0, r.stderr[-2000:]
    assert {g["run_kind"] for g in json.loads(r.stdout)["groups"]} == {"production"}


def test_readme_has_the_sections_the_demo_points_to():
    text = (ROOT / "README.md").read_text()
    assert "## First ten minutes with your framework" in text
    assert "## Point an already-instrumented agent at it" in text
    assert "OTEL_METRICS_EXPORTER=none" in text and "/docs" in text
