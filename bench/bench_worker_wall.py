"""Where the sidecar's worker time goes: wall vs CPU per stored span, per thread (issue 13).

A real ``relyscope serve`` pinned to core 0 (``taskset -c 0``), this client on core 1, as
``bench_ingest.py`` does. With the store made unavailable (``RELYSCOPE_FAULT_STORE_DOWN_FILE``),
``--requests`` requests of 512 GenAI-like spans (``bench_ingest.template``) are accepted into the
spool; the worker cannot store them. Then the fault file is removed and the worker drains the
backlog; optionally (``--load-conns N``) N client connections keep posting meanwhile (the
receiver threads compete, as in ``bench_ingest.py --phases worker``). The drain window runs from
the first record the worker stores (``relyscope_queue_depth`` falls) to an empty queue with
every trial finalized and stored (``relyscope_trials_finalized_total``).

Per thread of the sidecar (``/proc/PID/task/TID/schedstat``: nanoseconds on CPU and waiting in
the run queue; names from ``py-spy dump`` when it is installed, else the kernel's ``comm``) over
the drain window, divided by the spans stored in it: what each thread ran per span, and how long
the worker thread waited for the core (other threads of the sidecar, and other processes on
core 0 on this shared machine). The residual — wall minus worker run minus worker run-queue wait —
is the time the worker thread was blocked (a lock, the GIL held by another thread, I/O).

Run: ``.venv/bin/python bench/bench_worker_wall.py [--requests 80] [--score-interval 5]
[--load-conns 0] [--env K=V ...] [--pyspy-record out.txt]``
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import PB, SPANS, template, variant  # noqa: E402

from relyscope.testing import start_sidecar  # noqa: E402

PYSPY = Path(sys.executable).parent / "py-spy"


def core0_busy_ns() -> int:
    """Non-idle time of core 0 since boot, ns (/proc/stat, clock ticks)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu0 "):
                v = [int(x) for x in line.split()[1:]]
                return (sum(v[:8]) - v[3] - v[4]) * 10**9 // os.sysconf("SC_CLK_TCK")
    return 0


def threads(pid: int) -> dict:
    """tid -> (comm, ns on CPU, ns waiting in the run queue); key -1: core 0's busy ns."""
    out: dict = {-1: ("core0", core0_busy_ns(), 0)}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait, _ = (int(x) for x in f.read().split())
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        out[int(tid)] = (comm, run, wait)
    return out


def py_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name (py-spy dump), {} without py-spy."""
    if not PYSPY.exists():
        return {}
    r = subprocess.run([str(PYSPY), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    names = {}
    for line in r.stdout.splitlines():
        m = re.match(r"Thread (\S+) \(([^)]*)\): \"([^\"]+)\"", line)
        if m:
            tid = m.group(1)
            names[int(tid, 16) if tid.startswith("0x") else int(tid)] = m.group(3)
    return names


def metric(api: str, name: str) -> float:
    for line in httpx.get(api + "/metrics", timeout=60).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def post(url: str, tmpl: bytes, ks: range, conns: int, stop: threading.Event | None = None) -> int:
    """POST variants k of the template from ``conns`` threads; returns accepted requests."""
    it = iter(ks)
    lock = threading.Lock()
    ok = [0]

    def run() -> None:
        with httpx.Client(timeout=120) as c:
            while stop is None or not stop.is_set():
                with lock:
                    k = next(it, None)
                if k is None:
                    return
                r = c.post(url + "/v1/traces", content=variant(tmpl, k), headers=PB)
                if r.status_code == 200:
                    with lock:
                        ok[0] += 1

    ts = [threading.Thread(target=run) for _ in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return ok[0]


def report(label: str, t0: float, s0: dict, t1: float, s1: dict, spans: int, names: dict, load: str) -> None:
    """Per-span wall, and per thread name: ns on CPU and in the run queue, between two snapshots."""
    wall = t1 - t0
    by: dict[str, list[int]] = {}
    tot_run = 0
    worker = None
    core0 = s1[-1][1] - s0[-1][1]
    for tid, (comm, run1, wait1) in s1.items():
        if tid == -1:
            continue
        _, run0, wait0 = s0.get(tid, (comm, 0, 0))
        dr, dw = run1 - run0, wait1 - wait0
        tot_run += dr
        name = names.get(tid, comm)
        if name == "relyscope-worker":
            worker = (dr, dw)
        agg = by.setdefault(name, [0, 0, 0])
        agg[0] += dr
        agg[1] += dw
        agg[2] += 1
    per = 1e3 * spans
    print(f"{label}: {spans} spans in {wall:.2f} s = {spans / wall:,.0f} spans/s, {wall * 1e9 / per:.0f} us "
          f"wall/span; process CPU {tot_run / per:.0f} us/span ({tot_run / 1e9 / wall:.2f} cores); core 0 busy "
          f"{core0 / 1e9 / wall:.2f}, of which other processes {(core0 - tot_run) / per:.0f} us/span; {load}")
    for name, (dr, dw, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        if dr / per < 0.5:
            continue
        print(f"  {name[:28]:<28} x{n:<3}: run {dr / per:7.1f} us/span, run-queue wait {dw / per:7.1f} us/span")
    if worker:
        blocked = wall * 1e9 - worker[0] - worker[1]
        print(f"  worker thread: run {worker[0] / per:.0f} + run-queue wait {worker[1] / per:.0f} + blocked/asleep "
              f"{blocked / per:.0f} = {wall * 1e9 / per:.0f} us wall/span")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=80, help="backlog, requests of 512 spans")
    ap.add_argument("--score-interval", type=float, default=5.0, help="RELYSCOPE_SCORE_INTERVAL_S")
    ap.add_argument("--load-conns", type=int, default=0, help="connections posting during the drain")
    ap.add_argument("--load-seconds", type=float, default=8.0, help="how long the load runs in the drain")
    ap.add_argument("--env", action="append", default=[], help="extra sidecar env K=V")
    ap.add_argument("--pyspy-record", default="", help="py-spy record --idle the drain into this file "
                    "(raw collapsed stacks; adds sampling overhead)")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and the sidecar log")
    args = ap.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    tmpl = template()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    per_req = len({sp.trace_id for sp in ExportTraceServiceRequest.FromString(tmpl).resource_spans[0]
                   .scope_spans[0].spans})  # traces (= trials) per request
    root = Path(tempfile.mkdtemp(prefix="relyscope-wall-"))
    down = root / "store-down"
    down.write_text("")
    env = {"RELYSCOPE_FAULT_STORE_DOWN_FILE": str(down), "RELYSCOPE_SCORE_INTERVAL_S": str(args.score_interval),
           "RELYSCOPE_STORE_RETRY_MAX_S": "0.5", "RELYSCOPE_SPOOL_MAX_BYTES": str(4 << 30)}
    env.update(dict(kv.split("=", 1) for kv in args.env))
    sc = start_sidecar(root / "s", extra_env=env, timeout_s=90, cpu=0 if (os.cpu_count() or 1) > 1 else None)
    pid = sc.proc.pid
    url, api = sc.otlp_http, sc.api
    spy = None
    try:
        acc = post(url, tmpl, range(args.requests), 4)
        assert acc == args.requests, acc
        time.sleep(1.0)
        names = py_names(pid)
        depth0 = metric(api, "relyscope_queue_depth")
        stop = threading.Event()
        loader, got = None, []
        down.unlink()
        # the drain starts when the worker has stored its first batch
        while metric(api, "relyscope_queue_depth") >= depth0:
            time.sleep(0.01)
        t0, s0, d0 = time.perf_counter(), threads(pid), metric(api, "relyscope_queue_depth")
        if args.pyspy_record and PYSPY.exists():
            spy = subprocess.Popen([str(PYSPY), "record", "--idle", "--threads", "-r", "100", "-f", "raw",
                                    "-o", args.pyspy_record, "--pid", str(pid)],
                                   stdout=subprocess.DEVNULL, stderr=open(args.pyspy_record + ".log", "w"))
        if args.load_conns:
            loader = threading.Thread(target=lambda: got.append(
                post(url, tmpl, range(10**6, 2 * 10**6), args.load_conns, stop)))
            loader.start()
        mid = None  # (time, threads, queue depth) when the load stopped
        while True:
            if loader and time.perf_counter() - t0 > args.load_seconds:  # then drain the rest
                stop.set()
                loader.join()
                loader = None
                mid = (time.perf_counter(), threads(pid), metric(api, "relyscope_queue_depth"))
            d = metric(api, "relyscope_queue_depth")
            # done when every record is stored and every trace's trial is finalized and stored
            if d <= 0 and loader is None and (metric(api, "relyscope_trials_finalized_total")
                                              >= (args.requests + sum(got)) * per_req
                                              or time.perf_counter() - t0 > 600):
                break
            time.sleep(0.2)
        t1, s1 = time.perf_counter(), threads(pid)
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        stored_req = d0  # records processed in the window (queue depth counts records)
        n_proc = metric(api, "relyscope_trials_finalized_total")
    finally:
        if spy and spy.poll() is None:
            spy.kill()
        sc.kill(wait_s=60)
    load = f"load avg {os.getloadavg()[0]:.1f}"
    if mid is None:
        report(f"{args.label} drain, no load", t0, s0, t1, s1, int(d0) * SPANS, names, load)
    else:
        tm, sm, dm = mid
        report(f"{args.label} drain under load ({args.load_conns} conns)", t0, s0, tm, sm,
               int(d0 + sum(got) - dm) * SPANS, names, load)
        report(f"{args.label} drain after the load", tm, sm, t1, s1, int(dm) * SPANS, names, load)
    print(f"  trials finalized {n_proc:.0f}")
    if args.keep:
        print(f"  data kept in {root} (sidecar log: {root}/s/sidecar.log)")
    else:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
