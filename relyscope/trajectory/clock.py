"""Trials stamped after the sidecar's clock: placed at the time they were assembled.

A span's times are the agent host's clock. A host whose clock runs ahead (or a bogus timestamp,
year 2100) makes a trial that "ends" after it was received; every live window ends *now* and has
no upper bound, so such a trial counted in the 5m and 1h gauges until its stamped end — for 75
years. No run can end after the sidecar assembled it, so when a trial ends more than
``max_ahead_s`` after the wall clock at assembly, it is moved back onto that clock — and with it
every trial assembled at the same time that shares its trace or its conversation (one host, one
skew: one shift for all of them, so runs keep their order and gaps, a nested run stays inside the
run that contains it, a conversation's turns stay in turn order). The shift puts the latest end
among them at ``now``; start, end and every step move by it (durations unchanged; a time that
would fall before the epoch is clamped at 0). Each shifted trial gets the flag ``clock_ahead`` and
is counted (``relyscope_trials_clock_ahead_total``, tombstones not). The spans keep the times they
were sent with (``/api/v1/spans``). Trials ahead by less than ``max_ahead_s`` are left as they
are: ordinary skew between hosts enters and leaves a window at most that much early or late.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from relyscope.model import Trial

__all__ = ["CLOCK_AHEAD", "place_on_clock"]

#: trial flag of a trial moved back onto the sidecar's clock
CLOCK_AHEAD: Final = "clock_ahead"


def place_on_clock(trials: list[Trial], now_ns: int, max_ahead_s: float) -> tuple[list[Trial], int]:
    """``trials`` with those ending after ``now_ns + max_ahead_s`` (Unix epoch ns; seconds), and
    the trials of ``trials`` sharing a trace or a conversation with one, shifted back by one amount
    per such group so that its latest end is ``now_ns`` (module docstring); and how many trials
    (not tombstones) were shifted. Cost: one comparison per trial when none is ahead."""
    limit = now_ns + int(max_ahead_s * 1e9)
    if all(t.end_ns <= limit for t in trials):
        return trials, 0
    # groups: trials linked by a trace id or a conversation id (union-find over both keys)
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(k: tuple[str, str]) -> tuple[str, str]:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for t in trials:
        if t.conversation_id:
            a, b = find(("trace", t.trace_id)), find(("conv", t.conversation_id))
            if a != b:
                parent[a] = b
    latest: dict[tuple[str, str], int] = {}
    for t in trials:
        g = find(("trace", t.trace_id))
        latest[g] = max(latest.get(g, 0), t.end_ns)
    out, n = [], 0
    for t in trials:
        d = latest[find(("trace", t.trace_id))] - now_ns
        if d <= limit - now_ns:
            out.append(t)
            continue
        steps = tuple(replace(s, start_ns=max(0, s.start_ns - d), end_ns=max(0, s.end_ns - d)) for s in t.steps)
        out.append(replace(t, start_ns=max(0, t.start_ns - d), end_ns=max(0, t.end_ns - d), steps=steps,
                           flags=t.flags | {CLOCK_AHEAD}))
        n += t.status != "superseded"
    return out, n
