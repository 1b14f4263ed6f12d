"""Shared fixtures: a real sidecar process (``relyscope serve``) on loopback with free ports.

Each sidecar runs in its own process (chDB lets one process hold a data directory) and is
stopped by its PID: SIGTERM, then SIGKILL after a bounded wait.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

def _find_shared() -> Path:
    """shared/ (test data written by others): $RELYSCOPE_SHARED, else beside the clone (as CI lays
    it out), else the workplace's /work/shared."""
    for cand in (os.environ.get("RELYSCOPE_SHARED"), Path(__file__).resolve().parents[1].parent / "shared",
                 "/work/shared"):
        if cand and (Path(cand) / "data").is_dir():
            return Path(cand)
    raise RuntimeError("shared/ test data not found: set RELYSCOPE_SHARED")


SHARED = _find_shared()
DATA = SHARED / "data"
TAU_FILE = DATA / "tau-bench" / "gpt-4o-airline.json"
BIN = Path(sys.executable).parent / "relyscope"


@dataclass
class SidecarProc:
    proc: subprocess.Popen
    data_dir: Path
    grpc_port: int
    http_port: int
    api_port: int
    env: dict = field(default_factory=dict)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def otlp_grpc(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.api + path, timeout=60, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.api + path, timeout=120, **kw)

    def flush(self) -> None:
        r = self.post("/api/v1/flush")
        assert r.status_code == 200, r.text

    def report(self) -> dict:
        return self.get("/api/v1/report").json()

    def trials(self, **params) -> list[dict]:
        r = self.get("/api/v1/trials", params=params)
        assert r.status_code == 200, r.text
        return r.json()["trials"]

    def kill(self, sig: int = signal.SIGTERM, wait_s: float = 20) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_sidecar(data_dir: Path, *, extra_env: dict | None = None, args: list[str] | None = None,
                  timeout_s: float = 60) -> SidecarProc:
    """Start ``relyscope serve`` on free loopback ports; return once it listens."""
    env = dict(os.environ)
    env.update({
        "RELYSCOPE_STORE": f"chdb://{data_dir}/data",
        "RELYSCOPE_SPOOL_DIR": str(data_dir / "spool"),
        "RELYSCOPE_OTLP_GRPC": "127.0.0.1:0",
        "RELYSCOPE_OTLP_HTTP": "127.0.0.1:0",
        "RELYSCOPE_API": "127.0.0.1:0",
        "RELYSCOPE_GRACE_PERIOD_S": "0.3",
        "RELYSCOPE_SCORE_INTERVAL_S": "1",
        "RELYSCOPE_N_BOOT": "200",
    })
    env.update(extra_env or {})
    proc = subprocess.Popen([str(BIN), "serve", "--log-level", "warning", *(args or [])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("{") and '"listening"' in line:
            break
        if proc.poll() is not None:
            raise RuntimeError(f"sidecar exited: {proc.stderr.read()}")
    else:
        proc.kill()
        raise RuntimeError("sidecar did not start in time")
    info = json.loads(line)
    return SidecarProc(proc, data_dir, info["otlp_grpc"], info["otlp_http"], info["api"], env)


@pytest.fixture
def sidecar(tmp_path):
    sc = start_sidecar(tmp_path)
    try:
        yield sc
    finally:
        sc.kill()
        if sc.proc.stdout:
            sc.proc.stdout.close()
        if sc.proc.stderr:
            sc.proc.stderr.close()


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
