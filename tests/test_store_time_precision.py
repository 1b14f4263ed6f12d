"""Trial times round-trip at full nanosecond precision: the trials table keeps ``DateTime64(9)``,
and ``Store.load_trials`` must not pass them through Python datetimes (microseconds), on any of its
three query shapes (plain ``FINAL``, ``min_version_ns``, ``most_recent``)."""

from __future__ import annotations

import pytest

from relyscope.model import Trial
from relyscope.store.clickhouse import Store

START = 1_764_000_000_123_456_789  # 2025-11-24, sub-µs digits 789
END = START + 2_000_000_001  # 2.000000001 s later: its sub-µs digits (790) differ from START's


def _trial(tid: str, start: int, end: int) -> Trial:
    return Trial(trial_id=tid, trace_id=tid.ljust(32, "0"), root_span_id="r" * 16, task_id="task",
                 task_id_source="attribute", agent_name="a", agent_version="1", run_kind="production",
                 outcome="success", outcome_source="attribute", outcome_score=None, claimed_success=None,
                 confidence=None, conversation_id=None, start_ns=start, end_ns=end, steps=())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(f"chdb://{tmp_path_factory.mktemp('prec')}/data")
    st.insert_trials([_trial("a", START, END), _trial("b", START + 1, END + 999)])
    yield st
    st.close()


@pytest.mark.parametrize("shape", [{}, {"min_version_ns": 0}, {"most_recent": 10}])
def test_start_and_end_keep_their_nanoseconds(store, shape):
    got = {t.trial_id: (t.start_ns, t.end_ns) for t in store.load_trials(**shape)}
    assert got == {"a": (START, END), "b": (START + 1, END + 999)}


@pytest.mark.parametrize("shape", [{}, {"min_version_ns": 0}, {"most_recent": 10}])
def test_time_filters_still_compare_the_stored_end_time(store, shape):
    # since is inclusive, until exclusive, at ns: END + 999 is b's end, one ns past a's window
    assert [t.trial_id for t in store.load_trials(since_ns=END + 1, **shape)] == ["b"]
    assert [t.trial_id for t in store.load_trials(until_ns=END + 999, **shape)] == ["a"]
    assert [t.trial_id for t in store.load_trials(since_ns=END, until_ns=END + 1, **shape)] == ["a"]
