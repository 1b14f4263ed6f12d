"""End-to-end ingest benchmark of a real ``relyscope serve`` process (OTLP/HTTP protobuf).

The sidecar runs pinned to core 0 (``taskset -c 0``), this client process to core 1. Batches of
512 GenAI-like spans (``bench_ingest_decode.build_request``, trace ids made unique per request) are
POSTed to ``/v1/traces`` by a few concurrent keep-alive connections for a bounded time. Measured in
the same run:

1. raw upb parse rate of the same payload (``ExportTraceServiceRequest.FromString``) on core 0,
   before and after the load phases (the baseline the issue asks the ratio against), and in the
   same process the rates of ``validate_http`` (what ``Pipeline.accept`` runs) and ``decode_http``
   (what the worker runs);
2. phase "receiver alone": the store is made unavailable (``RELYSCOPE_FAULT_STORE_DOWN_FILE``),
   so the worker thread stays idle and the figure is what the receiver path (validate + spool
   append with fdatasync + reply) sustains on one core: accepted spans/s, p50/p99 latency;
3. phase "receiver + worker": a fresh sidecar, store up; the same load while the worker decodes,
   normalizes, stores (chDB) and assembles on the same core; then up to ``--drain-seconds`` more:
   stored spans/s end to end = spans counted by ``GET /api/v1/spans`` / time since the first
   request (the worker has a backlog the whole time, so this is its sustained rate);
   The phase runs first on one core (in-thread decode, sidecar pinned to core 0), then with all
   cores once per ``--workers`` value (``RELYSCOPE_DECODE_WORKERS``, decode processes; default
   the number of cores), each with a fresh sidecar pinned to every core (the client still runs
   on core 1, so it competes during the load; the "after the load" figure is the clean one), and
   prints stored spans/s per core and with all cores against the raw parse; the cost of
   shipping a decoded batch back (pickle dumps + loads) is measured beside decode_http.
   Freshness: ``relyscope_spans_stored_total`` sampled every 0.25 s during the load and drain;
   each acknowledged request's spans count as stored at the first sample that covers them:
   acknowledged → stored p50/p99/max. With ``--max-backlog S`` the sidecar bounds its backlog
   (``RELYSCOPE_MAX_BACKLOG_S``) and the client retries a 503 after its Retry-After, as OTLP
   exporters do;
4. phase "memory": a fresh sidecar with ``RELYSCOPE_ROOT_TIMEOUT_S`` huge; idle RSS, then the
   children of N traces whose roots never arrive (default 10 000 traces x 15 spans), waiting until
   all are stored and ``relyscope_open_traces`` reaches N; peak RSS (``VmHWM``) vs idle.

Run: ``.venv/bin/python bench/bench_ingest.py [--seconds 8] [--conns 4] [--traces 10000]
[--drain-seconds 60] [--phases receiver,worker,memory] [--workers 2] [--decoder fast|legacy]
[--score-interval S] [--max-backlog S]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from relyscope.collector.otlp import decode_http, validate_http
from relyscope.testing import start_sidecar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest_decode import build_request  # noqa: E402

BIN = Path(sys.executable).parent / "relyscope"
SPANS = 512
MARK = b"RQID"  # bytes 1..4 of every trace id in the template, replaced by a request number
PB = {"Content-Type": "application/x-protobuf"}


# ---- payloads -----------------------------------------------------------------------------------

def template(drop_roots: bool = False) -> bytes:
    """Serialized build_request(512) with MARK in every trace id (optionally without root spans)."""
    req = build_request(SPANS)
    spans = req.resource_spans[0].scope_spans[0].spans
    keep = [sp for sp in spans if not (drop_roots and not sp.parent_span_id)]
    for sp in keep:
        sp.trace_id = sp.trace_id[:1] + MARK + sp.trace_id[5:]
    if drop_roots:
        del spans[:]
        spans.extend(keep)
    body = req.SerializeToString()
    assert body.count(MARK) == len(keep)
    return body


def variant(tmpl: bytes, k: int) -> bytes:
    """The template with request number ``k`` in every trace id: new traces, same size."""
    return tmpl.replace(MARK, k.to_bytes(4, "big"))


def upb_rate(body: bytes, n_spans: int, seconds: float, fn=ExportTraceServiceRequest.FromString) -> float:
    """Spans/s of ``fn(body)`` (default: the raw upb parse) on core 0 (this thread pinned there
    meanwhile, while the sidecar is not running)."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        fn(body)
        runs, t = 0, time.perf_counter()
        while True:
            fn(body)
            runs += 1
            now = time.perf_counter()
            if now - t >= seconds:
                return runs * n_spans / (now - t)
    finally:
        os.sched_setaffinity(0, old)


# ---- sidecar process ----------------------------------------------------------------------------

class Sidecar:
    """``relyscope serve`` on free loopback ports, pinned to core 0 (``all_cores``: every core); stopped by its PID."""

    def __init__(self, data_dir: Path, extra_env: dict | None = None, all_cores: bool = False):
        # all_cores: an explicit list of every core, never None: this client is pinned to core 1
        # (main), and a child process inherits that affinity — the sidecar and its decode
        # processes would then share core 1 with the client (the "all cores" figures before
        # this fix measured exactly that)
        n = os.cpu_count() or 1
        cpu = None if n < 2 else (f"0-{n - 1}" if all_cores else 0)
        self.sc = start_sidecar(data_dir, extra_env={"RELYSCOPE_SCORE_INTERVAL_S": "5", **(extra_env or {})},
                                timeout_s=90, cpu=cpu)
        self.proc = self.sc.proc
        self.http = self.sc.otlp_http
        self.api = self.sc.api

    def status(self) -> dict[str, int]:
        """VmRSS / VmHWM of the sidecar process, KiB."""
        return self.sc.vm_status()

    def stored_spans(self) -> int:
        r = httpx.get(self.api + "/api/v1/spans", timeout=120)
        return r.json()["spans"] if r.status_code == 200 else -1

    def metric(self, name: str) -> float:
        for line in httpx.get(self.api + "/metrics", timeout=60).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return float("nan")

    def stop(self) -> None:
        self.sc.kill(wait_s=60)


# ---- load ---------------------------------------------------------------------------------------

def load(url: str, tmpl: bytes, start_k: int, seconds: float | None, conns: int,
         max_requests: int | None = None, retry: bool = False) -> dict:
    """POST variants of ``tmpl`` from ``conns`` threads until ``seconds`` pass (or ``max_requests``
    are sent). Returns accepted spans, request count, latencies (s), non-200 count, wall time, and
    ``acks``: (perf_counter time of the 200, spans accepted so far) per acknowledged request.
    ``retry``: as an OTLP exporter does, a 503 waits its ``Retry-After`` and sends the same
    request again (counted in ``refused``; a latency is from the first send to the 200)."""
    n_spans = ExportTraceServiceRequest.FromString(tmpl).resource_spans[0].scope_spans[0].spans
    per_req = len(n_spans)
    lock = threading.Lock()
    state = {"k": start_k, "accepted": 0, "errors": 0, "lat": [], "requests": 0, "acks": [], "refused": 0}
    stop_at = time.perf_counter() + seconds if seconds else float("inf")
    limit_k = start_k + max_requests if max_requests else None

    def run() -> None:
        with httpx.Client(timeout=120) as client:
            while time.perf_counter() < stop_at:
                with lock:
                    k = state["k"]
                    if limit_k is not None and k >= limit_k:
                        return
                    state["k"] += 1
                body = variant(tmpl, k)
                t = time.perf_counter()
                r = client.post(url + "/v1/traces", content=body, headers=PB)
                while retry and r.status_code == 503 and time.perf_counter() < stop_at:
                    with lock:
                        state["refused"] += 1
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                    r = client.post(url + "/v1/traces", content=body, headers=PB)
                now = time.perf_counter()
                with lock:
                    state["requests"] += 1
                    state["lat"].append(now - t)
                    if r.status_code == 200:
                        rej = ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans
                        state["accepted"] += per_req - rej
                        state["acks"].append((now, state["accepted"]))
                    else:
                        state["errors"] += 1

    threads = [threading.Thread(target=run) for _ in range(conns)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    state["wall"] = time.perf_counter() - t0
    state["next_k"] = state["k"]
    return state


class StoredWatch:
    """Samples ``relyscope_spans_stored_total`` every ``every_s`` in a thread: (perf_counter time,
    spans stored) — for the acknowledged → stored freshness of each request."""

    def __init__(self, sc: "Sidecar", every_s: float = 0.25):
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(sc, every_s), daemon=True)
        self._t.start()

    def _run(self, sc: "Sidecar", every_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), int(sc.metric("relyscope_spans_stored_total"))))
            except Exception:  # noqa: BLE001 - a slow scrape: the next one counts
                pass
            self._stop.wait(every_s)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(30)

    def freshness(self, acks: list[tuple[float, int]]) -> tuple[list[float], int]:
        """(seconds from each request's 200 to the first sample counting its spans as stored,
        requests never seen stored). Requests are matched by cumulative count: the spool stores in
        append order, and 200s come back in about that order (4 connections: off by a request or
        two, milliseconds)."""
        import bisect

        counts = [n for _, n in self.samples]
        lags, missing = [], 0
        for t_ack, cum in sorted(acks):
            i = bisect.bisect_left(counts, cum)
            while i < len(self.samples) and self.samples[i][0] < t_ack:
                i += 1
            if i >= len(self.samples):
                missing += 1
            else:
                lags.append(self.samples[i][0] - t_ack)
        return lags, missing


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=1000, method="inclusive")[int(q * 10) - 1] if len(xs) > 1 else xs[0]


def wait_stored(sc: Sidecar, want: int, timeout_s: float, watch: "StoredWatch | None" = None) -> tuple[int, float]:
    """(spans stored, when) once ``want`` spans are stored or ``timeout_s`` passed. Polls the
    ``relyscope_spans_stored_total`` counter on /metrics every 0.25 s (cheap) — or reads the
    latest sample of ``watch``, which polls it already, so the sidecar is not scraped twice; the
    spans a ``GET /api/v1/spans`` FINAL count finds are checked once at the end (polling that
    count, as this script did before 2026-12-03, cost the sidecar ~0.1-0.3 s of chDB work every
    2 s and held the store lock against the worker's inserts)."""
    deadline = time.monotonic() + timeout_s
    n, t = -1, time.perf_counter()
    while time.monotonic() < deadline:
        if watch is not None and watch.samples:
            t, n = watch.samples[-1]
        else:
            n, t = int(sc.metric("relyscope_spans_stored_total")), time.perf_counter()
        if n >= want:
            break
        time.sleep(0.25)
    counted = sc.stored_spans()
    if counted != n:
        print(f"  (the store counts {counted} distinct spans; the sidecar wrote {n})")
    return min(n, counted), t


# ---- phases -------------------------------------------------------------------------------------

def _line(name: str, st: dict, rate: float) -> str:
    return (f"{name:<20}: {rate:12,.0f} spans/s accepted  ({st['requests']} requests, {st['errors']} "
            f"non-200), p50 {pct(st['lat'], 50) * 1e3:.1f} ms, p99 {pct(st['lat'], 99) * 1e3:.1f} ms")


def phase_receiver(root: Path, tmpl: bytes, args) -> float:
    """Store down, so the worker idles: what the receiver path alone sustains."""
    down = root / "store-down"
    down.write_text("down")
    sc = Sidecar(root / "a", {"RELYSCOPE_FAULT_STORE_DOWN_FILE": str(down)})
    try:
        load(sc.http, tmpl, 10**6, 1.0, args.conns)  # warm-up
        a = load(sc.http, tmpl, 2 * 10**6, args.seconds, args.conns)
    finally:
        sc.stop()
    rate = a["accepted"] / a["wall"]
    print(_line("receiver alone", a, rate))
    return rate


def phase_worker(root: Path, tmpl: bytes, args, workers: int = 1,
                 all_cores: bool = False) -> tuple[float, float, float]:
    """Store up: accepted spans/s while the worker competes, then the stored spans/s (end to end,
    and after the load stopped)."""
    env = {"RELYSCOPE_DECODE_WORKERS": str(workers)}
    if args.decoder:
        env["RELYSCOPE_INGEST_DECODER"] = args.decoder
    if args.score_interval:
        env["RELYSCOPE_SCORE_INTERVAL_S"] = str(args.score_interval)
    if args.max_backlog:
        env["RELYSCOPE_MAX_BACKLOG_S"] = str(args.max_backlog)
    sc = Sidecar(root / f"b{workers}", env, all_cores=all_cores)
    where = "cores 0-1" if all_cores else "core 0"
    print(f"-- {workers} decode worker{'s' if workers > 1 else ''} (RELYSCOPE_DECODE_WORKERS={workers}), "
          f"sidecar on {where}, decoder {args.decoder or 'default'}"
          + (f", RELYSCOPE_MAX_BACKLOG_S={args.max_backlog:g} (503s retried after Retry-After)"
             if args.max_backlog else ""))
    watch = StoredWatch(sc)
    try:
        t0 = time.perf_counter()
        b = load(sc.http, tmpl, 0, args.seconds, args.conns, retry=bool(args.max_backlog))
        rate = b["accepted"] / b["wall"]
        print(_line("receiver + worker", b, rate))
        s1, t1 = int(sc.metric("relyscope_spans_stored_total")), time.perf_counter()
        stored, t_end = wait_stored(sc, b["accepted"], args.drain_seconds, watch)
        watch.stop()
        lags, missing = watch.freshness(b["acks"])
        if lags:
            print(f"{'acknowledged→stored':<20}: p50 {pct(lags, 50):.2f} s, p99 {pct(lags, 99):.2f} s, max "
                  f"{max(lags):.2f} s over {len(lags)} requests ({missing} not stored by the end of the drain; "
                  f"{b['refused']} refusals retried; sampled every 0.25 s)")
        e2e = stored / (t_end - t0)
        trials = sc.metric("relyscope_trials_finalized_total")
        print(f"{'end to end (stored)':<20}: {e2e:12,.0f} spans/s  ({stored} of {b['accepted']} accepted "
              f"spans stored {t_end - t0:.1f} s after the first request; {trials:.0f} trials finalized)")
        after = (stored - s1) / (t_end - t1)
        print(f"{'worker after load':<20}: {after:12,.0f} spans/s stored  "
              f"({stored - s1} spans in the {t_end - t1:.1f} s after the load stopped; no receiver work)")
    finally:
        watch.stop()
        sc.stop()
    return rate, e2e, after


def pickle_cost(body: bytes, n_spans: int) -> None:
    """What a decode process adds back in the main process: spans/s of pickle.loads of a decoded
    batch (and pickle.dumps, paid in the decode process), against decode_http itself, core 0."""
    import pickle

    res = decode_http(body, PB["Content-Type"], None)
    blob = pickle.dumps(res, protocol=pickle.HIGHEST_PROTOCOL)
    dec = upb_rate(body, n_spans, 2.0, lambda b: decode_http(b, PB["Content-Type"], None))
    dumps = upb_rate(body, n_spans, 2.0, lambda b: pickle.dumps(res, protocol=pickle.HIGHEST_PROTOCOL))
    loads = upb_rate(blob, n_spans, 2.0, pickle.loads)
    print(f"shipping a decoded batch (core 0): decode_http {1e6 / dec:.1f} us/span; pickle.dumps "
          f"{1e6 / dumps:.1f} us/span (decode process); pickle.loads {1e6 / loads:.1f} us/span (main "
          f"process: {loads / dec:.2f}x the decode rate, so the main thread saves "
          f"{(1e6 / dec - 1e6 / loads):.1f} us/span); {len(blob) / n_spans:.0f} B/span pickled vs "
          f"{len(body) / n_spans:.0f} B/span protobuf")


def phase_memory(root: Path, args) -> None:
    """Idle RSS, then peak RSS holding ``args.traces`` traces whose roots never arrive."""
    # the open traces' memory bound (RELYSCOPE_OPEN_TRACES_MAX_BYTES, 128 MiB by estimate) would
    # finalize early all but ~5 000 of them: lifted, so the figure is per trace actually held open
    sc = Sidecar(root / "c", {"RELYSCOPE_ROOT_TIMEOUT_S": "1000000", "RELYSCOPE_OPEN_TRACES_MAX_BYTES": str(8 << 30)})
    try:
        time.sleep(2.0)
        idle = sc.status()
        kids = template(drop_roots=True)
        per_req_traces = SPANS // 16
        n_req = -(-args.traces // per_req_traces)
        c = load(sc.http, kids, 0, None, args.conns, max_requests=n_req)
        stored, _ = wait_stored(sc, c["accepted"], args.drain_timeout)
        deadline = time.monotonic() + 60
        open_tr = sc.metric("relyscope_open_traces")
        while open_tr < n_req * per_req_traces and time.monotonic() < deadline:
            time.sleep(0.5)
            open_tr = sc.metric("relyscope_open_traces")
        busy = sc.status()
    finally:
        sc.stop()
    grow = busy["VmHWM"] - idle["VmRSS"]
    print(f"memory: idle RSS {idle['VmRSS'] / 1024:.0f} MiB; with {open_tr:.0f} in-flight traces "
          f"({stored} child spans stored, roots never sent): RSS {busy['VmRSS'] / 1024:.0f} MiB, "
          f"peak VmHWM {busy['VmHWM'] / 1024:.0f} MiB (+{grow / 1024:.0f} MiB over idle, "
          f"{grow / max(open_tr, 1):.1f} KiB per trace)")


# ---- main ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each load phase")
    ap.add_argument("--conns", type=int, default=4, help="concurrent client connections")
    ap.add_argument("--traces", type=int, default=10_000, help="in-flight traces in the memory phase")
    ap.add_argument("--drain-seconds", type=float, default=60.0,
                    help="how long the end-to-end phase waits for the worker after the load")
    ap.add_argument("--drain-timeout", type=float, default=600.0, help="bound of the memory phase")
    ap.add_argument("--phases", default="receiver,worker,memory")
    ap.add_argument("--workers", default="",
                    help="comma list of RELYSCOPE_DECODE_WORKERS values for the worker phase's all-cores runs "
                    "(default: the number of cores; 0 or an empty list after a one-core run: none). The "
                    "phase always first runs the in-thread decode pinned to core 0")
    ap.add_argument("--decoder", default="", help="the worker's decode path in the worker phase "
                    "(RELYSCOPE_INGEST_DECODER: fast, the default, or legacy)")
    ap.add_argument("--score-interval", type=float, default=0.0,
                    help="RELYSCOPE_SCORE_INTERVAL_S of the worker phase (default 5: the scorer competes)")
    ap.add_argument("--max-backlog", type=float, default=0.0,
                    help="RELYSCOPE_MAX_BACKLOG_S of the worker phase (default unset); the client then "
                    "retries a 503 after its Retry-After, as an OTLP exporter does")
    args = ap.parse_args()
    phases = set(args.phases.split(","))
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})  # the client: the core the sidecar does not use
    tmpl = template()
    body0 = variant(tmpl, 0)
    print(f"machine: {os.cpu_count()} cores (sidecar on core 0, client on core 1); payload "
          f"{len(body0)} B protobuf, {SPANS} spans/request, {args.conns} connections, "
          f"{args.seconds:g} s per load phase")
    raw1 = upb_rate(body0, SPANS, 2.0)
    print(f"raw upb FromString (core 0, before): {raw1:12,.0f} spans/s")
    val = upb_rate(body0, SPANS, 2.0, lambda b: validate_http(b, PB["Content-Type"], None))
    dec = upb_rate(body0, SPANS, 2.0, lambda b: decode_http(b, PB["Content-Type"], None))
    print(f"in process, core 0: validate_http {val:,.0f} spans/s (ratio to raw {val / raw1:.3f}), "
          f"decode_http {dec:,.0f} spans/s (ratio {dec / raw1:.3f})")
    rate_a = rate_b = e2e = float("nan")
    root = Path(tempfile.mkdtemp(prefix="relyscope-bench-"))
    try:
        if "receiver" in phases:
            rate_a = phase_receiver(root, tmpl, args)
        one = many = None
        if "worker" in phases:
            ncpu = os.cpu_count() or 1
            counts = ([w for w in map(int, args.workers.split(",")) if w > 0] if args.workers
                      else ([ncpu] if ncpu > 1 else []))
            if any(w > 1 for w in counts):
                pickle_cost(body0, SPANS)
            one = phase_worker(root, tmpl, args, 1, all_cores=False)  # one core: the in-thread decode
            rate_b, e2e, _ = one
            many = {w: phase_worker(root, tmpl, args, w, all_cores=True) for w in counts}
        raw2 = upb_rate(body0, SPANS, 2.0)
        print(f"raw upb FromString (core 0, after) : {raw2:12,.0f} spans/s")
        if one is not None:
            raw = (raw1 + raw2) / 2
            print(f"stored spans/s (ratio to the raw parse on one core, {raw:,.0f} spans/s):")
            print(f"  one core (core 0, in-thread decode): end to end {one[1]:10,.0f} ({one[1] / raw:.4f}), "
                  f"after the load {one[2]:10,.0f} ({one[2] / raw:.4f})")
            for w, got in (many or {}).items():
                print(f"  all {os.cpu_count()} cores, {w} decode process{'es' if w > 1 else ''}: end to end "
                      f"{got[1]:10,.0f} (x{got[1] / one[1]:.2f} of one core), after the load {got[2]:10,.0f} "
                      f"(x{got[2] / one[2]:.2f})")
            print("  target: >= 35,000 stored on one core, and scaling with cores")
        if "memory" in phases:
            phase_memory(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    raw = (raw1 + raw2) / 2
    print(f"ratios to raw upb parse ({raw:,.0f} spans/s, mean of before/after): receiver alone "
          f"{rate_a / raw:.3f}, receiver + worker {rate_b / raw:.3f}, end to end {e2e / raw:.4f}")
    def verdict(r: float) -> str:
        return "not measured" if r != r else ("OK" if r >= 50_000 else "BELOW")

    print(f"target >= 50,000 spans/s accepted on one core: receiver alone {verdict(rate_a)}, "
          f"with the worker competing {verdict(rate_b)}")


if __name__ == "__main__":
    main()
