"""The finalized-trace cache is bounded in bytes, configurable, its evictions counted (issue 10
item 4), over a real sidecar process — and a late span of an evicted trace still yields the whole
trial (the trace is reloaded from the store), never a one-span fragment."""

from __future__ import annotations

from test_durability import (_start, _stop_term, check_trials, flush, make_trace, metric, post_json,  # noqa: F401
                             sidecars, trace_id_of)

BOUND = 16 << 10  # 16 KiB: room for a handful of finalized 5-span traces (~0.7 KB per span)


def test_cache_is_bounded_evictions_counted_and_late_span_reloads_the_trace(tmp_path, sidecars):
    sc = _start(sidecars, tmp_path, RELYSCOPE_FINALIZED_CACHE_BYTES=BOUND)
    traces = {}
    for i in range(40):
        tid = trace_id_of(70, i)
        traces[tid] = make_trace(tid, task=f"t{i % 4}", n_children=4)
    first = trace_id_of(70, 0)
    late = traces[first][-1]
    assert post_json(sc, traces[first][:-1]).status_code == 200  # its last tool span comes later
    for tid, spans in traces.items():
        if tid != first:
            assert post_json(sc, spans).status_code == 200
    flush(sc)
    evicted = metric(sc, "relyscope_finalized_traces_evicted_total")
    assert evicted >= 30  # 40 traces of ~3.5 KB each do not fit in 16 KiB
    assert 0 < metric(sc, "relyscope_finalized_cache_bytes") <= BOUND
    # the first trace was evicted long ago: its late span must re-assemble the whole run
    assert post_json(sc, [late]).status_code == 200
    flush(sc)
    check_trials(sc, traces)  # every trial whole, the first one with all five spans
    assert _stop_term(sc) == 0


def test_builder_accounting_by_bytes_and_age():
    from relyscope.collector.normalize import normalize
    from relyscope.model import CanonicalSpan
    from relyscope.trajectory import TrajectoryBuilder

    def run(tid: str) -> list:
        root = CanonicalSpan(trace_id=tid, span_id="a" * 16, parent_span_id="", name="invoke_agent x", kind=1,
                             start_ns=1, end_ns=10, attributes={"gen_ai.operation.name": "invoke_agent"})
        return [(root, normalize(root))]

    b = TrajectoryBuilder(grace_s=0, retain_s=100, retain_bytes=None, forget_evicted=True)
    for i in range(3):
        b.add(run(f"{i:032x}"), 0.0)
    assert len(b.poll(1.0)) == 3 and b.evicted == 0 and b.retained_bytes > 0
    one = b.retained_bytes / 3
    b.retain_bytes = int(1.5 * one)  # room for one
    b.poll(2.0)
    assert b.evicted == 2 and b.retained_bytes == one
    assert not b.knows(f"{0:032x}") and b.knows(f"{2:032x}")  # forgotten, not "dropped late"
    b.poll(200.0)  # past retain_s: the last one goes too
    assert b.evicted == 3 and b.retained_bytes == 0
