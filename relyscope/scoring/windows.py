"""Sliding scoring windows: names, parsing and alignment.

A window is named like ``5m``, ``1h``, ``24h``, ``7d`` (``<n>`` then ``s``, ``m``, ``h`` or ``d``)
or ``all`` (all time). The window ending now covers the rollup buckets from ``now − length``
rounded down to its bucket size (:func:`relyscope.scoring.rollup.window_start`): minute buckets
for windows up to 6 h, hour buckets beyond, so e.g. ``5m`` holds the trials that ended in the last
5 to 6 minutes and ``24h`` those of the last 24 to 25 hours.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["parse_window", "parse_windows", "window_name", "DEFAULT_WINDOWS", "MAX_WINDOW_S"]

DEFAULT_WINDOWS: Final = "5m,1h,24h,7d,all"
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RE: Final = re.compile(r"^(\d+)([smhd])$")
#: the longest window (100 years of 365 days, seconds); longer is 'all' (a length past a float's
#: range raised OverflowError: a 500 from the API, a traceback from the CLI)
MAX_WINDOW_S: Final = 100 * 365 * 86400


def parse_windows(spec: str) -> list[tuple[str, float | None]]:
    """``"5m,1h,all"`` → ``[("5m", 300.0), ("1h", 3600.0), ("all", None)]`` (order kept,
    duplicates dropped). Raises ValueError naming the bad entry (empty, zero, unknown unit,
    longer than :data:`MAX_WINDOW_S`)."""
    out: list[tuple[str, float | None]] = []
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            raise ValueError(f"empty window in {spec!r}")
        if name == "all":
            length = None
        else:
            m = _RE.match(name)
            if not m or int(m.group(1)) == 0:
                raise ValueError(f"bad window {name!r}: use <n>s|m|h|d (n > 0) or 'all'")
            seconds = int(m.group(1)) * _UNITS[m.group(2)]
            if seconds > MAX_WINDOW_S:
                raise ValueError(f"bad window {name[:40]!r}{'…' if len(name) > 40 else ''}: longer than 100 "
                                 "years (36500d); use 'all' for all time")
            length = float(seconds)
        if name not in [n for n, _ in out]:
            out.append((name, length))
    return out


def parse_window(spec: str) -> tuple[str, float | None]:
    """One window: ``"1h"`` → ``("1h", 3600.0)``, ``"all"`` → ``("all", None)``. Raises ValueError
    naming the bad entry, or — for a list such as ``"1h,5m"`` — saying that one window is wanted
    (unpacking :func:`parse_windows` answered "too many values to unpack")."""
    windows = parse_windows(spec)
    if len(windows) != 1:
        raise ValueError(f"one window is wanted, got {len(windows)} ({', '.join(n for n, _ in windows)})")
    return windows[0]


def window_name(seconds: float) -> str:
    """The shortest name of a window of ``seconds`` (``3600`` → ``1h``, ``90`` → ``90s``)."""
    s = int(seconds)
    for unit in ("d", "h", "m"):
        if s % _UNITS[unit] == 0:
            return f"{s // _UNITS[unit]}{unit}"
    return f"{s}s"
