"""relyscope beside Arize Phoenix: the same OTLP load, same client, same machine, one run.

Both servers get the identical load of ``bench_ingest`` — batches of 512 GenAI-like spans
(``bench_ingest_decode.build_request``, trace ids made unique per request by ``bench_ingest.variant``)
sent by ``--conns`` concurrent keep-alive connections for ``--seconds`` — once over OTLP/HTTP
protobuf (``POST /v1/traces``, the ``bench_ingest.load`` client) and once over OTLP/gRPC (the
same bytes through a grpcio channel per connection, ``TraceService/Export``). Each (server,
transport) pair gets a fresh server with an empty store:

- relyscope: ``relyscope serve`` (embedded chDB, the default), via ``relyscope.testing.start_sidecar``;
- Phoenix: ``phoenix serve`` from ``arize-phoenix==PHOENIX_VERSION``, installed by this script into
  its own venv ``bench/.venv-phoenix`` (never a dependency of the project), SQLite default, with a
  temporary ``PHOENIX_WORKING_DIR`` and telemetry off.

Both servers run under ``taskset -c 0``; this client runs on core 1. Reported per pair:

- accepted spans/s: spans the server acknowledged (200 / OK, less ``partial_success.rejected_spans``)
  per second of load;
- persisted spans/s: spans countable in the server's store (relyscope ``GET /api/v1/spans``;
  Phoenix ``SELECT count(*) FROM spans`` on its SQLite file, read-only) once the count reached
  the accepted count or ``--drain-seconds`` after the load ended, divided by the time since the
  first request;
- p50/p99 request latency, requests refused (non-200 / non-OK);
- peak RSS: ``VmHWM`` of the server process plus its child processes, sampled every 0.5 s.

Every server is stopped by its PID (SIGTERM, then SIGKILL). Bounded: ~4 fresh servers x
(start + ``--seconds`` + at most ``--drain-seconds``).

Run: ``.venv/bin/python bench/bench_peers.py [--seconds 12] [--conns 4] [--drain-seconds 30]
[--servers relyscope,phoenix] [--transports http,grpc]``
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from relyscope.testing import start_sidecar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_ingest import SPANS, load, pct, template, variant  # noqa: E402

PHOENIX_VERSION = "20.26.1"
PHOENIX_VENV = HERE / ".venv-phoenix"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# ---- process helpers ----------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    """Descendants of ``pid``, whichever thread started them."""
    kids: list[str] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                kids += (task / "children").read_text().split()
            except OSError:
                pass
    except OSError:
        return []
    out = [int(k) for k in kids]
    for k in list(out):
        out += _children(k)
    return out


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """Peak of (VmHWM of ``pid`` + VmHWM of each descendant), sampled every 0.5 s, KiB."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._hwm: dict[int, int] = {}
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in [self.pid, *_children(self.pid)]:
                self._hwm[p] = max(self._hwm.get(p, 0), _hwm_kib(p))
            self.peak = max(self.peak, sum(self._hwm.values()))
            self._stop.wait(0.5)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- servers ------------------------------------------------------------------------------------

class Relyscope:
    name = "relyscope"

    def __init__(self, root: Path, extra_env: dict | None = None):
        cpu = 0 if (os.cpu_count() or 1) > 1 else None
        self.sc = start_sidecar(root, extra_env={"RELYSCOPE_SCORE_INTERVAL_S": "5", **(extra_env or {})},
                                timeout_s=90, cpu=cpu)
        self.pid = self.sc.proc.pid
        self.http = self.sc.otlp_http
        self.grpc = f"127.0.0.1:{self.sc.grpc_port}"

    def stored(self) -> int:
        r = httpx.get(self.sc.api + "/api/v1/spans", timeout=120)
        return r.json()["spans"] if r.status_code == 200 else -1

    def stop(self) -> None:
        self.sc.kill(wait_s=60)


def ensure_phoenix() -> Path:
    """``bench/.venv-phoenix/bin/phoenix``, installing ``arize-phoenix==PHOENIX_VERSION`` first if
    that venv lacks it (from PyPI, a few minutes the first time)."""
    exe = PHOENIX_VENV / "bin" / "phoenix"
    py = PHOENIX_VENV / "bin" / "python"
    if exe.exists():
        got = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('arize-phoenix'))"],
                             capture_output=True, text=True).stdout.strip()
        if got == PHOENIX_VERSION:
            return exe
    print(f"installing arize-phoenix=={PHOENIX_VERSION} into {PHOENIX_VENV} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PHOENIX_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"arize-phoenix=={PHOENIX_VERSION}"], check=True)
    return exe


class Phoenix:
    name = "phoenix"

    def __init__(self, root: Path, exe: Path, timeout_s: float = 180):
        self.work = root / "phoenix"
        self.work.mkdir(parents=True)
        port, gport = _free_port(), _free_port()
        env = {**os.environ, "PHOENIX_WORKING_DIR": str(self.work), "PHOENIX_HOST": "127.0.0.1",
               "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(gport),
               "PHOENIX_TELEMETRY_ENABLED": "false",
               # no fetches from the internet at start (WASM sandbox binary, docs MCP server)
               "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false"}
        cmd = [str(exe), "serve"]
        if (os.cpu_count() or 1) > 1 and shutil.which("taskset"):
            cmd = ["taskset", "-c", "0", *cmd]
        self.log = open(root / "phoenix.log", "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log)
        self.pid = self.proc.pid
        self.http = f"http://127.0.0.1:{port}"
        self.grpc = f"127.0.0.1:{gport}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"phoenix exited ({self.proc.returncode}): {self._tail()}")
            try:
                if httpx.get(self.http + "/healthz", timeout=2).status_code == 200 and self._grpc_up():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"phoenix did not listen in {timeout_s} s: {self._tail()}")

    def _grpc_up(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", int(self.grpc.rsplit(":", 1)[1]))) == 0

    def _tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stored(self) -> int:
        db = self.work / "phoenix.db"
        if not db.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as c:
                return c.execute("SELECT count(*) FROM spans").fetchone()[0]
        except sqlite3.Error:
            return -1

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


# ---- gRPC load ----------------------------------------------------------------------------------

def load_grpc(target: str, tmpl: bytes, start_k: int, seconds: float, conns: int) -> dict:
    """As ``bench_ingest.load``, over OTLP/gRPC: the same serialized requests, one channel per
    connection thread."""
    per_req = len(ExportTraceServiceRequest.FromString(tmpl).resource_spans[0].scope_spans[0].spans)
    lock = threading.Lock()
    state = {"k": start_k, "accepted": 0, "errors": 0, "lat": [], "requests": 0, "codes": collections.Counter()}
    stop_at = time.perf_counter() + seconds

    def run() -> None:
        with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20),
                                                    ("grpc.max_receive_message_length", 64 << 20)]) as ch:
            export = ch.unary_unary(EXPORT, request_serializer=lambda b: b,
                                    response_deserializer=ExportTraceServiceResponse.FromString)
            while time.perf_counter() < stop_at:
                with lock:
                    k = state["k"]
                    state["k"] += 1
                body = variant(tmpl, k)
                t = time.perf_counter()
                try:
                    resp = export(body, timeout=120)
                    ok, rej, code = True, resp.partial_success.rejected_spans, None
                except grpc.RpcError as e:
                    ok, rej, code = False, 0, f"{e.code().name}: {e.details()}"[:120]
                dt = time.perf_counter() - t
                with lock:
                    state["requests"] += 1
                    state["lat"].append(dt)
                    if ok:
                        state["accepted"] += per_req - rej
                    else:
                        state["errors"] += 1
                        state["codes"][code] += 1

    threads = [threading.Thread(target=run) for _ in range(conns)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    state["wall"] = time.perf_counter() - t0
    return state


# ---- one measurement ----------------------------------------------------------------------------

def measure(server, transport: str, tmpl: bytes, args) -> dict:
    rss = RssSampler(server.pid)
    try:
        # warm-up: one request, its spans left to be counted with the rest (same for both servers)
        warm = load(server.http, tmpl, 10**6, None, 1, max_requests=1) if transport == "http" else \
            load_grpc(server.grpc, tmpl, 10**6, 0.01, 1)
        t0 = time.perf_counter()
        st = (load(server.http, tmpl, 0, args.seconds, args.conns) if transport == "http"
              else load_grpc(server.grpc, tmpl, 0, args.seconds, args.conns))
        want = st["accepted"] + warm["accepted"]
        deadline = time.monotonic() + args.drain_seconds
        n = server.stored()
        while n < want and time.monotonic() < deadline:
            time.sleep(2.0)  # a count costs the server CPU: do not poll harder
            n = server.stored()
        t_end = time.perf_counter()
    finally:
        peak = rss.stop()
    return {"server": server.name, "transport": transport, "accepted_rate": st["accepted"] / st["wall"],
            "accepted": st["accepted"], "requests": st["requests"], "errors": st["errors"],
            "p50_ms": pct(st["lat"], 50) * 1e3 if st["lat"] else float("nan"),
            "p99_ms": pct(st["lat"], 99) * 1e3 if st["lat"] else float("nan"),
            "stored": n, "want": want, "persisted_rate": max(n, 0) / (t_end - t0), "elapsed": t_end - t0,
            "peak_rss_mib": peak / 1024, "codes": dict(st.get("codes") or {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=12.0, help="load duration per (server, transport)")
    ap.add_argument("--conns", type=int, default=4, help="concurrent client connections")
    ap.add_argument("--drain-seconds", type=float, default=30.0,
                    help="how long to wait after the load for the store to hold every accepted span")
    ap.add_argument("--servers", default="relyscope,phoenix")
    ap.add_argument("--transports", default="http,grpc")
    args = ap.parse_args()
    servers = args.servers.split(",")
    transports = args.transports.split(",")
    exe = ensure_phoenix() if "phoenix" in servers else None
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})  # the client: the core the servers do not use
    tmpl = template()
    print(f"machine: {os.cpu_count()} cores (server on core 0, client on core 1), load avg "
          f"{os.getloadavg()[0]:.1f}; payload {len(variant(tmpl, 0))} B protobuf, {SPANS} spans/request, "
          f"{args.conns} connections, {args.seconds:g} s per load, drain <= {args.drain_seconds:g} s; "
          f"arize-phoenix=={PHOENIX_VERSION}", flush=True)
    rows = []
    for transport in transports:
        for name in servers:
            root = Path(tempfile.mkdtemp(prefix=f"relyscope-peers-{name}-"))
            server, r = None, {}
            try:
                server = Relyscope(root / "rs") if name == "relyscope" else Phoenix(root, exe)
                r = measure(server, transport, tmpl, args)
            finally:
                if server is not None:
                    server.stop()
                if name == "phoenix" and (root / "phoenix.log").exists():  # kept for reading errors
                    out = HERE / "out"
                    out.mkdir(exist_ok=True)
                    shutil.copy(root / "phoenix.log", out / f"phoenix-{transport}.log")
                    m = re.search(r"stopped with (\d+) spans still pending after a ([\d.]+)s shutdown drain "
                                  r"that processed (\d+)", (root / "phoenix.log").read_text(errors="replace"))
                    if m:
                        r["shutdown_drain"] = (int(m[3]), float(m[2]), int(m[1]))
                shutil.rmtree(root, ignore_errors=True)
            rows.append(r)
            print(f"{r['server']:<10} {r['transport']:<5}: accepted {r['accepted_rate']:10,.0f} spans/s "
                  f"({r['requests']} requests, {r['errors']} refused), p50 {r['p50_ms']:.1f} ms, "
                  f"p99 {r['p99_ms']:.1f} ms; persisted {r['persisted_rate']:9,.0f} spans/s ({r['stored']} of "
                  f"{r['want']} accepted spans stored {r['elapsed']:.1f} s after the first request); "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB; load avg {os.getloadavg()[0]:.1f}", flush=True)
            if r["codes"]:
                print(f"{'':<17}gRPC refusals: {r['codes']}", flush=True)
            if "shutdown_drain" in r:
                done, secs, left = r["shutdown_drain"]
                print(f"{'':<17}phoenix's own log at SIGTERM: its shutdown drain wrote {done} spans in "
                      f"{secs:g} s ({done / secs:,.0f} spans/s) and dropped {left} acknowledged spans", flush=True)
    print("\n| server | transport | accepted spans/s | persisted spans/s | p99 ms | refused | peak RSS MiB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['server']} | {r['transport']} | {r['accepted_rate']:,.0f} | {r['persisted_rate']:,.0f} | "
              f"{r['p99_ms']:.0f} | {r['errors']}/{r['requests']} | {r['peak_rss_mib']:.0f} |")
    by = {(r["server"], r["transport"]): r for r in rows}
    for t in transports:
        a, b = by.get(("relyscope", t)), by.get(("phoenix", t))
        if a and b and b["persisted_rate"] > 0 and b["accepted_rate"] > 0:
            print(f"ratio relyscope/phoenix over {t}: accepted {a['accepted_rate'] / b['accepted_rate']:.1f}x, "
                  f"persisted {a['persisted_rate'] / b['persisted_rate']:.1f}x")


if __name__ == "__main__":
    main()
