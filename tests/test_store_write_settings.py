"""The span and trial inserts skip ClickHouse's replacing of each inserted block
(``optimize_on_insert = 0``, ``relyscope.store.clickhouse._WRITE_SETTINGS``): a key sent twice in
one insert is two rows until a merge, and every read that needs each key once still gets it once
(``FINAL``, ``LIMIT 1 BY``). A store that refuses a write setting gets the insert again without
it, so nothing is lost to a server's settings profile."""

from __future__ import annotations

import types

from relyscope.model import CanonicalSpan, Trial
from relyscope.store import Store
from relyscope.store.clickhouse import span_columns

T = "ab" * 16
BASE = 1_760_000_000 * 10**9


def _span(sid: str, name: str) -> CanonicalSpan:
    return CanonicalSpan(trace_id=T, span_id=sid * 16, parent_span_id="", name=name, kind=1,
                         start_ns=BASE, end_ns=BASE + 10**9, attributes={"k": name},
                         resource={"service.name": "svc"})


def _trial(revision: int, outcome: str) -> Trial:
    return Trial(trial_id="trial-1", trace_id=T, root_span_id="a" * 16, task_id="t1", task_id_source="attribute",
                 agent_name="agent", agent_version="1.0", run_kind="production", outcome=outcome,
                 outcome_source=None, outcome_score=None, claimed_success=None, confidence=None,
                 conversation_id=None, start_ns=BASE, end_ns=BASE + 10**9, steps=(), revision=revision)


def test_a_span_sent_twice_in_one_insert_is_two_rows_until_merged_and_read_once(tmp_path):
    st = Store(f"chdb://{tmp_path / 'data'}", database="w")
    try:
        assert st._write_opts == {"optimize_on_insert": 0}  # chDB lets this user change it
        # the same span twice (a client retry inside one batch) plus another one, one Arrow insert
        st.insert_span_columns(span_columns([_span("1", "a"), _span("1", "a"), _span("2", "b")]))
        # by hand: 3 rows written, 2 keys; without the setting the block itself kept 2 rows
        assert st.span_counts()["rows"] == 3
        assert st.count_spans() == 2
        assert sorted(s.span_id for s in st.load_spans([T])) == ["1" * 16, "2" * 16]
        # the row path (insert_spans, the oracle decoder's) takes the same setting
        st.insert_spans([_span("3", "c"), _span("3", "c")])
        assert (st.span_counts()["rows"], st.count_spans()) == (5, 3)
    finally:
        st.close()


def test_two_revisions_of_a_trial_in_one_insert_read_as_the_latest(tmp_path):
    st = Store(f"chdb://{tmp_path / 'data'}", database="w")
    try:
        st.insert_trials([_trial(0, "failure"), _trial(1, "success")])  # version_ns ascending
        [t] = st.load_trials()  # FINAL
        assert (t.revision, t.outcome) == (1, "success")
        [t] = st.load_trials(min_version_ns=0)  # the recent-rows path: LIMIT 1 BY
        assert (t.revision, t.outcome) == (1, "success")
    finally:
        st.close()


def test_a_refused_write_setting_is_dropped_and_the_insert_made_without_it(tmp_path):
    st = Store(f"chdb://{tmp_path / 'data'}", database="w")
    try:
        # a setting chDB does not know stands for one a settings profile forbids: the server
        # refuses the insert naming it
        st._write_opts["relyscope_no_such_setting"] = 1
        st.insert_span_columns(span_columns([_span("1", "a")]))
        assert "relyscope_no_such_setting" not in st._write_opts
        assert st._write_opts == {"optimize_on_insert": 0}
        st._write_opts["relyscope_no_such_setting"] = 1
        st.insert_trials([_trial(0, "success")])  # the row path
        assert "relyscope_no_such_setting" not in st._write_opts
        assert st.count_spans() == 1 and len(st.load_trials()) == 1
        assert st.write_errors == 0
    finally:
        st.close()


def test_settings_the_server_marks_readonly_or_does_not_list_are_not_sent():
    def client(**defs):
        return types.SimpleNamespace(server_settings={k: types.SimpleNamespace(readonly=v) for k, v in defs.items()})

    assert Store._write_settings(client(optimize_on_insert=0)) == {"optimize_on_insert": 0}
    assert Store._write_settings(client(optimize_on_insert=1)) == {}
    assert Store._write_settings(client()) == {}
    assert Store._write_settings(types.SimpleNamespace()) == {}


def test_other_tables_get_no_write_setting(tmp_path):
    st = Store(f"chdb://{tmp_path / 'data'}", database="w")
    try:
        assert st._opts("outcomes", None) is None
        mine = {"parallel_view_processing": 1}
        assert st._opts("contrib_log", mine) is mine
        assert st._opts("trials", mine) == {"optimize_on_insert": 0, "parallel_view_processing": 1}
    finally:
        st.close()



def test_only_a_refusal_of_the_setting_drops_it_not_an_outage_whose_text_names_it(tmp_path):
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    st = Store(f"chdb://{tmp_path / 'data'}", database="w")
    try:
        # what clickhouse-connect's HTTP client raised with the server down (its text holds the
        # request URL, whose parameters carry the setting; found by a review of this change)
        down = OperationalError("Error HTTPConnectionPool(host='127.0.0.1', port=8123): Max retries exceeded with "
                                "url: /?session_id=x&wait_end_of_query=1&optimize_on_insert=0&query_id= (Caused by "
                                "NewConnectionError('Connection refused'))")
        assert not st._without_write_setting(down)
        too_many = DatabaseError("Code: 252. DB::Exception: Too many parts (settings: optimize_on_insert=0). (TOO_MANY_PARTS)")
        assert not st._without_write_setting(too_many)
        assert st._write_opts == {"optimize_on_insert": 0}
        refused = DatabaseError("Code: 452. DB::Exception: Setting optimize_on_insert should not be changed. "
                                "(SETTING_CONSTRAINT_VIOLATION)")
        assert st._without_write_setting(refused)
        assert st._write_opts == {}
    finally:
        st.close()


def test_the_recent_rows_path_filters_the_latest_row_of_a_key_as_final_does(tmp_path):
    """``load_trials(min_version_ns=…)`` answers as the ``FINAL`` read for the keys it covers: a
    filter on a column that changed between two rows of one trial key (its trace, its end time,
    its task) is applied to the key's latest row, never to an older one. Before the fix the filter
    ran before ``LIMIT 1 BY`` and the older row came back as if it were current."""
    other = "cd" * 16
    st = Store(f"chdb://{tmp_path / 'data'}", database="w")
    try:
        old = _trial(0, "failure")
        # the same key (trial id, agent, version, run kind) later stored from another trace,
        # ending an hour later, under another task: that row is the trial now
        new = Trial(**{**{f: getattr(old, f) for f in old.__dataclass_fields__},
                       "trace_id": other, "end_ns": BASE + 3600 * 10**9, "task_id": "t2",
                       "revision": 1, "outcome": "success"})
        st.insert_trials([old])
        st.insert_trials([new])
        for filters, want in (({"trace_ids": [T]}, []), ({"trace_ids": [other]}, [1]),
                              ({"until_ns": BASE + 2 * 10**9}, []), ({"task_id": "t1"}, []),
                              ({"task_id": "t2"}, [1]), ({}, [1])):
            final = [t.revision for t in st.load_trials(**filters)]
            recent = [t.revision for t in st.load_trials(**filters, min_version_ns=0)]
            assert final == want, filters
            assert recent == want, filters
    finally:
        st.close()
