"""The live scorer's report sections (violations, attribution, control rates, calibration, fault
exposure, worst tasks, notes) kept from per-trial facts in memory (ScoreStage._review, updated by
each rollup sync) equal the batch ``review_group`` of the same trials — the group's N most
recently stored, loaded from the store and resolved independently of the stage — through new
batches, late outcomes, re-finalized trials (revision 2, other outcome, end, task), a re-keyed
trial, more retractions than the kept slack (a reload), and a restart (a fresh stage)."""

from __future__ import annotations

import dataclasses
import random
import uuid

import pytest

from relyscope.config import Settings
from relyscope.model import Op
from relyscope.scorers.outcomes import apply_outcomes
from relyscope.scorers.review import policy_for, review_group
import relyscope.scoring.rollup as rollup_mod
from relyscope.scoring.stage import ScoreStage
from relyscope.store import Store
from test_live_rollup import GROUPS, NOW, POLICY, traffic

RECENT = 40  # the stage reviews the 40 most recently stored trials per group (5 000 in production)


@pytest.fixture(scope="module")
def chdb_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("review") / "data")


@pytest.fixture()
def store(chdb_path):
    st = Store(f"chdb://{chdb_path}", database="v" + uuid.uuid4().hex[:10])
    yield st
    st.close()


def varied(seed: int, n: int, start: int = 0) -> list:
    """traffic() with some fingerprinted tasks (a label from the input) and fault replays whose
    tool calls got injected faults (fault exposure), so every section has something in it."""
    rng = random.Random(seed)
    out = []
    for t in traffic(seed, n, start):
        if rng.random() < 0.2:
            t = dataclasses.replace(t, task_id_source="fingerprint",
                                    task_input=f"  refund   order {t.task_id}\n please")
        if t.perturbation_family == "fault":
            t = dataclasses.replace(t, steps=tuple(
                dataclasses.replace(s, fault_type="timeout") if s.op is Op.TOOL and rng.random() < 0.5 else s
                for s in t.steps))
        out.append(t)
    return out


def expected(store: Store, g, n: int = RECENT) -> dict:
    """The oracle: the batch review of the group's n most recently stored trials, outcomes
    resolved from every posted outcome (metrics.md §6)."""
    trials = store.load_trials(agent=g[0], version=g[1], run_kind=g[2], most_recent=n)
    trials = apply_outcomes(trials, store.outcomes())
    return review_group(trials, policy_for(POLICY, g[0])).extras


def stage_for(store: Store, chdb_path: str) -> ScoreStage:
    stage = ScoreStage(Settings(n_boot=20, store=f"chdb://{chdb_path}"), store, POLICY)
    stage.review_recent = RECENT
    return stage


def check(store: Store, stage: ScoreStage, *, kept=None) -> None:
    for g in GROUPS:
        ex = expected(store, g)
        assert ex["outcomes"]["success"] + ex["outcomes"]["failure"] + ex["outcomes"]["unknown"] == RECENT
        assert stage._review(g, NOW) == ex, g
        if kept is not None:  # from the facts kept in memory, not a reload from the store
            assert stage._facts[g] is kept[g], g
            # RECENT + 16 (the slack) kept, and up to 16 more (10 %, at least 16) before a trim
            assert len(stage._facts[g].items) <= RECENT + 16 + 16


def test_live_sections_equal_batch_review_through_changes_and_restart(store, chdb_path, monkeypatch):
    # no re-read overlap: a late outcome then reaches the stage as an outcome-only change (the
    # trial's stored row is older than the sync's read), as it does for any trial > 30 s old
    monkeypatch.setattr(rollup_mod, "OVERLAP_NS", 0)
    trials = varied(1, 300)
    store.insert_trials(trials[:240])
    stage = stage_for(store, chdb_path)
    stage.rescore(all_groups=True)
    for g in GROUPS:  # what the stage published for the report
        assert stage._extras[g] == expected(store, g), g
    kept = dict(stage._facts)
    assert set(kept) == set(GROUPS)
    ex = expected(store, GROUPS[0])
    assert ex["violations"] and ex["fault_exposure"]["faulted"] and ex["worst_tasks"][0]["label"]

    store.insert_trials(trials[240:])  # a second batch pushes older trials out of the 40
    stage.rescore()
    check(store, stage, kept=kept)

    rng = random.Random(5)
    recent = [t for t in trials if t.trial_id in {
        x.trial_id for g in GROUPS for x in store.load_trials(agent=g[0], version=g[1], run_kind=g[2],
                                                               most_recent=RECENT)}]
    for t in rng.sample(recent, 25) + rng.sample(trials, 10):  # late outcomes by trial and trace id
        key, kind = (t.trial_id, "trial") if rng.random() < 0.5 else (t.trace_id, "trace")
        store.insert_outcome(key, kind, rng.choice(("success", "failure")), None, "feedback")
    stage.rescore()
    check(store, stage, kept=kept)

    # re-finalized: revision 2 with another outcome, end, steps, sometimes task — old trials come
    # back among the most recently stored; and a provisional trial re-keyed (tombstone + new id)
    refinal = [dataclasses.replace(t, revision=2, end_ns=int((NOW - rng.uniform(0, 200)) * 1e9),
                                   outcome="failure" if t.outcome == "success" else "success",
                                   steps=t.steps[:1] + t.steps, task_id=t.task_id if rng.random() < 0.7 else "t99")
               for t in rng.sample(trials[:200], 30)]
    old = recent[3]
    store.insert_trials(refinal + [dataclasses.replace(old, status="superseded"),
                                   dataclasses.replace(old, trial_id=old.trial_id + "-r", revision=2)])
    stage.rescore()
    check(store, stage, kept=kept)
    assert not any(old.trial_id == tid for g in GROUPS for tid in stage._facts[g].items)

    # more retractions in one group than the facts kept beyond the 40: that group reloads
    g0 = GROUPS[0]
    top = store.load_trials(agent=g0[0], version=g0[1], run_kind=g0[2], most_recent=RECENT + 16)
    store.insert_trials([dataclasses.replace(t, status="superseded") for t in top[:30]])
    stage.rescore()
    assert len(stage._facts[g0].items) < RECENT  # 56 kept − 30 retracted
    check(store, stage)
    assert stage._facts[g0] is not kept[g0] and stage._facts[GROUPS[1]] is kept[GROUPS[1]]

    # restart: a fresh stage fills its facts from the store
    restarted = stage_for(store, chdb_path)
    restarted.rescore(all_groups=True)
    for g in GROUPS:
        assert restarted._extras[g] == expected(store, g) == stage._review(g, NOW), g
    store.insert_trials(varied(2, 60, start=10_000))
    restarted.rescore()
    check(store, restarted, kept=dict(restarted._facts))
