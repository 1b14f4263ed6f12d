"""Cost of redaction per span (relyscope.collector.redaction), against the worker's decode.

Decodes the 512 GenAI-like spans of ``bench_ingest_decode.build_request`` once, then measures in
the same run, single-threaded: ``decode_http`` (the worker's decode, the baseline), and
``Redactor.apply`` over the decoded spans with (a) no policy, (b) a deny list of 3 globs,
(c) 1 mask pattern, (d) 3 mask patterns + the deny list — masks apply to every string of a span
(names, status, attribute values, events, resource, scope).

Run: ``.venv/bin/python bench/bench_redaction.py [--seconds 2]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from bench_ingest_decode import build_request  # noqa: E402

from relyscope.collector.otlp import decode_http  # noqa: E402
from relyscope.collector.redaction import Redactor  # noqa: E402

N = 512
DENY = ["user.email", "http.request.header.*", "enduser.*"]
PATTERNS = [r"sk-[A-Za-z0-9]{20,}", r"\b(?:\d[ -]?){13,16}\b", r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"]


def _rate(fn, seconds: float) -> float:
    fn()
    runs, t0 = 0, time.perf_counter()
    while (now := time.perf_counter()) - t0 < seconds:
        fn()
        runs += 1
    return runs * N / (now - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    body = build_request(N).SerializeToString()
    spans = decode_http(body, "application/x-protobuf", None).spans
    base = _rate(lambda: decode_http(body, "application/x-protobuf", None), a.seconds)
    print(f"decode_http (worker baseline): {base:,.0f} spans/s")
    for label, r in (("no policy", Redactor()), ("deny list (3 globs)", Redactor(deny=DENY)),
                     ("1 mask pattern", Redactor(patterns=PATTERNS[:1])),
                     ("3 mask patterns + deny list", Redactor(deny=DENY, patterns=PATTERNS))):
        rate = _rate(lambda: [r.apply(s) for s in spans], a.seconds)
        extra = 100.0 * base / rate
        print(f"Redactor.apply, {label}: {rate:,.0f} spans/s (adds {extra:.1f} % to the decode's time)")


if __name__ == "__main__":
    main()
