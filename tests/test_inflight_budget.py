"""A global in-flight byte budget answers the retryable signal beyond it (issue 10 item 5), over a
real sidecar process. A client holds part of the budget with a slow upload (declared length, half
the body sent); a second request that does not fit gets 503 + Retry-After with an UNAVAILABLE
``google.rpc.Status``; once the first finishes, the second is accepted. Both are stored."""

from __future__ import annotations

import socket

import httpx

from test_durability import (_start, flush, keys_of, make_trace, metric, otlp_json, sidecars,  # noqa: F401
                             stored_keys, trace_id_of, wait_until)

BUDGET = 1 << 20  # the smallest the settings allow


def _padded(tid: str, size: int) -> list[dict]:
    spans = make_trace(tid, task="t0")
    spans[1]["attrs"]["pad"] = "x" * size
    return spans


def test_requests_beyond_the_inflight_budget_get_503_retry_after(tmp_path, sidecars):
    sc = _start(sidecars, tmp_path, RELYSCOPE_MAX_INFLIGHT_BYTES=BUDGET)
    a, b = trace_id_of(80, 1), trace_id_of(80, 2)
    body_a = otlp_json(_padded(a, 700_000))
    body_b = otlp_json(_padded(b, 700_000))
    assert len(body_a) + len(body_b) > BUDGET
    s = socket.create_connection(("127.0.0.1", sc.http_port), timeout=30)
    try:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body_a) + body_a[: len(body_a) // 2])
        wait_until(lambda: metric(sc, "relyscope_inflight_bytes") == len(body_a), what="first upload reserved")
        r = httpx.post(sc.otlp_http + "/v1/traces", content=body_b, headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        assert r.json()["code"] == 14 and "budget" in r.json()["message"]  # UNAVAILABLE: retryable
        s.sendall(body_a[len(body_a) // 2:])
        reply = s.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    finally:
        s.close()
    wait_until(lambda: metric(sc, "relyscope_inflight_bytes") == 0, what="budget released")
    r = httpx.post(sc.otlp_http + "/v1/traces", content=body_b, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 200, r.text
    flush(sc)
    assert stored_keys(sc) == keys_of(_padded(a, 1)) | keys_of(_padded(b, 1))
    assert metric(sc, "relyscope_backpressure_total", 'reason="inflight_budget"') >= 1
    assert metric(sc, "relyscope_backpressure_total", 'reason="spool_full"') == 0
