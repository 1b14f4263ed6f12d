"""The spool's list of open traces (``open_traces.json``), what a restart reloads from the store.

Found by a fresh-user run: every start on the demo store logged "reloaded 12 open traces of the
previous run", also after ``POST /api/v1/flush`` and a stop that reported ``open_traces_left: 0``.
The list was rewritten only when new spool records were committed, so traces finalized since (a
flush, the grace or root timeout on an idle sidecar, the stop) stayed listed and were reloaded and
re-finalized at every start."""

from __future__ import annotations

import json
import time

import httpx

from relyscope.testing import start_sidecar


def _rootless(tid: int) -> dict:
    """One child span of trace ``tid`` whose root never comes: the trace stays open."""
    span = {"traceId": f"{tid:032x}", "spanId": f"{tid + 1:016x}", "parentSpanId": f"{tid:016x}",
            "name": "execute_tool lookup", "kind": 1,
            "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                           {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}}]}
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}


def _listed(sc) -> list[str]:
    return json.loads((sc.data_dir / "spool" / "open_traces.json").read_text())


def test_traces_finalized_by_a_flush_leave_the_open_list_without_new_records(tmp_path):
    sc = start_sidecar(tmp_path / "sc", extra_env={"RELYSCOPE_ROOT_TIMEOUT_S": "3600"})
    try:
        assert httpx.post(sc.otlp_http + "/v1/traces", json=_rootless(7), timeout=30).status_code == 200
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _listed_or_none(sc) != [f"{7:032x}"]:
            time.sleep(0.1)
        assert _listed(sc) == [f"{7:032x}"]  # committed while open: listed, to reload after a crash
        sc.flush()  # finalizes it; no new record comes after
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _listed(sc):
            time.sleep(0.1)
        assert _listed(sc) == []
    finally:
        sc.kill()
    assert _listed(sc) == []  # what the next start reloads: nothing


def _listed_or_none(sc):
    try:
        return _listed(sc)
    except (OSError, ValueError):
        return None
