"""Durable, append-only, segment-based on-disk spool for the collector.

Design source: ``shared/design/architecture.md`` ("An acknowledged span is never lost"). The
receiver calls :meth:`Spool.append` and acknowledges the OTLP export only after it returns (the
record is then on disk: written and ``fdatasync``-ed); the exporter worker reads with
:meth:`Spool.read_from`, writes to ClickHouse and calls :meth:`Spool.commit`; on start the sidecar
replays :meth:`Spool.pending`. When the spool is full, :meth:`Spool.append` raises
:class:`SpoolFull`, which the receiver maps to the OTLP retryable signal (gRPC
``RESOURCE_EXHAUSTED``, HTTP 429/503 with ``Retry-After``). Delivery is at-least-once: a record
read and written to ClickHouse but not yet committed is replayed after a crash.

Why hand-written: the PyPI candidates (``persist-queue`` file queue, ``queuelib`` disk queues) are
get/ack queues without per-record checksums, sequence numbers to resume from, or torn-tail
recovery, so a small write-ahead log is simpler and easier to reason about than adapting them.

On-disk layout (directory ``D``)::

    D/LOCK                     flock(2)-ed while a Spool has the directory open
    D/00000000000000000001.seg segment; the name is the sequence of its first record (20 digits)
    D/00000000000000000734.seg ... the last segment is the active one (appended to)
    D/checkpoint               committed sequence: b"RSCK" + u64 seq + u32 CRC32 (16 bytes),
                               replaced atomically (write temp + fsync + rename + fsync dir)

Record framing (little-endian, 28-byte header followed by the payload)::

    offset  size  field
    0       4     magic b"RSP1"
    4       4     u32 payload length (bytes)
    8       4     u32 CRC32 (zlib) over bytes 4..7, 12..27 and the payload
    12      8     u64 sequence number (1, 2, 3, ... strictly increasing)
    20      8     u64 append time, nanoseconds since the Unix epoch
    28      len   payload

Recovery on open: every segment is scanned and each record's CRC checked. A record that fails is
resolved by searching forward for the next valid record (by magic + CRC): if one exists the bad
bytes are skipped and counted in :attr:`Spool.corrupt_records`; if none exists in the last segment
the bad bytes are a torn tail (crash mid-write), the file is truncated there and
:attr:`Spool.recovered_torn_records` is incremented. Opening never raises on bad data.

Durability: with ``fsync=True`` an append returns only after ``os.fdatasync`` of its segment
(group commit: concurrent appenders share one sync; one thread syncs while the others wait and
keep writing); new segment files and the checkpoint also fsync the directory. With
``fsync=False`` records survive a process crash (page cache) but not a power loss.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import re
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["HEADER_SIZE", "Spool", "SpoolFull", "SpoolLocked"]

_MAGIC = b"RSP1"
_HEADER = struct.Struct("<4sIIQQ")  # magic, length, crc, seq, ts_ns
_CRC_PREFIX = struct.Struct("<IQQ")  # length, seq, ts_ns: what the CRC covers before the payload
HEADER_SIZE: int = _HEADER.size  # 28 bytes
_MAX_PAYLOAD = 0xFFFFFFFF

_CKPT_MAGIC = b"RSCK"
_CKPT = struct.Struct("<4sQI")  # magic, committed seq, crc32 over magic+seq
_CKPT_NAME = "checkpoint"
_LOCK_NAME = "LOCK"
_SEG_RE = re.compile(r"^(\d{20})\.seg$")

_sync = getattr(os, "fdatasync", os.fsync)


class SpoolFull(Exception):
    """Retryable: the spool holds ``max_bytes`` already; nothing was written.

    The receiver answers gRPC ``RESOURCE_EXHAUSTED`` / HTTP 503 (or 429) with ``Retry-After``.
    Space is freed when :meth:`Spool.commit` covers a whole segment.
    """

    def __init__(self, bytes_used: int, record_bytes: int, max_bytes: int) -> None:
        super().__init__(
            f"spool full: {bytes_used} B used + {record_bytes} B record > max_bytes {max_bytes} B"
        )
        self.bytes_used = bytes_used
        self.record_bytes = record_bytes
        self.max_bytes = max_bytes


class SpoolLocked(Exception):
    """Permanent: another live process (or Spool object) already has this directory open."""


def _record_crc(length: int, seq: int, ts_ns: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(length, seq, ts_ns)))


def _encode(seq: int, ts_ns: int, payload: bytes) -> bytes:
    n = len(payload)
    return _HEADER.pack(_MAGIC, n, _record_crc(n, seq, ts_ns, payload), seq, ts_ns) + payload


def _decode_at(buf: bytes, pos: int, min_seq: int) -> tuple[int, int, int] | None:
    """Parse a record at ``pos``; return (seq, ts_ns, payload length) if valid, else None."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    magic, length, crc, seq, ts_ns = _HEADER.unpack_from(buf, pos)
    if magic != _MAGIC or length > len(buf) - pos - HEADER_SIZE or seq < min_seq:
        return None
    start = pos + HEADER_SIZE
    if _record_crc(length, seq, ts_ns, memoryview(buf)[start : start + length]) != crc:
        return None
    return seq, ts_ns, length


def _seg_name(base: int) -> str:
    return f"{base:020d}.seg"


@dataclass(slots=True)
class _Segment:
    """In-memory index of one segment file (mutable, private to Spool, guarded by its lock)."""

    base: int
    path: str
    size: int = 0
    seqs: array = field(default_factory=lambda: array("Q"))
    offsets: array = field(default_factory=lambda: array("Q"))
    stamps: array = field(default_factory=lambda: array("Q"))


class Spool:
    """Durable FIFO of opaque byte payloads, addressed by sequence number. Thread-safe.

    Args:
        directory: spool directory (created if missing). One open Spool per directory
            (enforced with ``flock``; a second open raises :class:`SpoolLocked`).
        max_bytes: cap on the total size of segment files, in bytes (headers included). An
            append that would exceed it raises :class:`SpoolFull`. Space is only reclaimed per
            whole segment, so keep ``max_bytes`` several times ``segment_bytes``.
        segment_bytes: a segment is rolled when the next record would make it larger (a record
            bigger than this gets a segment of its own).
        fsync: ``True``: :meth:`append` returns after the record is ``fdatasync``-ed (group
            commit across threads). ``False``: after ``write(2)`` only.

    Raises:
        ValueError: on non-positive sizes or ``segment_bytes > max_bytes``.
        SpoolLocked: if the directory is already open.
        OSError: if the directory cannot be created or read.

    Sequence numbers start at 1, grow by one per append and are never reused while any segment
    or the checkpoint survives. Readers see only appended-and-durable records (an append that
    has not returned yet is invisible), and never see committed records.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 1 << 30,
        segment_bytes: int = 64 << 20,
        fsync: bool = True,
    ) -> None:
        if max_bytes <= HEADER_SIZE or segment_bytes <= HEADER_SIZE:
            raise ValueError(f"max_bytes and segment_bytes must exceed {HEADER_SIZE} bytes")
        if segment_bytes > max_bytes:
            raise ValueError(f"segment_bytes ({segment_bytes}) > max_bytes ({max_bytes})")
        self._dir = os.fspath(directory)
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._fsync = fsync
        self._cv = threading.Condition(threading.Lock())
        self._closed = False
        self._failed: OSError | None = None
        self._syncing = False
        self._segments: list[_Segment] = []
        self._fd = -1  # active (last) segment, O_WRONLY | O_APPEND
        self._corrupt = 0
        self._torn = 0

        os.makedirs(self._dir, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self._dir, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolLocked(f"spool directory {self._dir!r} is open elsewhere") from None
        try:
            self._recover()
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            os.close(self._lock_fd)
            raise

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        tmp = os.path.join(self._dir, _CKPT_NAME + ".tmp")
        if os.path.exists(tmp):
            os.unlink(tmp)
        self._committed = self._read_checkpoint()
        bases = sorted(
            int(m.group(1)) for name in os.listdir(self._dir) if (m := _SEG_RE.match(name))
        )
        last_seq = 0
        for i, base in enumerate(bases):
            seg = self._scan(base, is_last=i == len(bases) - 1, min_seq=last_seq + 1)
            if len(seg.seqs):
                last_seq = seg.seqs[-1]
            self._segments.append(seg)
        next_seq = max(last_seq, self._committed) + 1
        if bases:
            next_seq = max(next_seq, bases[-1])
        self._next_seq = next_seq
        self._written_seq = next_seq - 1
        self._durable_seq = next_seq - 1
        if self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
        else:
            self._open_new_segment(next_seq)
        self._delete_committed_segments()

    def _read_checkpoint(self) -> int:
        try:
            with open(os.path.join(self._dir, _CKPT_NAME), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return 0
        if len(data) != _CKPT.size:
            self._corrupt += 1
            return 0
        magic, seq, crc = _CKPT.unpack(data)
        if magic != _CKPT_MAGIC or zlib.crc32(data[:12]) != crc:
            self._corrupt += 1  # replay everything: at-least-once beats loss
            return 0
        return seq

    def _scan(self, base: int, *, is_last: bool, min_seq: int) -> _Segment:
        path = os.path.join(self._dir, _seg_name(base))
        with open(path, "rb") as f:
            buf = f.read()
        seg = _Segment(base=base, path=path, size=len(buf))
        pos = 0
        while pos < len(buf):
            rec = _decode_at(buf, pos, min_seq)
            if rec is None:
                nxt = self._resync(buf, pos + 1, min_seq)
                if nxt is None:
                    if is_last:  # torn tail: a crash mid-write; cut it off
                        self._torn += 1
                        with open(path, "r+b") as f:
                            f.truncate(pos)
                            if self._fsync:
                                os.fsync(f.fileno())
                        seg.size = pos
                    else:
                        self._corrupt += 1
                    break
                self._corrupt += 1
                pos = nxt
                continue
            seq, ts_ns, length = rec
            seg.seqs.append(seq)
            seg.offsets.append(pos)
            seg.stamps.append(ts_ns)
            min_seq = seq + 1
            pos += HEADER_SIZE + length
        return seg

    @staticmethod
    def _resync(buf: bytes, start: int, min_seq: int) -> int | None:
        pos = buf.find(_MAGIC, start)
        while pos != -1:
            if _decode_at(buf, pos, min_seq) is not None:
                return pos
            pos = buf.find(_MAGIC, pos + 1)
        return None

    # ------------------------------------------------------------------ segment files

    def _fsync_dir(self) -> None:
        if not self._fsync:
            return
        dfd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _open_new_segment(self, base: int) -> None:
        """Create and activate an empty segment named ``base``. Caller: lock held, not syncing."""
        path = os.path.join(self._dir, _seg_name(base))
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fsync_dir()
        self._segments.append(_Segment(base=base, path=path))

    def _close_active(self) -> None:
        """Make the active segment durable and close it. Caller holds the lock, not syncing."""
        if self._fd < 0:
            return
        if self._fsync:
            try:
                _sync(self._fd)
            except OSError as e:
                self._failed = e  # the fd stays open; close() releases it
                raise
        os.close(self._fd)
        self._fd = -1
        self._durable_seq = self._written_seq

    def _wait_not_syncing(self) -> None:
        while self._syncing:
            self._cv.wait()

    def _delete_committed_segments(self) -> None:
        """Drop every segment all of whose sequences are <= committed. Caller holds the lock."""
        segs = self._segments
        while segs:
            head = segs[0]
            if len(segs) > 1:
                if segs[1].base - 1 > self._committed:
                    return
            elif self._committed < self._written_seq:
                return  # the active segment still holds pending records
            elif head.size == 0 and head.base >= self._next_seq:
                return  # the active segment is already a fresh, empty one
            else:
                self._wait_not_syncing()
                self._close_active()
                os.unlink(head.path)
                segs.pop(0)
                self._open_new_segment(self._next_seq)
                return
            os.unlink(head.path)
            segs.pop(0)

    # ------------------------------------------------------------------ public API

    def append(self, payload: bytes) -> int:
        """Append one record; return its sequence number once it is durable.

        Args:
            payload: opaque bytes (e.g. a serialized OTLP export request), < 4 GiB.

        Returns:
            The record's sequence number (strictly increasing, gap-free across appends).

        Raises:
            SpoolFull: retryable; ``bytes_used + 28 + len(payload) > max_bytes``. Nothing written.
            ValueError: the spool is closed, or the payload alone can never fit.
            OSError: a write or sync failed. After a failed sync the spool refuses further
                appends (the kernel may have dropped the unsynced pages).
        """
        payload = bytes(payload)
        if len(payload) > _MAX_PAYLOAD:
            raise ValueError("payload larger than 4 GiB")
        rec_len = HEADER_SIZE + len(payload)
        if rec_len > self._max_bytes:
            raise ValueError(f"record of {rec_len} B can never fit in max_bytes {self._max_bytes}")
        with self._cv:
            self._check_usable()
            used = self._bytes_used_locked()
            if used + rec_len > self._max_bytes:
                raise SpoolFull(used, rec_len, self._max_bytes)
            active = self._segments[-1]
            while active.size > 0 and active.size + rec_len > self._segment_bytes:
                if self._syncing:  # never close the fd a syncing thread is using
                    self._cv.wait()
                    self._check_usable()
                    active = self._segments[-1]
                    continue
                self._close_active()
                self._open_new_segment(self._next_seq)
                active = self._segments[-1]
            seq = self._next_seq
            ts_ns = time.time_ns()
            self._write_all(_encode(seq, ts_ns, payload), active)
            self._next_seq = seq + 1
            self._written_seq = seq
            active.seqs.append(seq)
            active.offsets.append(active.size)
            active.stamps.append(ts_ns)
            active.size += rec_len
            if not self._fsync:
                self._durable_seq = seq
                return seq
            # group commit: one thread syncs everything written so far; the others wait
            while self._durable_seq < seq:
                if self._failed is not None:
                    raise OSError(f"spool sync failed earlier: {self._failed}") from self._failed
                if self._syncing:
                    self._cv.wait()
                    continue
                self._syncing = True
                fd, target = self._fd, self._written_seq
                self._cv.release()
                err: OSError | None = None
                try:
                    _sync(fd)
                except OSError as e:
                    err = e
                finally:
                    self._cv.acquire()
                    self._syncing = False
                    if err is None:
                        self._durable_seq = max(self._durable_seq, target)
                    else:
                        self._failed = err
                    self._cv.notify_all()
                if err is not None:
                    raise err
            return seq

    def _write_all(self, data: bytes, seg: _Segment) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:
            try:  # drop the partial record so the next append does not follow garbage
                os.ftruncate(self._fd, seg.size)
            except OSError as e:
                self._failed = e
            raise

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("spool is closed")
        if self._failed is not None:
            raise OSError(f"spool unusable after a failed write/sync: {self._failed}")

    def read_from(self, seq: int, max_records: int = 1024) -> list[tuple[int, bytes]]:
        """Return up to ``max_records`` durable, uncommitted records with sequence >= ``seq``.

        Args:
            seq: first sequence wanted; values <= the committed position start after it.
            max_records: upper bound on the list length (>= 1).

        Returns:
            ``[(sequence, payload), ...]`` in increasing sequence order; empty when nothing newer
            is durable. Records found corrupt at read time are skipped and counted.

        Raises:
            ValueError: the spool is closed or ``max_records < 1``.
        """
        if max_records < 1:
            raise ValueError("max_records must be >= 1")
        with self._cv:
            if self._closed:
                raise ValueError("spool is closed")
            first = max(seq, self._committed + 1)
            last = self._durable_seq
            plan: list[tuple[str, int, list[int], list[int]]] = []
            budget = max_records
            for seg in self._segments:
                if budget == 0 or not len(seg.seqs) or seg.seqs[-1] < first:
                    continue
                i = bisect.bisect_left(seg.seqs, first)
                j = min(bisect.bisect_right(seg.seqs, last), i + budget)
                if i < j:
                    plan.append((seg.path, seg.size, list(seg.seqs[i:j]), list(seg.offsets[i:j])))
                    budget -= j - i
        out: list[tuple[int, bytes]] = []
        bad = 0
        for path, size, seqs, offsets in plan:  # file I/O outside the lock; records are immutable
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                continue  # committed and deleted meanwhile
            with f:
                for want, off in zip(seqs, offsets):
                    f.seek(off)
                    buf = f.read(HEADER_SIZE)
                    if len(buf) == HEADER_SIZE:  # never trust a length beyond the segment end
                        buf += f.read(min(_HEADER.unpack(buf)[1], size - off - HEADER_SIZE))
                    rec = _decode_at(buf, 0, 0)
                    if rec is None or rec[0] != want:
                        bad += 1
                        continue
                    out.append((want, buf[HEADER_SIZE:]))
        if bad:
            with self._cv:
                self._corrupt += bad
        return out

    def pending(self, batch: int = 1024) -> Iterator[tuple[int, bytes]]:
        """Iterate ``(sequence, payload)`` over everything after the last commit, for replay.

        The end is fixed when iteration starts (records appended later are not included); the
        records are read lazily in batches of ``batch``.
        """
        with self._cv:
            end = self._durable_seq
            nxt = self._committed + 1
        while nxt <= end:
            recs = self.read_from(nxt, batch)
            for s, p in recs:
                if s > end:
                    return
                yield s, p
            if not recs:
                return
            nxt = recs[-1][0] + 1

    def commit(self, seq: int) -> None:
        """Mark every record with sequence <= ``seq`` as processed (durably), freeing space.

        The position is written to the checkpoint file atomically (temp + fsync + rename + fsync
        of the directory) before any segment whose records are all <= ``seq`` is deleted.
        Committing at or below the current position is a no-op.

        Raises:
            ValueError: the spool is closed, or ``seq`` is beyond the last durable record.
            OSError: the checkpoint could not be written (the old position stays in force).
        """
        with self._cv:
            if self._closed:
                raise ValueError("spool is closed")
            if seq <= self._committed:
                return
            if seq > self._durable_seq:
                raise ValueError(f"commit({seq}) beyond last durable sequence {self._durable_seq}")
            self._write_checkpoint(seq)
            self._committed = seq
            self._delete_committed_segments()

    def _write_checkpoint(self, seq: int) -> None:
        head = _CKPT_MAGIC + struct.pack("<Q", seq)
        data = _CKPT.pack(_CKPT_MAGIC, seq, zlib.crc32(head))
        final = os.path.join(self._dir, _CKPT_NAME)
        tmp = final + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        self._fsync_dir()

    def write_state(self, name: str, data: bytes) -> None:
        """Replace the small state file ``name`` beside the segments, atomically and durably (temp +
        fsync + rename + fsync of the directory), e.g. what the consumer needs to resume after
        records it has committed. ``name`` must be a plain file name not used by the spool.

        Raises:
            ValueError: the spool is closed, or ``name`` is not a plain, free file name.
            OSError: the file could not be written (the previous version stays in force).
        """
        if os.sep in name or name in (_CKPT_NAME, _LOCK_NAME) or name.startswith(".") or _SEG_RE.match(name) \
                or name.endswith(".tmp"):
            raise ValueError(f"bad state file name {name!r}")
        with self._cv:
            if self._closed:
                raise ValueError("spool is closed")
            final = os.path.join(self._dir, name)
            fd = os.open(final + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(final + ".tmp", final)
            self._fsync_dir()

    def read_state(self, name: str) -> bytes | None:
        """The content of state file ``name`` (see :meth:`write_state`), or None if there is none."""
        try:
            with open(os.path.join(self._dir, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _bytes_used_locked(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def bytes_used(self) -> int:
        """Total size of the segment files, bytes (headers and not-yet-freed committed records)."""
        with self._cv:
            return self._bytes_used_locked()

    @property
    def pending_records(self) -> int:
        """Number of durable records after the committed position."""
        with self._cv:
            c = self._committed
            return sum(len(s.seqs) - bisect.bisect_right(s.seqs, c) for s in self._segments)

    @property
    def oldest_pending_age_s(self) -> float:
        """Age of the oldest uncommitted record in seconds (from its stored append time).

        0.0 when nothing is pending; never negative (clock steps are clamped).
        """
        return self.pending_age_s()

    def pending_age_s(self, after: int = 0) -> float:
        """Age in seconds (from its stored append time) of the oldest uncommitted durable record
        whose sequence is above ``after``; 0.0 when there is none; never negative (clock steps
        are clamped). Cost: a bisection per segment."""
        with self._cv:
            c = max(self._committed, after)
            for s in self._segments:
                i = bisect.bisect_right(s.seqs, c)
                if i < len(s.seqs) and s.seqs[i] <= self._durable_seq:
                    return max(0.0, (time.time_ns() - s.stamps[i]) / 1e9)
            return 0.0

    @property
    def failed(self) -> str | None:
        """Why the spool refuses every append (a write or sync failed: the kernel may have dropped
        unsynced pages, so only a restart, which re-scans the segments, makes it usable), or None."""
        with self._cv:
            return None if self._failed is None else str(self._failed)

    @property
    def committed_seq(self) -> int:
        """Last committed sequence number (0 if none)."""
        with self._cv:
            return self._committed

    @property
    def last_seq(self) -> int:
        """Last durable sequence number appended (0 if none ever)."""
        with self._cv:
            return self._durable_seq

    @property
    def recovered_torn_records(self) -> int:
        """Torn tail records (crash mid-write) truncated away when the spool was opened."""
        with self._cv:
            return self._torn

    @property
    def corrupt_records(self) -> int:
        """Records (or a checkpoint) skipped because their CRC/framing failed, on open or read."""
        with self._cv:
            return self._corrupt

    def close(self) -> None:
        """Sync and close the active segment and release the directory lock. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._wait_not_syncing()
            self._closed = True
            try:
                if self._failed is None:
                    self._close_active()
                elif self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1
            finally:
                os.close(self._lock_fd)  # closing releases the flock
                self._cv.notify_all()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
