"""Benchmark: what the live scorer's in-memory windows hold after the first full cycle (issue 9).

Opens a store seeded by ``bench_live_scoring.py --seed-only DIR`` (use a copy: the first cycle
writes scores), runs the first cycle as a sidecar start does (``rescore(all_groups=True)``),
then prints RSS (idle → after, malloc arenas capped and trimmed as the sidecar does) and the
Python-side size of each part of :class:`relyscope.scoring.live.LiveStats`: per window the sum
arrays (``ints``, ``flts``, the Int128 / Int256 ``bigs``: int64 columns, Python ints where one could overflow), the confidence histogram, the
per-task caches (``cres``, ``tj``), task ids, and the trajectory sample. Sizes are
``sys.getsizeof`` summed over distinct objects (a lower bound: allocator overhead not counted).

    .venv/bin/python bench/bench_live_state.py --data COPY_OF_SEEDED_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_live_scoring import rss_mib  # noqa: E402
from relyscope import memory  # noqa: E402
from relyscope.config import Settings  # noqa: E402
from relyscope.scoring.stage import ScoreStage  # noqa: E402
from relyscope.store import Store  # noqa: E402


def deep(o, seen: set) -> int:
    """Bytes of ``o`` and everything it holds (dicts, sequences, object arrays), each object once."""
    if id(o) in seen:
        return 0
    seen.add(id(o))
    n = sys.getsizeof(o)
    if isinstance(o, dict):
        n += sum(deep(k, seen) + deep(v, seen) for k, v in o.items())
    elif isinstance(o, (list, tuple, set, frozenset)):
        n += sum(deep(v, seen) for v in o)
    elif getattr(o, "dtype", None) == object:
        n += sum(deep(v, seen) for v in o.ravel())
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="a copy of a directory seeded by bench_live_scoring.py --seed-only")
    args = ap.parse_args()
    memory.set_arena_max(Settings().malloc_arena_max)
    dsn = f"chdb://{args.data}/data"
    store = Store(dsn)
    stage = ScoreStage(Settings(store=dsn), store, None)
    memory.trim()
    idle = rss_mib()
    stage.rescore(all_groups=True)
    memory.trim()
    after = rss_mib()
    live, seen = stage.live(), set()
    parts = dict.fromkeys(("ints", "flts", "bigs", "hist", "cres", "tj", "task ids"), 0)
    for wins in live._win.values():
        for ws in wins.values():
            parts["ints"] += ws.ints.nbytes
            parts["flts"] += ws.flts.nbytes
            parts["bigs"] += deep(ws.bigs.cols, seen)
            parts["hist"] += deep(ws.hist, seen)
            parts["cres"] += ws.cres.nbytes + ws.cres_ok.nbytes
            parts["tj"] += ws.tj.nbytes + ws.tj_ok.nbytes
            parts["task ids"] += deep(ws.ids, seen) + deep(ws.tasks, seen)
    parts["trajectory sample"] = deep(live._traj, seen)
    print(f"RSS idle {idle:.0f} MiB, after the first cycle {after:.0f} MiB (+{after - idle:.0f})")
    for k, v in parts.items():
        print(f"  {k:18s} {v / 2**20:7.1f} MiB")
    print(f"  {'total':18s} {sum(parts.values()) / 2**20:7.1f} MiB")
    stage.close()
    store.close()


if __name__ == "__main__":
    main()
