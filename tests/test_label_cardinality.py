"""Cardinality cap (bugcase D22): 400 runs whose gen_ai.agent.name is a per-instance repr
('<agents.Agent object at 0x…>') must not become 400 scored groups × ~25 series per window. With
RELYSCOPE_MAX_LABEL_SETS=10, 10 label sets keep their names and the other 390 are scored together
as agent=version='other', counted in relyscope_label_sets_folded and named in a report warning."""

from __future__ import annotations

import json

import httpx

from conftest import DATA, start_sidecar

CASE = DATA / "bugcases" / "D22_unbounded_agent_label_cardinality.json"


def test_agent_label_sets_are_capped(tmp_path):
    case = json.loads(CASE.read_text())
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_MAX_LABEL_SETS": "10"})
    try:
        for req in case["requests"]:
            r = httpx.post(sc.otlp_http + "/v1/traces", json=req["body"], headers=req.get("headers"), timeout=60)
            assert r.status_code == 200, r.text
        sc.flush()
        rep = sc.report()
        text = sc.get("/metrics").text
    finally:
        sc.kill()
    groups = rep["groups"]
    named = [g for g in groups if g["agent"] != "other"]
    other = [g for g in groups if g["agent"] == "other"]
    assert len(named) == 10 and len(other) == 1
    assert other[0]["version"] == "other"
    # every trial is still counted: 10 named single-trial groups + 390 pooled
    assert sum(g["trials"] for g in named) == 10 and other[0]["trials"] == 390
    warning = other[0]["warnings"][0]
    assert "390 (agent, version) label sets" in warning and "390 of their agent names look like" in warning
    folded = [l for l in text.splitlines() if l.startswith("relyscope_label_sets_folded{")]
    assert len(folded) == 1 and folded[0].endswith(" 390.0")
    agents = {l.split('agent="')[1].split('"')[0] for l in text.splitlines() if l.startswith("relyscope_score{")}
    assert len(agents) == 11  # bounded: the cap plus 'other'
