"""Shadow operations: the shipped alert rules checked by the real promtool (firing and silent
cases, a mutated rule must fail them) and the shadow dashboard's structure."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "alerts" / "relyscope-shadow-rules.yml"
TESTS = ROOT / "deploy" / "alerts" / "relyscope-shadow-rules.test.yml"
DASHBOARD = ROOT / "grafana" / "dashboards" / "relyscope-shadow.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_rules_check_and_unit_tests_pass():
    assert "SUCCESS: 3 rules found" in _promtool("check", "rules", RULES.name, cwd=RULES.parent).stdout
    r = _promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
@pytest.mark.parametrize("old,new", [('verdict="block"', 'verdict="pass"'), ("> 0.10", "> 0.30"),
                                     ("> 0.5", "> 0.9")])
def test_unit_tests_catch_a_broken_rule(tmp_path, old, new):
    (tmp_path / RULES.name).write_text(RULES.read_text().replace(old, new, 1))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    assert _promtool("test", "rules", TESTS.name, cwd=tmp_path).returncode != 0


def test_every_alert_is_tested_firing_and_silent_and_has_a_runbook():
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    readme = (ROOT / "README.md").read_text()
    for a in alerts:
        cases = [c for t in tests for c in t.get("alert_rule_test", []) if c["alertname"] == a["alert"]]
        assert any(c["exp_alerts"] for c in cases) and any(not c["exp_alerts"] for c in cases), a["alert"]
        anchor = a["annotations"]["runbook"].split("#")[1]
        assert f"runbook-{a['alert'].lower()}" == anchor and f"### Runbook: {a['alert']}" in readme


def test_rules_and_dashboard_use_only_shadow_families_the_sidecar_exports():
    from relyscope.exporter import shadow_prom

    exported = set(re.findall(r"``(relyscope_[a-z_]+)", shadow_prom.__doc__ or "")) | {"relyscope_score",
                                                                                   "relyscope_score_ci_low",
                                                                                   "relyscope_score_ci_high"}
    exported |= {"relyscope_gate_delta_ci_low", "relyscope_gate_delta_ci_high"}
    exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    d = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in d["panels"] for t in p["targets"]]
    for e in exprs:
        for name in re.findall(r"\b(relyscope_[a-z_]+)", e):
            assert name in exported, (name, e)
    titles = {p["title"] for p in d["panels"]}
    assert {"Robustness per family (shadow replays)", "Candidate − baseline per gated metric"} <= titles
