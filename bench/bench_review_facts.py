"""Memory and time of the live report sections' facts (issue 9): bytes per kept trial fact, the
memory of one live group's facts (``_REVIEW_RECENT`` + slack), and the seconds of ``sections``
over them vs ``review_group`` (regrade) over the same trials.

Trials as tests/live_traffic.py makes them, with the trajectory builder's id shapes (trial id =
``<32-hex trace id>:<16-hex root span id>``), 1 000 tasks, the example policy. Memory by
``tracemalloc`` (the facts and the map holding them, after the trials are dropped).

    .venv/bin/python bench/bench_review_facts.py [--trials 5000] [--groups 50]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import pathlib
import random
import sys
import time
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from live_traffic import make_trial  # noqa: E402

import relyscope  # noqa: E402
from relyscope.scorers.graders import grade_trial  # noqa: E402
from relyscope.scorers.policy import load_policy  # noqa: E402
from relyscope.scorers.review import review_group, sections, trial_facts  # noqa: E402
from relyscope.scoring.stage import _RecentFacts, _slack  # noqa: E402


def trials(n: int, seed: int = 1) -> list:
    rng = random.Random(seed)
    now = time.time_ns()
    out = []
    for i in range(n):
        t = make_trial(rng, i, task=f"task{rng.randrange(1000):04d}", end_ns=now - i * 10**9)
        trace = f"{rng.getrandbits(128):032x}"
        out.append(dataclasses.replace(t, trace_id=trace, trial_id=f"{trace}:{rng.getrandbits(64):016x}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5000, help="trials reviewed per group (_REVIEW_RECENT)")
    ap.add_argument("--groups", type=int, default=50, help="live groups, for the total (RELYSCOPE_MAX_LABEL_SETS)")
    args = ap.parse_args()
    policy = load_policy(pathlib.Path(relyscope.__file__).parent / "scorers/example_policy.yaml")
    kept = args.trials + _slack(args.trials)
    ts = trials(kept)
    grades = [grade_trial(t, policy) for t in ts]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rec = _RecentFacts(complete=True)
    for i, (t, g) in enumerate(zip(ts, grades)):
        rec.put(t.trial_id, 10**18 + i, trial_facts(t, g))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    per = used / kept
    print(f"{kept} facts kept per group ({args.trials} + slack): {used / 2**20:.2f} MiB, {per:.0f} B per fact; "
          f"× {args.groups} groups: {used * args.groups / 2**20:.0f} MiB")
    top = rec.top(args.trials)
    recent = sorted(ts[-args.trials:], key=lambda t: t.trial_id)
    for name, fn in (("sections(top facts)", lambda: sections(rec.top(args.trials))),
                     ("review_group(trials) (regrade)", lambda: review_group(recent, policy).extras)):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        print(f"{name}: median {sorted(runs)[2] * 1e3:.1f} ms over 5 runs (min {min(runs) * 1e3:.1f})")
    assert len(top) == args.trials


if __name__ == "__main__":
    main()
