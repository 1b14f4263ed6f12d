"""post_outcome / record_outcome(trace_id=…) when no sidecar API answers: the error says how to
point it at the sidecar (the API address is a parameter, default 127.0.0.1:9464)."""

from __future__ import annotations

import socket

import pytest

from relyscope.instrumentation import record_outcome
from relyscope.instrumentation.outcomes import OutcomePostError


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there (loopback only)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_sidecar_error_names_the_api_parameter():
    # Bug: following the README's task_baggage / fallback snippets with the sidecar's API on another
    # port, record_outcome(ok, trace_id=…) said only "cannot reach the sidecar at
    # http://127.0.0.1:9464: … Connection refused" — not that the address is the api= parameter.
    api = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(OutcomePostError) as e:
        record_outcome(True, trace_id="5b8efff798038103d269b633813fc60c", api=api)
    msg = str(e.value)
    assert f"cannot reach the sidecar at {api}" in msg
    assert "api=" in msg and "9464" in msg
