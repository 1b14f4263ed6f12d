"""Trials stamped after the sidecar's clock: placed at the time they were assembled.

A span's times are the agent host's clock. A host whose clock runs ahead (or a bogus timestamp,
year 2100) makes a trial that "ends" after it was received; every live window ends *now* and has
no upper bound, so such a trial counted in the 5m and 1h gauges until its stamped end — for 75
years. No run can end after the sidecar assembled it, so a trial ending more than
``max_ahead_s`` after the wall clock at assembly is moved back onto that clock: its start, end
and every step are shifted back by the same amount (durations and the order of steps unchanged;
a time would fall before the epoch is clamped at 0), the trial gets the flag ``clock_ahead``, and
the shift is counted (``relyscope_trials_clock_ahead_total``). The spans keep the times they
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
    """``trials`` with every one ending after ``now_ns + max_ahead_s`` (Unix epoch ns; seconds)
    shifted back so that it ends at ``now_ns`` (see the module docstring), and how many were.
    Cost: one comparison per trial; a shifted one is rebuilt with its steps."""
    limit = now_ns + int(max_ahead_s * 1e9)
    if all(t.end_ns <= limit for t in trials):
        return trials, 0
    out, n = [], 0
    for t in trials:
        if t.end_ns <= limit:
            out.append(t)
            continue
        d = t.end_ns - now_ns
        steps = tuple(replace(s, start_ns=max(0, s.start_ns - d), end_ns=max(0, s.end_ns - d)) for s in t.steps)
        out.append(replace(t, start_ns=max(0, t.start_ns - d), end_ns=now_ns, steps=steps,
                           flags=t.flags | {CLOCK_AHEAD}))
        n += 1
    return out, n
