"""Shared fixtures: a real sidecar process (``relyscope serve``) on loopback with free ports.

Each sidecar runs in its own process (chDB lets one process hold a data directory) and is
stopped by its PID: SIGTERM, then SIGKILL after a bounded wait.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from relyscope.testing import RELYSCOPE_BIN, SidecarProc, start_sidecar  # noqa: F401 (re-exported)


def _find_shared() -> Path:
    """shared/ (test data written by others): $RELYSCOPE_SHARED, else beside the clone (as CI lays
    it out), else the workplace's /work/shared."""
    for cand in (os.environ.get("RELYSCOPE_SHARED"), Path(__file__).resolve().parents[1].parent / "shared",
                 "/work/shared"):
        if cand and (Path(cand) / "data").is_dir():
            return Path(cand)
    raise RuntimeError("shared/ test data not found: set RELYSCOPE_SHARED")


# The sidecar's default, RELYSCOPE_DECODE_WORKERS=auto, starts decode processes on a machine with
# 2 CPUs; the suite starts sidecars and pipelines by the hundred, so it decodes in the worker thread
# (the oracle path) unless a test asks for processes: test_decode_pool, test_decode_workers_auto,
# and the durability, fast-path and quarantine tests parametrized over 1 and 2 workers.
os.environ.setdefault("RELYSCOPE_DECODE_WORKERS", "1")

SHARED = _find_shared()
DATA = SHARED / "data"
TAU_FILE = DATA / "tau-bench" / "gpt-4o-airline.json"
BIN = RELYSCOPE_BIN


@pytest.fixture
def sidecar(tmp_path):
    sc = start_sidecar(tmp_path)
    try:
        yield sc
    finally:
        sc.kill()


@pytest.fixture
def sidecar_factory(tmp_path):
    started: list[SidecarProc] = []

    def make(**kw) -> SidecarProc:
        sc = start_sidecar(tmp_path, **kw)
        started.append(sc)
        return sc

    yield make
    for sc in started:
        sc.kill(signal.SIGKILL if sc.proc.poll() is None else signal.SIGTERM)


def pytest_unconfigure(config):
    """After the summary the interpreter still joins every non-daemon thread a test left (a
    thread pool's workers, a process pool's manager thread): one that never ends made CI time out
    an hour after "1456 passed", with nothing printed. If the exit takes longer than 3 minutes,
    every thread's stack goes to stderr and the run ends with status 1 — a failure that names
    what hung, in the CI's output."""
    import faulthandler
    import sys

    faulthandler.dump_traceback_later(180, exit=True, file=sys.__stderr__)
