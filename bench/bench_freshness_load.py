"""Benchmark: freshness at the ingest benchmark's load — span end → acknowledged → spans stored →
trial stored → trial counted on ``/metrics`` (issue 13).

``bench_freshness.py`` measures the gauges' freshness at a light load (50 one-span trials/s);
``bench_ingest.py`` floods the sidecar and reports acknowledged → stored only. This script offers
the ingest benchmark's traffic (``bench_ingest.template``: requests of 512 GenAI-like spans, 32
traces of 16 spans with their roots, trace ids unique per request) at a **steady rate** (open
loop: request ``j`` is sent at ``j × 512 / rate`` seconds whatever the replies, from ``--conns``
keep-alive connections; a late one is sent at once), to a real ``relyscope serve`` with the
product's defaults (grace period 5 s, score interval 10 s; ``--grace`` / ``--interval`` change
them), pinned to core 0 (``--cores 1``) or to both cores (``--cores 2``: decode processes,
``RELYSCOPE_DECODE_WORKERS=auto``). The client runs on core 1.

``/metrics`` is scraped every ``--poll`` s: ``relyscope_spans_stored_total``,
``relyscope_trials_finalized_total`` (incremented once a trial is written to the store) and the
trials of the bench agent's ``window="all"`` groups (``relyscope_group_trials``, summed over
kinds) — what a dashboard shows. Request ``j`` (in send order; span end = its send time, as an
exporter sends spans that just ended) counts as stored / its trials as stored / visible at the
first scrape after its acknowledgement at which the cumulative count covers it (512 (j + 1)
spans, 32 (j + 1) trials): the spool stores in append order and the scorer counts whole
batches, so this count-based matching is exact up to the order of concurrent requests
(milliseconds).

Prints per rate: accepted spans/s, the stored rate over the run, and p50 / p99 / max of each
lag; a run whose stored rate falls behind the offered one says so (its lags then grow with the
run's length instead of staying bounded).

Run: ``.venv/bin/python bench/bench_freshness_load.py [--rates 4000,8000,12000] [--cores 1,2]
[--seconds 30] [--drain 60] [--conns 4] [--grace 5] [--interval 10] [--max-backlog S] [--env K=V]``
(about 1.5 minutes per rate and core count).
"""

from __future__ import annotations

import argparse
import bisect
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import PB, SPANS, Sidecar, pct, template, variant  # noqa: E402

TRACES = SPANS // 16  # bench_ingest_decode.build_request: 16 spans per trace, root first
AGENT = 'agent="support_bot"'


class Scraper:
    """Scrapes ``/metrics`` every ``every_s`` in a thread: (perf_counter time, spans stored,
    trials stored, trials counted in the agent's ``window="all"`` groups)."""

    def __init__(self, api: str, every_s: float):
        self.samples: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(api, every_s), daemon=True)
        self._t.start()

    def _run(self, api: str, every_s: float) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                try:
                    text = c.get(api + "/metrics").text
                except httpx.HTTPError:  # a slow scrape: the next one counts
                    self._stop.wait(every_s)
                    continue
                t = time.perf_counter()
                spans = trials = visible = 0
                for line in text.splitlines():
                    if line.startswith("relyscope_spans_stored_total "):
                        spans = int(float(line.split()[1]))
                    elif line.startswith("relyscope_trials_finalized_total "):
                        trials = int(float(line.split()[1]))
                    elif (line.startswith("relyscope_group_trials{") and AGENT in line
                          and 'window="all"' in line):
                        visible += int(float(line.rsplit(" ", 1)[1]))
                self.samples.append((t, spans, trials, visible))
                self._stop.wait(every_s)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(30)

    def first(self, col: int, want: int, after: float) -> float | None:
        """Time of the first sample at or after ``after`` whose column ``col`` is ≥ ``want``."""
        counts = [s[col] for s in self.samples]  # monotone: counters, and a count of stored trials
        i = bisect.bisect_left(counts, want)
        while i < len(self.samples) and self.samples[i][0] < after:
            i += 1
        return self.samples[i][0] if i < len(self.samples) else None


def paced_load(url: str, tmpl: bytes, rate: float, seconds: float, conns: int, retry: bool) -> list[tuple]:
    """Send request ``j`` at ``t0 + j * SPANS / rate`` for ``seconds`` (open loop, ``conns``
    connections taking the next due request). Returns (send time, ack time or None, accepted
    spans) per request, in send order. ``retry``: a 503 waits its Retry-After and is sent again,
    as an OTLP exporter does (the send time stays the first)."""
    period = SPANS / rate
    n = int(seconds / period)
    out: list[tuple | None] = [None] * n
    lock = threading.Lock()
    nxt = [0]
    t0 = time.perf_counter() + 0.2

    def run() -> None:
        with httpx.Client(timeout=120) as client:
            while True:
                with lock:
                    j = nxt[0]
                    if j >= n:
                        return
                    nxt[0] += 1
                due = t0 + j * period
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                sent = time.perf_counter()
                body = variant(tmpl, j)
                r = client.post(url + "/v1/traces", content=body, headers=PB)
                while retry and r.status_code == 503:
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                    r = client.post(url + "/v1/traces", content=body, headers=PB)
                acked = time.perf_counter()
                ok = r.status_code == 200
                rej = ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans if ok else 0
                out[j] = (sent, acked if ok else None, SPANS - rej if ok else 0)

    threads = [threading.Thread(target=run) for _ in range(conns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [o for o in out if o is not None]


def _summary(name: str, lags: list[float], missing: int) -> str:
    if not lags:
        return f"  {name:<28}: none seen ({missing} missing)"
    return (f"  {name:<28}: p50 {pct(lags, 50):6.2f} s, p99 {pct(lags, 99):6.2f} s, max {max(lags):6.2f} s"
            + (f"  ({missing} of {missing + len(lags)} not seen by the end)" if missing else ""))


def run_rate(root: Path, tmpl: bytes, rate: float, cores: int, args) -> dict:
    env = {"RELYSCOPE_GRACE_PERIOD_S": str(args.grace), "RELYSCOPE_SCORE_INTERVAL_S": str(args.interval),
           "RELYSCOPE_N_BOOT": "2000", "RELYSCOPE_DECODE_WORKERS": "auto"}
    if args.max_backlog:
        env["RELYSCOPE_MAX_BACKLOG_S"] = str(args.max_backlog)
    env.update(kv.split("=", 1) for kv in args.env)
    sc = Sidecar(root / f"r{cores}-{int(rate)}", env, all_cores=cores > 1)
    try:
        workers = int(sc.metric("relyscope_decode_workers"))
        scraper = Scraper(sc.api, args.poll)
        t_start = time.perf_counter()
        reqs = paced_load(sc.http, tmpl, rate, args.seconds, args.conns, bool(args.max_backlog))
        t_load = time.perf_counter()
        acked = [r for r in reqs if r[1] is not None]
        want_spans = sum(r[2] for r in acked)
        want_trials = len(acked) * TRACES
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:
            s = scraper.samples[-1] if scraper.samples else (0, 0, 0, 0)
            if s[1] >= want_spans and s[2] >= want_trials and s[3] >= want_trials:
                break
            time.sleep(0.25)
        time.sleep(2 * args.poll)
        scraper.stop()
        text = httpx.get(sc.api + "/metrics", timeout=60).text
    finally:
        sc.stop()
    sm = {}
    for line in text.splitlines():
        for name in ("relyscope_score_cycles_total", "relyscope_score_cycles_deferred_total",
                     "relyscope_score_cycle_seconds_sum", "relyscope_score_cycle_seconds_count"):
            if line.startswith(name + " "):
                sm[name] = float(line.split()[1])
    acks, stored, trial, shown = [], [], [], []
    miss = [0, 0, 0]
    cum_s = cum_t = 0
    for sent, ack, n in reqs:
        if ack is None:
            continue
        cum_s += n
        cum_t += TRACES
        acks.append(ack - sent)
        for col, want, lags, m in ((1, cum_s, stored, 0), (2, cum_t, trial, 1), (3, cum_t, shown, 2)):
            t = scraper.first(col, want, ack)
            if t is None:
                miss[m] += 1
            else:
                lags.append(t - sent)
    last = scraper.samples[-1] if scraper.samples else (t_start, 0, 0, 0)
    # stored rate over the load: spans stored by the end of the load / load time
    at_load = [s for s in scraper.samples if s[0] <= t_load]
    stored_by_load = at_load[-1][1] if at_load else 0
    res = {"rate": rate, "cores": cores, "workers": workers, "requests": len(reqs), "acked": len(acked),
           "accepted": want_spans / (t_load - t_start), "stored_during": stored_by_load / (t_load - t_start),
           "stored_total": last[1], "want": want_spans}
    print(f"-- offered {rate:,.0f} spans/s ({rate / SPANS * TRACES:,.0f} trials/s) for {args.seconds:g} s, sidecar on "
          f"{'both cores' if cores > 1 else 'core 0'} ({workers} decode process{'es' if workers > 1 else ''}"
          f"{'' if workers > 1 else ' = in-thread'}), grace {args.grace:g} s, score interval {args.interval:g} s"
          + (f", max backlog {args.max_backlog:g} s" if args.max_backlog else "")
          + "".join(f", {kv}" for kv in args.env))
    # kept up: the spans-stored lag of the last quarter of the requests is not above the first's
    q = max(1, len(stored) // 4)
    growth = statistics.median(stored[-q:]) - statistics.median(stored[:q]) if stored else float("nan")
    res["growth"] = growth
    print(f"  accepted {res['accepted']:,.0f} spans/s ({len(acked)} of {len(reqs)} requests acknowledged); stored "
          f"during the load {res['stored_during']:,.0f} spans/s; stored in all {last[1]} of {want_spans}; "
          f"spans-stored lag, last quarter − first quarter of the requests: {growth:+.2f} s"
          + ("  — FELL BEHIND: the lags grow with the run" if growth > 1.0 else ""))
    cycles, cyc_s = sm.get("relyscope_score_cycle_seconds_count", 0), sm.get("relyscope_score_cycle_seconds_sum", 0)
    n_trials = len(acked) * TRACES
    print(f"  scorer: {cycles:.0f} cycles ({sm.get('relyscope_score_cycles_deferred_total', 0):.0f} postponed), "
          f"{cyc_s:.1f} s in cycles, mean {cyc_s / max(cycles, 1):.2f} s; {cyc_s / max(n_trials, 1) * 1e3:.3f} ms "
          f"per trial ({cyc_s / max(want_spans, 1) * 1e6:.1f} us per span; wall, the GIL and core shared)")
    res.update(cycles=cycles, cycle_s=cyc_s)
    print(_summary("span end → acknowledged", acks, 0))
    print(_summary("span end → spans stored", stored, miss[0]))
    print(_summary("span end → trial stored", trial, miss[1]))
    print(_summary("span end → trial on /metrics", shown, miss[2]))
    res.update(ack=acks, stored=stored, trial=trial, shown=shown, miss=miss)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="4000,8000,12000", help="offered spans/s, comma list")
    ap.add_argument("--cores", default="1,2", help="sidecar cores, comma list of 1 and/or 2")
    ap.add_argument("--seconds", type=float, default=30.0, help="load time per rate")
    ap.add_argument("--drain", type=float, default=60.0, help="bound on the wait after the load")
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--grace", type=float, default=5.0, help="RELYSCOPE_GRACE_PERIOD_S (product default 5)")
    ap.add_argument("--interval", type=float, default=10.0, help="RELYSCOPE_SCORE_INTERVAL_S (product default 10)")
    ap.add_argument("--poll", type=float, default=0.25, help="seconds between scrapes of /metrics")
    ap.add_argument("--max-backlog", type=float, default=0.0, help="RELYSCOPE_MAX_BACKLOG_S (default unset)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="extra sidecar environment, e.g. RELYSCOPE_SCORE_MAX_DEFER=0 (repeatable)")
    args = ap.parse_args()
    if any("=" not in kv for kv in args.env):
        ap.error("--env takes K=V, e.g. --env RELYSCOPE_SCORE_MAX_DEFER=0")
    try:
        rates = [float(r) for r in args.rates.split(",") if r]
        cores = [int(c) for c in args.cores.split(",") if c]
    except ValueError:
        ap.error("--rates and --cores take comma lists of numbers, e.g. --rates 4000,8000 --cores 1,2")
    if not rates or any(r <= 0 for r in rates) or any(c not in (1, 2) for c in cores):
        ap.error("--rates must be positive spans/s; --cores takes 1 and/or 2")
    ncpu = os.cpu_count() or 1
    if ncpu > 1:
        os.sched_setaffinity(0, {1})  # the client: the core a one-core sidecar does not use
    cores = [c for c in cores if c <= ncpu]
    tmpl = template()
    print(f"machine: {ncpu} cores, load avg {os.getloadavg()[0]:.2f}; {SPANS} spans ({TRACES} traces) per request, "
          f"{args.conns} connections, scrape every {args.poll:g} s")
    root = Path(tempfile.mkdtemp(prefix="relyscope-freshload-"))
    try:
        for c in cores:
            for r in rates:
                run_rate(root, tmpl, r, c, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
