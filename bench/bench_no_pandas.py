"""RSS of a real sidecar after its first span inserts, and whether pandas got loaded.

Starts ``relyscope serve`` (embedded chDB, fresh directory), posts ``--requests`` OTLP/HTTP
requests of ``bench_ingest.template()`` (512 spans each), waits ``--settle`` seconds, then reads
VmRSS / RssAnon / RssFile from ``/proc/PID/status`` and whether any ``pandas/_libs`` library is
mapped. ``--base DIR`` runs the same against the ``relyscope`` package in DIR (``git archive
<commit> relyscope | tar -x -C DIR``) through PYTHONPATH; the two alternate ``--pairs`` times.

Command: ``.venv/bin/python bench/bench_no_pandas.py --base /tmp/basepd`` (results in
bench/README.md)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import template  # noqa: E402

from relyscope.testing import start_sidecar  # noqa: E402


def one(base: str | None, requests: int, settle: float) -> str:
    body = template()
    with tempfile.TemporaryDirectory(prefix="relyscope-np-") as d:
        sc = start_sidecar(Path(d), extra_env={"PYTHONPATH": base} if base else None)
        try:
            for _ in range(requests):
                req = urllib.request.Request(f"http://127.0.0.1:{sc.http_port}/v1/traces", data=body,
                                             headers={"Content-Type": "application/x-protobuf"})
                urllib.request.urlopen(req, timeout=30).read()
            time.sleep(settle)
            status = Path(f"/proc/{sc.proc.pid}/status").read_text().splitlines()
            mib = {k: int(next(line for line in status if line.startswith(k + ":")).split()[1]) // 1024
                   for k in ("VmRSS", "RssAnon", "RssFile")}
            mapped = "pandas/_libs" in Path(f"/proc/{sc.proc.pid}/maps").read_text()
        finally:
            sc.kill()
    return f"pandas mapped {mapped}, VmRSS {mib['VmRSS']} MiB (anon {mib['RssAnon']}, file {mib['RssFile']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="directory holding an older relyscope package")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    for _ in range(args.pairs):
        print("this tree:", one(None, args.requests, args.settle), flush=True)
        if args.base:
            print(f"base {args.base}:", one(args.base, args.requests, args.settle), flush=True)


if __name__ == "__main__":
    main()
