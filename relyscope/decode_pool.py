"""Decode spool records in worker processes, results handed back in spool order.

The embedded chDB store can be opened by one process only, so the sidecar's main process keeps
the spool, the store, assembly and inserts; what moves out is the CPU-bound decode of spool
records (the GIL binds threads). :class:`DecodePool` runs a picklable callable ``fn(payload) ->
result`` in ``workers`` processes (multiprocessing ``spawn``: no fork of a process holding chDB,
gRPC and threads). :class:`OrderedPrefetch` keeps a bounded window of records submitted ahead of
the one the caller needs and returns results strictly in sequence order, so whatever the caller
does with them — store, assemble, commit — happens in the same order as with an in-thread
decode; a record is decoded wholly by one process, and a whole trace is still assembled by the
caller alone.

A worker runs ``fn`` with Python's cyclic garbage collector off (everything a decode builds
lives until it is pickled, so collections only re-traverse it) and sends the result back
pickled as one ``bytes``: the pool's manager thread in the calling process then only moves
bytes, and the caller unpickles in its own thread (:meth:`DecodePool.unpack`) — inside its own
GC-off window. Unpickling in the manager thread made it hold the GIL for long stretches while
the calling thread waited for it after every GIL-releasing call (a chDB insert, a zstd
compress); measured in ``bench/README.md``.

Nothing here acknowledges or commits anything: a result lost with a worker (killed, crashed)
is decoded again from the same payload in the calling thread (:meth:`OrderedPrefetch.take`
falls back and restarts the pool), and a crash of the main process leaves the spool as it was.
A worker that hangs (stopped, deadlocked, swapping) is treated the same way after
``timeout_s``: its processes are killed (``ProcessPoolExecutor.shutdown`` would wait for ever on
a stopped process), the record is decoded in the calling thread and the pool restarted, counted
in :attr:`OrderedPrefetch.restarts` — so one stuck process never stops ingest.
Worker processes exit within ``_PARENT_POLL_S`` when the process that started them dies
(``kill -9`` included), so no orphan outlives the sidecar.

Errors: an exception raised by ``fn`` in a worker is re-raised by :meth:`OrderedPrefetch.take`
(as with an in-thread call); a broken pool (a worker died) is not an error to the caller.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from relyscope.memory import gc_paused

__all__ = ["DecodePool", "OrderedPrefetch", "usable_cpus", "resolve_workers"]

log = logging.getLogger("relyscope.decode_pool")

_PARENT_POLL_S = 0.5
#: the longest wait for a new pool's first process to start (spawn + imports: seconds on a loaded
#: machine); ``OrderedPrefetch.timeout_s`` counts only once it has
_START_TIMEOUT_S = 60.0


#: what ``decode_workers = "auto"`` starts on a machine with at least this many usable CPUs: the
#: worker thread's own share of a stored span (~26 us: assembly, inserts, unpickling) is about one
#: decode process's (~28 us), so two processes decode faster than the thread stores and a third
#: would wait (bench/README.md, bench_worker_stages.py --workers 2); more was not measured
AUTO_WORKERS = 2


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup", proc_self_cgroup: str = "/proc/self/cgroup") -> int:
    """CPUs this process may use: its affinity (``os.sched_getaffinity``), bounded by the CPU quota
    of its cgroup or of any ancestor when one is set (the lowest) — cgroup v2 ``cpu.max``
    (``"<quota> <period>"``, or ``max``), or cgroup v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` — rounded down, at least 1. A container limited to 1.5 CPUs on a
    16-core host is 1. Unreadable or malformed cgroup files count as no quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root, proc_self_cgroup)
    if quota is not None:
        n = min(n, int(quota))
    return max(1, n)


def _cgroup_quota(root: str, proc_self_cgroup: str) -> float | None:
    """CPUs granted by the cgroup CPU quota (quota / period), or None when unlimited or unknown:
    the lowest quota of the process's own cgroup (from ``/proc/self/cgroup``) and each of its
    ancestors up to the hierarchy's root (a parent's limit binds its children), v2 and v1."""
    own_v2, own_v1 = "", ""
    try:
        with open(proc_self_cgroup) as f:
            for line in f:
                num, _, rest = line.strip().partition(":")
                controllers, _, path = rest.partition(":")
                if num == "0" and not controllers:
                    own_v2 = path.strip("/")
                elif "cpu" in controllers.split(","):
                    own_v1 = path.strip("/")
    except OSError:
        pass
    found: list[float | None] = []
    for rel in _ancestors(own_v2):  # v2: "<quota> <period>" or "max <period>"
        quota, _, period = (_read(os.path.join(root, rel, "cpu.max")) or "").partition(" ")
        found.append(_ratio(quota, period or "100000"))
    for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # v1: quota (-1: none) and period apart
        for rel in _ancestors(own_v1):
            base = os.path.join(root, d, rel)
            found.append(_ratio(_read(os.path.join(base, "cpu.cfs_quota_us")),
                                _read(os.path.join(base, "cpu.cfs_period_us"))))
    quotas = [q for q in found if q is not None]
    return min(quotas) if quotas else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _ratio(quota: str | None, period: str | None) -> float | None:
    """quota / period in CPUs; None for no quota (``max``, -1) or an unreadable or malformed one."""
    try:
        q, per = float(quota), float(period)
    except (TypeError, ValueError):
        return None
    return q / per if q > 0 and per > 0 else None


def _ancestors(path: str) -> list[str]:
    """A cgroup path and each of its parents up to the root (``""``): ``a/b`` → ``a/b``, ``a``, ``""``."""
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def resolve_workers(setting: int | str, cpus: int | None = None) -> int:
    """The number of decode processes for ``Settings.decode_workers``: an int as given; ``"auto"``
    is :data:`AUTO_WORKERS` when ``cpus`` (default :func:`usable_cpus`) is at least 2, else 1
    (decode in the worker thread: on one CPU a process only adds pickling)."""
    if setting != "auto":
        return int(setting)
    cpus = usable_cpus() if cpus is None else cpus
    return AUTO_WORKERS if cpus >= 2 else 1


def _shipped(fn: Callable[[bytes], Any], payload: bytes) -> bytes:
    """Run in a worker: ``fn(payload)`` with the cyclic GC off (its objects all live until they
    are pickled), returned pickled, so the parent's pool thread only moves bytes."""
    with gc_paused():
        return pickle.dumps(fn(payload), protocol=pickle.HIGHEST_PROTOCOL)


def _touch(fn: Callable) -> None:
    """Warm-up task: unpickling ``fn`` imports its module in the worker; nothing is called."""


def _init_worker(parent_pid: int, fn: Callable) -> None:
    """Worker initializer: the parent decides this process's life (:func:`_watch_parent`); ``fn``
    is unused here, but unpickling it with the initializer's arguments imports its modules as
    the process starts.

    SIGINT is ignored, and SIGTERM is obeyed only when the parent sends it: a Ctrl-C or a stop
    sent to the whole process group (systemd's control-group kill, dumb-init) is the sidecar's to
    handle — it closes the pool as it drains, and a decode process exits on its own once the
    sidecar is gone — while the executor's own ``terminate()`` of a broken pool's processes must
    work. Ignored, it left a process that was writing a result nobody read any more alive for
    ever, and the pool's manager thread, which waits for every process to end, with it: the
    interpreter joins that thread at exit, so the sidecar (or the test run) never exited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(parent_pid)


def _watch_parent(parent_pid: int) -> None:
    """Exit as soon as the parent is gone (its pid is no longer our parent, checked every
    ``_PARENT_POLL_S``) or sends SIGTERM; anyone else's SIGTERM is ignored.

    SIGTERM is blocked in this thread — and so in every thread started after, which inherit the
    mask; the spawn child's initializer runs before any other starts — and taken by one thread
    with ``sigtimedwait``, which names the sender."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a signal set to SIG_IGN is discarded, never waited for
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def run() -> None:
        while True:
            info = signal.sigtimedwait({signal.SIGTERM}, _PARENT_POLL_S)
            if info is not None and info.si_pid == parent_pid:
                os._exit(128 + signal.SIGTERM)  # as the default action would end it
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=run, name="relyscope-parent-watch", daemon=True).start()


def _release_reader(result_queue: Any) -> None:
    """Once every process of a pool is dead: close this process's copy of the write end of the
    pool's result pipe. A process killed while it was writing a result (results are larger than
    the pipe buffer, so a write is not atomic) leaves the executor's manager thread blocked for
    ever reading the rest of that message; with every write end closed its read ends (EOF), the
    thread sees the pool broken and exits. Without this the interpreter never exits (it joins
    that thread) and a graceful stop hangs."""
    writer = getattr(result_queue, "_writer", None)
    if writer is not None:
        try:
            writer.close()
        except OSError:
            pass


class DecodePool:
    """``workers`` processes running ``fn(payload)``; ``fn`` and its results must be picklable.

    ``submit`` returns a :class:`concurrent.futures.Future` holding the result pickled
    (``bytes``); :meth:`unpack` turns it into ``fn``'s result. ``restart`` replaces a broken pool;
    ``close`` stops the processes (pending work is cancelled). Not thread-safe: one caller thread.
    """

    def __init__(self, fn: Callable[[bytes], Any], workers: int, *, start_method: str = "spawn"):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.fn = fn
        self.workers = workers
        self._ctx = multiprocessing.get_context(start_method)
        self._ex = self._new()

    def _new(self) -> ProcessPoolExecutor:
        ex = ProcessPoolExecutor(max_workers=self.workers, mp_context=self._ctx,
                                 initializer=_init_worker, initargs=(os.getpid(), self.fn))
        #: done once a process has started and imported ``fn``'s module (a hang timeout must not
        #: count the spawn)
        self.started: Future = ex.submit(_touch, self.fn)
        # ProcessPoolExecutor spawns a process per submit while none is idle (Python >= 3.9 with
        # spawn): one task each starts every process now, not at the first burst of work
        for _ in range(self.workers - 1):
            ex.submit(_touch, self.fn)
        return ex

    def submit(self, payload: bytes) -> Future:
        """Queue ``fn(payload)``; the future's result is what :meth:`unpack` takes. Raises
        BrokenProcessPool if a worker died (then :meth:`restart`)."""
        return self._ex.submit(_shipped, self.fn, payload)

    @staticmethod
    def unpack(shipped: bytes) -> Any:
        """The result of ``fn`` from what a future of :meth:`submit` holds (its pickle)."""
        return pickle.loads(shipped)

    def restart(self) -> None:
        """Drop the current processes (a broken or hung pool) and start new ones. The old ones are
        SIGKILLed first: a hung or stopped one never exits on its own (SIGKILL ends a stopped
        process too), and their results are lost with the pool anyway."""
        self._kill()
        self._ex.shutdown(wait=False, cancel_futures=True)
        self._ex = self._new()

    def _kill(self) -> None:
        rq = getattr(self._ex, "_result_queue", None)
        for p in list((getattr(self._ex, "_processes", None) or {}).values()):
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        for p in list((getattr(self._ex, "_processes", None) or {}).values()):
            p.join(timeout=5)
        _release_reader(rq)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the processes: pending work cancelled, each given ``timeout_s`` to exit, then
        killed (a stopped or hung one never would: ``shutdown(wait=True)`` would block for ever)."""
        procs = list((getattr(self._ex, "_processes", None) or {}).values())
        rq = getattr(self._ex, "_result_queue", None)  # shutdown() drops the executor's reference
        self._ex.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        _release_reader(rq)

    def pids(self) -> list[int]:
        """Pids of the live worker processes (tests)."""
        return [p.pid for p in (getattr(self._ex, "_processes", None) or {}).values() if p.is_alive()]


class OrderedPrefetch:
    """A window of spool records decoded ahead by a :class:`DecodePool`, taken in sequence order.

    ``take(seq, fetch)`` returns ``(rseq, result, payload)`` for the first record with sequence
    ``>= seq`` (``rseq > seq`` when records in between are unreadable — as the spool's own
    ``read_from`` skips them), or None when ``fetch`` has nothing at or after ``seq``.
    ``fetch(s)`` is the caller's source: ``(rseq, item)`` for the first available record with
    sequence ``>= s`` — ``item`` a payload (``bytes``, decoded by the pool) or an
    already-decoded result (passed through) — or None. A ``seq`` outside the window (the caller
    rewound after a failed store write, or skipped ahead) drops the window and starts over at
    ``seq``, so every take reflects what ``fetch`` returns then.

    Futures left behind (a reset, skipped records) are dropped, never cancelled: on Python 3.11
    (without the fix of CPython gh-107219) a future cancelled while it still waits in
    ``ProcessPoolExecutor``'s queue makes the pool's manager thread die with
    ``InvalidStateError`` if a worker dies before that future is dequeued; the futures after it
    then never complete and the dead pool's queues are never closed. A dropped future still
    counts against the limits below until it is done, and a rewind to its record takes it up
    again (:attr:`reused`) instead of decoding the record twice.

    At most ``max_records`` records and ``max_bytes`` of payload are in flight (at least one).
    ``timeout_s``: the longest wait for one result before the pool counts as hung (see the module
    docstring); None waits for ever.
    """

    def __init__(self, pool: DecodePool, *, max_records: int, max_bytes: int, timeout_s: float | None = None):
        self.pool = pool
        self.timeout_s = timeout_s  # longest wait for one record's result; None: for ever
        self.max_records = max(1, max_records)
        self.max_bytes = max_bytes
        # seq -> (Future or decoded result, payload or None); keys increasing
        self._ahead: collections.OrderedDict[int, tuple[Any, bytes | None]] = collections.OrderedDict()
        self._from = 0  # the window covers sequences [_from, _next)
        self._next = 0
        self._bytes = 0
        #: futures dropped from the window but not done yet (never cancelled: class docstring),
        #: seq -> (future, payload): counted against the limits until done, and taken up again
        #: when a rewind asks for the same record
        self._dropped: dict[int, tuple[Future, bytes]] = {}
        self._dropped_bytes = 0
        self.reused = 0  # dropped futures taken up again by a rewind
        self.fallbacks = 0  # results decoded in the calling thread after a worker died
        self.restarts = 0  # pool restarts (a worker died or hung)
        self.last_restart: tuple[float, str] | None = None  # (time.time(), why) of the latest restart

    def reset(self, seq: int) -> None:
        for rseq, (fut, payload) in self._ahead.items():
            self._drop(rseq, fut, payload)
        self._ahead.clear()
        self._bytes = 0
        self._from = self._next = seq

    def _drop(self, seq: int, fut: Any, payload: bytes | None) -> None:
        """Leave a future out of the window without cancelling it (class docstring); while it
        runs it still counts against ``max_records`` / ``max_bytes``."""
        if isinstance(fut, Future) and payload is not None and not fut.done():
            old = self._dropped.pop(seq, None)
            if old is not None:
                self._dropped_bytes -= len(old[1])
            self._dropped[seq] = (fut, payload)
            self._dropped_bytes += len(payload)

    def _prune(self) -> None:
        for seq, (fut, payload) in list(self._dropped.items()):
            if fut.done() and seq < self._next:  # finished and behind the fill point: not taken up
                del self._dropped[seq]
                self._dropped_bytes -= len(payload)

    def _submit(self, rseq: int, item: bytes) -> Any:
        """A future for ``item``: the dropped one of the same record if there is one (a spool
        record never changes; compared to be sure), else a new submission (None: the pool is
        broken, decode in the calling thread when taken)."""
        got = self._dropped.pop(rseq, None)
        if got is not None:
            self._dropped_bytes -= len(got[1])
            fut, payload = got
            if payload == item and not (fut.done() and fut.exception() is not None):
                self.reused += 1
                return fut
        try:
            return self.pool.submit(item)
        except BrokenProcessPool:
            self._broken()
            return None

    def _fill(self, fetch: Callable[[int], tuple[int, Any] | None]) -> None:
        self._prune()
        while (len(self._ahead) + len(self._dropped) < self.max_records
               and (not self._ahead or self._bytes + self._dropped_bytes < self.max_bytes)) or not self._ahead:
            got = fetch(self._next)
            if got is None:
                return
            rseq, item = got
            if isinstance(item, (bytes, bytearray, memoryview)):
                self._ahead[rseq] = (self._submit(rseq, item), item)
                self._bytes += len(item)
            else:
                self._ahead[rseq] = (item, None)
            self._next = rseq + 1

    def _broken(self, why: str = "a decode worker died") -> None:
        """A worker died (or hung): new processes (:meth:`DecodePool.restart` kills the old
        pool's others: one blocked writing a result nobody reads would keep that pool's manager
        thread, joined at exit, waiting for it); what was in flight on the old ones is submitted
        again (or, if that fails too, decoded in the calling thread when taken)."""
        log.warning("%s; restarting the pool and resubmitting %d records", why, len(self._ahead))
        self._dropped.clear()  # the old pool fails them all (BrokenProcessPool)
        self._dropped_bytes = 0
        self.restarts += 1
        self.last_restart = (time.time(), why)
        try:
            self.pool.restart()
        except Exception:  # noqa: BLE001 - keep going in-thread
            log.exception("restarting the decode pool failed")
        for rseq, (fut, payload) in list(self._ahead.items()):
            if payload is None or (isinstance(fut, Future) and fut.done() and not fut.cancelled()
                                   and fut.exception() is None):
                continue
            try:
                self._ahead[rseq] = (self.pool.submit(payload), payload)
            except Exception:  # noqa: BLE001
                self._ahead[rseq] = (None, payload)

    def _result(self, fut: Future) -> Any:
        """``fut.result()``, waiting at most ``timeout_s`` once the pool has started (FutureTimeout)."""
        if self.timeout_s is None:
            return fut.result()
        if not self.pool.started.done():
            try:
                self.pool.started.result(timeout=max(_START_TIMEOUT_S, self.timeout_s))
            except Exception:  # noqa: BLE001 - a broken or hung start: the timeout below decides
                pass
        return fut.result(timeout=self.timeout_s)

    def take(self, seq: int, fetch: Callable[[int], tuple[int, Any] | None]) -> tuple[int, Any, bytes | None] | None:
        if not (self._from <= seq <= self._next):
            self.reset(seq)
        while self._ahead and next(iter(self._ahead)) < seq:  # processed meanwhile (skipped records)
            rseq, (fut, payload) = self._ahead.popitem(last=False)
            self._bytes -= len(payload) if payload is not None else 0
            self._drop(rseq, fut, payload)
        self._from = seq
        self._fill(fetch)
        if not self._ahead:
            return None
        rseq, (fut, payload) = self._ahead.popitem(last=False)
        self._bytes -= len(payload) if payload is not None else 0
        self._from = rseq + 1
        if payload is None:  # passed through, already decoded
            res = fut
        elif fut is None:
            self.fallbacks += 1
            res = self.pool.fn(payload)
        else:
            try:
                res = self.pool.unpack(self._result(fut))
            except BrokenProcessPool:
                self._broken()
                self.fallbacks += 1
                res = self.pool.fn(payload)
            except FutureTimeout:
                self._broken(f"decode worker gave no result for spool record {rseq} in {self.timeout_s:g} s "
                             "(hung or stopped); killed the decode processes")
                self.fallbacks += 1
                res = self.pool.fn(payload)
        self._fill(fetch)  # keep the workers busy while the caller stores this one
        return rseq, res, payload
