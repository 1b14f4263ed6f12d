"""Test helpers shipped with the package (style.md lesson 14): run a real sidecar process.

``start_sidecar(data_dir)`` starts ``relyscope serve`` on free loopback ports with an embedded
chDB store under ``data_dir`` and returns once it listens; :class:`SidecarProc` talks to its API and
stops it by PID. Used by the test suite and the benchmarks. The sidecar's stderr goes to
``data_dir/sidecar.log`` (a pipe nobody reads would fill and block the process).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx

__all__ = ["OffsetClock", "SidecarProc", "free_ports", "http_stub", "start_sidecar", "wait_for_replays",
           "RELYSCOPE_BIN"]

RELYSCOPE_BIN = Path(sys.executable).parent / "relyscope"


class OffsetClock:
    """A stand-in for the ``time`` module whose ``time()`` runs ``offset`` seconds ahead of the
    real clock (every other attribute is the real module's): put in place of one module's
    ``time`` (e.g. the scoring stage's) to move that module's clock alone."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def __getattr__(self, name):
        return getattr(time, name)


@contextlib.contextmanager
def http_stub(handler: type) -> Iterator[int]:
    """A stdlib HTTP server on 127.0.0.1 (a free port) answering with ``handler`` (an
    ``http.server.BaseHTTPRequestHandler`` subclass) from its own thread; yields the port, and is
    shut down and closed on exit."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=30)


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct loopback TCP ports that were free a moment ago.

    All ``n`` sockets stay bound until every port is chosen, so the kernel cannot hand out the
    same port twice (it may, if each probe socket is closed before the next bind). A port can still
    be taken by another process before the caller binds it; callers that cannot retry should have
    the server bind port 0 and report its port instead.
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class SidecarProc:
    """A running ``relyscope serve`` process and its bound ports."""

    proc: subprocess.Popen
    data_dir: Path
    grpc_port: int
    http_port: int
    api_port: int
    env: dict = field(default_factory=dict)
    listening: dict = field(default_factory=dict)  # the parsed "listening" line of its stdout

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def otlp_grpc(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def log(self) -> str:
        """What the sidecar wrote to stderr so far."""
        p = self.data_dir / "sidecar.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.api + path, timeout=60, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.api + path, timeout=120, **kw)

    def flush(self) -> None:
        """Finalize every open trace now and rescore (``POST /api/v1/flush``)."""
        r = self.post("/api/v1/flush")
        assert r.status_code == 200, r.text

    def report(self) -> dict:
        return self.get("/api/v1/report").json()

    def trials(self, **params) -> list[dict]:
        """Every trial matching the filters (all pages; ``limit`` caps the total)."""
        cap = params.pop("limit", None)
        out: list[dict] = []
        cursor = None
        while True:
            page_params = {**params, "limit": 1000, **({"cursor": cursor} if cursor else {})}
            r = self.get("/api/v1/trials", params=page_params)
            assert r.status_code == 200, r.text
            body = r.json()
            out += body["trials"]
            cursor = body.get("next_cursor")
            if not cursor or (cap is not None and len(out) >= cap):
                return out if cap is None else out[:cap]

    def vm_status(self) -> dict[str, int]:
        """VmRSS / VmHWM of the process, KiB (Linux)."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
        return out

    def kill(self, sig: int = signal.SIGTERM, wait_s: float = 20) -> int | None:
        """Send ``sig`` and wait (SIGKILL after ``wait_s``). Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout and not self.proc.stdout.closed:
            self.proc.stdout.close()
        return self.proc.returncode


def wait_for_replays(sidecar: SidecarProc, replay_ids: list[str], timeout_s: float = 120,
                     poll_s: float = 0.2) -> dict[str, int]:
    """Poll ``POST /api/v1/shadow/status`` until none of ``replay_ids`` is scheduled or running;
    return the counts by status. Raises TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    st: dict[str, int] = {}
    while time.monotonic() < deadline:
        st = sidecar.post("/api/v1/shadow/status", json={"replay_ids": replay_ids}).json()["by_status"]
        if not st.get("scheduled") and not st.get("running"):
            return st
        time.sleep(poll_s)
    raise TimeoutError(f"replays did not finish in {timeout_s} s: {st}")


def start_sidecar(data_dir: Path, *, extra_env: dict | None = None, args: list[str] | None = None,
                  timeout_s: float = 60, cpu: int | str | None = None, wrapper: list[str] | None = None) -> SidecarProc:
    """Start ``relyscope serve`` on free loopback ports; return once it listens.

    Test defaults: grace period 0.3 s, score interval 1 s, B = 200 (override with ``extra_env``).
    ``cpu``: pin the process to these cores with ``taskset -c`` (benchmarks): a core number or a
    CPU list such as ``"0-1"``; None inherits the caller's affinity (a caller pinned to one core
    starts a sidecar pinned to that same core). ``wrapper``: a command
    prefix, e.g. ``["prlimit", "--fsize=262144", "--"]`` to make large writes fail. Raises RuntimeError if it
    exits or does not listen within ``timeout_s``, with its log."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
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
    cmd = [str(RELYSCOPE_BIN), "serve", "--log-level", "warning", *(args or [])]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    if wrapper:
        cmd = [*wrapper, *cmd]
    with open(data_dir / "sidecar.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    sc = SidecarProc(proc, data_dir, 0, 0, 0, env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("{") and '"listening"' in line:
            info = json.loads(line)
            sc.grpc_port, sc.http_port, sc.api_port = info["otlp_grpc"], info["otlp_http"], info["api"]
            sc.listening = info  # the whole "listening" line, as a supervisor reads it
            return sc
        if proc.poll() is not None:
            raise RuntimeError(f"sidecar exited ({proc.returncode}): {sc.log[-4000:]}")
    sc.kill(signal.SIGKILL)
    raise RuntimeError(f"sidecar did not start in {timeout_s} s: {sc.log[-4000:]}")
