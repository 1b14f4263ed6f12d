"""Process memory tuning for the long-running sidecar: glibc's heap (issue 10: RSS grew with
stored history) and Python's cyclic garbage collector (issue 9: its full scans of long-lived state).

The sidecar's Python objects stay bounded (the finalized-trace cache is counted in real bytes),
but its RSS kept growing between traffic steps in native heap: glibc gives each thread that
allocates its own malloc arena (up to 8 per core), and freed memory inside an arena's heap is
returned to the system only from its top. Two standard glibc controls (``mallopt(3)``,
``malloc_trim(3)``):

- :func:`set_arena_max` — ``mallopt(M_ARENA_MAX, n)``: at most ``n`` arenas, shared by all
  threads. Effective for arenas created after the call: call it at start-up, before the threads
  start (:class:`relyscope.sidecar.Sidecar` does). An explicit ``MALLOC_ARENA_MAX`` environment
  variable (read by glibc itself at process start) wins: then this is not called.
- :func:`trim` — ``malloc_trim(0)``: return the free pages of every arena to the system
  (``madvise(MADV_DONTNEED)``), not only the heap top. :class:`Trimmer` calls it periodically,
  with the embedded store's own purge (chDB's jemalloc: ``SYSTEM JEMALLOC PURGE``).

On a C library other than glibc (musl, macOS) both are no-ops that return False.
Figures: bench/README.md, section ``bench_memory.py``.

- :func:`gc_paused` — the cyclic collector off for one block of work whose objects all live
  until it ends (a worker batch, a decode in a decode process).

- :func:`settle_gc` — a full collection, then ``gc.freeze()``: the objects alive then (the
  scorer's in-memory windows and trajectory samples, the loaded modules) leave the collector's
  generations, so its automatic full (generation 2) collections scan only what was allocated
  since. The scoring stage calls it after its first cycle and then every
  ``gc_freeze_interval_s`` (each call first unfreezes and collects everything, so cyclic garbage
  among formerly frozen objects is freed at the next call at the latest). Measured on the
  1 000 000-trial benchmark: the collector's time per 1 s scoring cycle fell from ~0.135 s
  (a full scan of ~150 000 objects nearly every cycle) to ~0.045 s (bench/README.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import platform
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc malloc.h


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None)  # the process's own symbols: glibc's malloc
    except OSError:
        return None


_LIBC = _glibc()

#: failures in a row after which :class:`Trimmer` stops calling its ``purge``
PURGE_FAILURES_MAX = 5


def set_arena_max(n: int) -> bool:
    """``mallopt(M_ARENA_MAX, n)`` (``n`` ≥ 1). Returns True when glibc accepted it; False on
    another C library, when ``n`` < 1, or when ``MALLOC_ARENA_MAX`` is set in the environment
    (glibc applied that one at start)."""
    if _LIBC is None or n < 1 or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return bool(_LIBC.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(int(n))))


def trim() -> bool:
    """``malloc_trim(0)``: give free heap pages back to the system. True if memory was released,
    False if none was (or not glibc)."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(ctypes.c_size_t(0)))


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for the block, then on again (left off if it was
    off): for work whose objects all live until the block ends, where collections would only
    re-traverse them. The worker's batches and the decode processes use it; the first
    allocation after the block collects once."""
    on = gc.isenabled()
    if on:
        gc.disable()
    try:
        yield
    finally:
        if on:
            gc.enable()


def settle_gc() -> int:
    """Unfreeze, run a full collection, then freeze (``gc.freeze``) every surviving object out of
    the cyclic collector's scans (they are still freed by reference counting). Returns the number
    of objects frozen. Cost: one full collection (~0.1 s with the benchmark's ~150 000 objects)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_settled_at: float | None = None  # time.monotonic() of the last settle_gc in this process
_settle_lock = threading.Lock()


def settle_gc_if_due(interval_s: float) -> bool:
    """:func:`settle_gc` if none ran in this process for ``interval_s`` seconds (or ever); the
    collector is process-wide, so is its rate limit (a process with several scoring stages — the
    tests — settles once per interval, not once per stage). ``interval_s`` 0: never. Returns
    whether it settled."""
    global _settled_at
    if interval_s <= 0:
        return False
    with _settle_lock:
        now = time.monotonic()
        if _settled_at is not None and now - _settled_at < interval_s:
            return False
        settle_gc()
        _settled_at = time.monotonic()
        return True


class Trimmer:
    """A daemon thread calling :meth:`release` every ``interval_s`` seconds until :meth:`stop`
    (not started when ``interval_s`` is 0, or when there is neither glibc nor a ``purge``).
    ``purge``: an optional release run first each time, for memory glibc does not own — the
    sidecar passes :meth:`relyscope.store.Store.release_memory` (embedded chDB allocates
    through its own jemalloc, whose freed pages glibc's trim cannot return). A ``purge`` that
    raises is logged and tried again next time; after :data:`PURGE_FAILURES_MAX` failures in a
    row it is not called again. The trims go on either way.

    ``calls``: releases made; ``trims``: those where glibc released memory; ``purges``: those
    where ``purge`` reported it did; ``purge_failures``: failures in a row so far."""

    def __init__(self, interval_s: float, purge: "Callable[[], bool] | None" = None):
        self.interval_s = interval_s
        self.purge = purge
        self.calls = 0
        self.trims = 0
        self.purges = 0
        self.purge_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relyscope-malloc-trim", daemon=True)

    def start(self) -> "Trimmer":
        if (_LIBC is not None or self.purge is not None) and self.interval_s > 0:
            self._thread.start()
        return self

    def release(self) -> None:
        """One release now: ``purge`` (if any), then :func:`trim`. Raises what :func:`trim`
        raises (nothing on glibc); a failing ``purge`` is logged (see the class docstring)."""
        if self.purge is not None:
            try:
                self.purges += bool(self.purge())
                self.purge_failures = 0
            except Exception:  # noqa: BLE001 - a heap hint never takes the sidecar down
                self.purge_failures += 1
                last = self.purge_failures >= PURGE_FAILURES_MAX
                log.warning("memory purge failed (%d in a row)%s", self.purge_failures,
                            "; not calling it again" if last else "", exc_info=True)
                if last:
                    self.purge = None
        self.trims += trim()
        self.calls += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.release()
            except Exception:  # noqa: BLE001 - never take the sidecar down for a heap hint
                log.exception("malloc_trim failed")
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
