"""Liveness, readiness and health over a real sidecar process (issue 10 item 8).

A full spool or a full disk must fail readiness (new data would be refused) but never liveness
(a restart would not help and the spool holds acknowledged data). The full disk is real: the
sidecar runs under ``prlimit --fsize`` so a spool segment cannot grow past 256 KiB and the next
append fails with EFBIG, as it would with ENOSPC (CPython ignores SIGXFSZ, so the write errors).
"""

from __future__ import annotations

import shutil
import signal

import pytest

from relyscope.testing import start_sidecar
from test_durability import _start, make_trace, post_json, sidecars, trace_id_of, wait_until  # noqa: F401


def _probe(sc, path: str) -> tuple[int, dict]:
    r = sc.get(path)
    return r.status_code, r.json()


def test_full_spool_fails_readiness_not_liveness(tmp_path, sidecars):
    down = tmp_path / "down"
    down.touch()
    sc = _start(sidecars, tmp_path, RELYSCOPE_FAULT_STORE_DOWN_FILE=down, RELYSCOPE_SPOOL_MAX_BYTES=1 << 16)
    assert _probe(sc, "/livez") == (200, {"status": "alive", "reason": None})
    assert _probe(sc, "/readyz") == (200, {"status": "ready", "reason": None})
    for i in range(200):
        if post_json(sc, make_trace(trace_id_of(40, i), task="t0")).status_code != 200:
            break
    assert _probe(sc, "/readyz") == (503, {"status": "not_ready", "reason": "spool_full"})
    assert _probe(sc, "/livez")[0] == 200
    code, h = _probe(sc, "/healthz")
    assert code == 503 and h["status"] == "spool_full"
    down.unlink()  # the store drains the spool: ready again
    wait_until(lambda: _probe(sc, "/readyz")[0] == 200, what="ready again")
    assert _probe(sc, "/readyz") == (200, {"status": "ready", "reason": None})


@pytest.mark.skipif(not shutil.which("prlimit"), reason="needs prlimit (util-linux)")
def test_disk_full_spool_fails_readiness_and_health_not_liveness(tmp_path):
    # 8 MiB spool → 1 MiB segments; the file-size limit stops a segment at 256 KiB. The store is
    # down (an outage while the disk fills), so nothing is committed and the segment only grows.
    down = tmp_path / "down"
    down.touch()
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_SPOOL_MAX_BYTES": str(8 << 20),
                                            "RELYSCOPE_FAULT_STORE_DOWN_FILE": str(down)},
                       wrapper=["prlimit", f"--fsize={256 << 10}", "--"])
    try:
        statuses = set()
        for i in range(400):
            statuses.add(post_json(sc, make_trace(trace_id_of(41, i), task="t0")).status_code)
            if 503 in statuses:
                break
        assert 503 in statuses, "the spool write never failed"
        assert _probe(sc, "/readyz") == (503, {"status": "not_ready", "reason": "spool_write_failed"})
        code, h = _probe(sc, "/healthz")
        assert code == 503 and h["status"] == "spool_write_failed"  # was "ok" with every write refused
        assert _probe(sc, "/livez")[0] == 200
    finally:
        sc.kill(signal.SIGKILL)
