"""glibc heap tuning (relyscope.memory, issue 10): the arena cap really caps the arenas glibc
creates (counted in glibc's own ``malloc_info`` report, in a fresh process), ``malloc_trim``
runs, the periodic trimmer stops when asked. No RSS figures here: those are in
bench/bench_memory.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from relyscope import memory
from relyscope.config import Settings

glibc = pytest.mark.skipif(memory._LIBC is None, reason="glibc only")

# Six live threads each allocate blocks above pymalloc's 512 B limit (so from glibc), then glibc's
# malloc_info(3) XML lists one <heap nr=...> per arena.
_PROBE = r"""
import ctypes, sys, tempfile, threading
from relyscope import memory
cap = int(sys.argv[1])
if cap:
    assert memory.set_arena_max(cap)
alive = threading.Barrier(6)
def work():
    keep = [bytes(2000 + i) for i in range(200)]
    alive.wait()  # all six hold their arena at once (a finished thread's arena is reused)
ts = [threading.Thread(target=work) for _ in range(6)]
for t in ts: t.start()
for t in ts: t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile(suffix=".xml") as f:
    fp = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fp))
    libc.fclose(ctypes.c_void_p(fp))
    print(open(f.name).read().count("<heap nr="))
"""


def _arenas(cap: int) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(cap)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


@glibc
def test_arena_cap_limits_the_arenas_glibc_creates():
    assert _arenas(0) >= 4  # glibc's default: a new arena for (nearly) every allocating thread
    assert _arenas(2) <= 2


@glibc
def test_explicit_environment_variable_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.set_arena_max(2) is False  # glibc applied MALLOC_ARENA_MAX=4 at start
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert memory.set_arena_max(0) is False  # 0 means "glibc's default": nothing to set


@glibc
def test_trim_runs_and_trimmer_stops():
    junk = [bytes(5000) for _ in range(2000)]  # ~10 MB from glibc, then freed
    del junk
    assert isinstance(memory.trim(), bool)
    t = memory.Trimmer(0.01).start()
    deadline = time.monotonic() + 10
    while t.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.stop()
    assert t.calls >= 2 and not t._thread.is_alive()
    assert memory.Trimmer(0).start()._thread.is_alive() is False  # 0: never


def test_trimmer_runs_the_purge_and_gives_up_on_it_only_after_failures_in_a_row():
    calls: list[int] = []
    t = memory.Trimmer(0, purge=lambda: calls.append(1) or True)
    t.release()
    t.release()
    assert (t.calls, t.purges, len(calls)) == (2, 2, 2)

    fails = iter([True, True, False] + [True] * 10)  # True: this call raises

    def flaky() -> bool:
        if next(fails):
            raise RuntimeError("store unavailable for a moment")
        return True

    t = memory.Trimmer(0, purge=flaky)
    for _ in range(3):  # two failures, then one that works: the count starts over
        t.release()
    assert (t.purges, t.purge_failures, t.purge is flaky) == (1, 0, True)
    for _ in range(memory.PURGE_FAILURES_MAX - 1):
        t.release()
    assert t.purge is flaky and t.purge_failures == memory.PURGE_FAILURES_MAX - 1
    t.release()  # the 5th failure in a row: not called again; the trims go on
    t.release()
    assert t.purge is None and t.calls == 3 + memory.PURGE_FAILURES_MAX + 1


def test_a_trimmer_with_a_purge_starts_and_stops():
    t = memory.Trimmer(0.01, purge=lambda: True).start()
    deadline = time.monotonic() + 10
    while t.purges < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.stop()
    assert t.purges >= 3 and not t._thread.is_alive()


_PURGE_PROBE = r"""
import sys
from relyscope.store import Store
store = Store(f"chdb://{sys.argv[1]}/data")
first = store.release_memory()
store.close()
print(first, store.release_memory())
"""


def test_an_embedded_store_purges_chdbs_allocator_and_a_closed_one_does_not(tmp_path):
    """``SYSTEM JEMALLOC PURGE`` is accepted by the chDB the project pins (a build without
    jemalloc would refuse it: the test would then fail, not pass silently). In a subprocess: one
    chDB data directory per process."""
    out = subprocess.run([sys.executable, "-c", _PURGE_PROBE, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_defaults_cap_arenas_and_trim():
    s = Settings()
    assert s.malloc_arena_max == 2 and s.malloc_trim_interval_s == 30.0


_GC_PROBE = r"""
import gc, sys, tempfile, weakref
from relyscope import memory
from relyscope.config import Settings
from relyscope.scoring.stage import ScoreStage
from relyscope.store import Store

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a reference cycle: only the cyclic collector frees it
dead = weakref.ref(a)
del a, b
gc.disable()  # no automatic collection: only settle_gc may free the cycle
interval = float(sys.argv[1])
assert gc.get_freeze_count() == 0
calls = []
real = memory.settle_gc
memory.settle_gc = lambda: calls.append(1) or real()
with tempfile.TemporaryDirectory() as d:
    s = Settings(store=f"chdb://{d}/data", gc_freeze_interval_s=interval, n_boot=10)
    store = Store(s.store)
    stage = ScoreStage(s, store, None)
    stage.rescore(all_groups=True)
    first = gc.get_freeze_count()
    stage.rescore()  # within the interval: no second settle
    print(first, len(calls), dead() is None)
    gc.unfreeze()
    store.close()
"""


def test_the_scoring_stage_settles_the_cyclic_gc_after_its_first_cycle_and_not_every_cycle():
    """After its first cycle the stage runs a full collection (garbage cycles are freed) and
    freezes the survivors out of the collector's scans; the next cycle within
    RELYSCOPE_GC_FREEZE_INTERVAL_S does not do it again; 0 turns it off. In a fresh process:
    freezing is process-wide."""
    def run(interval: float) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _GC_PROBE, str(interval)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    frozen, settles, freed = run(3600.0)
    assert int(frozen) > 1000 and settles == "1" and freed == "True"
    assert run(0.0) == ["0", "0", "False"]


def test_settle_gc_if_due_is_rate_limited_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "settle_gc", lambda: calls.append(1) or 0)
    monkeypatch.setattr(memory, "_settled_at", None)
    assert memory.settle_gc_if_due(3600.0) and not memory.settle_gc_if_due(3600.0)
    assert not memory.settle_gc_if_due(0.0)
    monkeypatch.setattr(memory, "_settled_at", time.monotonic() - 3601)
    assert memory.settle_gc_if_due(3600.0)
    assert len(calls) == 2
    assert Settings().gc_freeze_interval_s == 3600.0
