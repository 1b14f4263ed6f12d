"""Run every benchmark script in bench/ in turn (``make bench``), each in its own process.

Each script prints its own figures; this runner only adds a header per script and the exit codes.
Scripts run one after another (never in parallel: the figures assume an otherwise idle core).

Run: ``.venv/bin/python bench/run_all.py [name-substring ...]``
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    wanted = sys.argv[1:]
    scripts = sorted(p for p in HERE.glob("bench_*.py") if not wanted or any(w in p.name for w in wanted))
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        t = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)], cwd=HERE.parent)
        print(f"=== {script.name}: exit {rc}, {time.perf_counter() - t:.0f} s ===", flush=True)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
