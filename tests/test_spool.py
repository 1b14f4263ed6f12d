"""Tests for relyscope.collector.spool: durability, recovery, limits, concurrency.

Expected values are worked out by hand from the documented record format (28-byte header +
payload) and from what the test itself appended; the crash test kills a real child process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from relyscope.collector.spool import Spool, SpoolFull, SpoolLocked

HEADER = 4 + 4 + 4 + 8 + 8  # magic, length, crc32, sequence, timestamp (module docstring)
REPO_ROOT = Path(__file__).resolve().parents[1]


def _segments(d: Path) -> list[Path]:
    return sorted(d.glob("*.seg"))


def test_append_read_commit_round_trip(tmp_path: Path) -> None:
    payloads = [f"batch-{i}".encode() * (i + 1) for i in range(10)]
    with Spool(tmp_path, fsync=True) as sp:
        seqs = [sp.append(p) for p in payloads]
        assert seqs == list(range(1, 11))
        assert sp.read_from(1) == list(zip(range(1, 11), payloads))
        expected = [(4, payloads[3]), (5, payloads[4]), (6, payloads[5])]
        assert sp.read_from(4, max_records=3) == expected
        assert sp.read_from(11) == []
        assert sp.pending_records == 10
        assert sp.bytes_used == sum(HEADER + len(p) for p in payloads)
        assert sp.oldest_pending_age_s >= 0.0

        sp.commit(6)
        assert sp.committed_seq == 6
        assert sp.pending_records == 4
        # committed records are never handed out again, even when asked for
        assert sp.read_from(1) == list(zip(range(7, 11), payloads[6:]))
        sp.commit(3)  # going backwards is a no-op
        assert sp.committed_seq == 6
        with pytest.raises(ValueError):
            sp.commit(11)  # beyond anything appended
        sp.commit(10)
        assert sp.pending_records == 0
        assert sp.oldest_pending_age_s == 0.0
        assert list(sp.pending()) == []


def test_reopen_replays_only_uncommitted(tmp_path: Path) -> None:
    sp = Spool(tmp_path, segment_bytes=256, max_bytes=1 << 20)
    for i in range(1, 11):
        assert sp.append(b"r%02d" % i + b"." * 60) == i
    sp.commit(4)
    sp.close()
    sp.close()  # idempotent
    with pytest.raises(ValueError):
        sp.append(b"after close")

    sp = Spool(tmp_path, segment_bytes=256, max_bytes=1 << 20)
    assert sp.committed_seq == 4
    replay = list(sp.pending())
    assert [s for s, _ in replay] == [5, 6, 7, 8, 9, 10]
    assert [p[:3] for _, p in replay] == [b"r05", b"r06", b"r07", b"r08", b"r09", b"r10"]
    assert sp.recovered_torn_records == 0 and sp.corrupt_records == 0
    assert sp.append(b"next") == 11
    sp.commit(11)
    sp.close()

    # everything committed: segments are gone, but sequence numbers still never restart
    sp = Spool(tmp_path, segment_bytes=256, max_bytes=1 << 20)
    assert list(sp.pending()) == []
    assert sp.bytes_used == 0
    assert sp.append(b"later") == 12
    sp.close()


def test_second_open_of_same_directory_is_refused(tmp_path: Path) -> None:
    with Spool(tmp_path):
        with pytest.raises(SpoolLocked):
            Spool(tmp_path)
    Spool(tmp_path).close()  # released on close


def test_spool_full_at_limit_and_cleared_by_commit(tmp_path: Path) -> None:
    # record = 28 + 1000 = 1028 B; a 4096 B segment holds 3 (3084 B, a 4th would be 4112 B);
    # 16384 B holds 15 records (15420 B), the 16th would need 16448 B.
    rec = HEADER + 1000
    sp = Spool(tmp_path, max_bytes=16384, segment_bytes=4096, fsync=False)
    for i in range(1, 16):
        assert sp.append(bytes([i]) * 1000) == i
    assert sp.bytes_used == 15 * rec
    with pytest.raises(SpoolFull):
        sp.append(b"\x00" * 1000)
    assert len(_segments(tmp_path)) == 5

    sp.commit(2)  # the first segment (1..3) still holds record 3: nothing freed
    assert sp.bytes_used == 15 * rec
    with pytest.raises(SpoolFull):
        sp.append(b"\x00" * 1000)

    sp.commit(3)  # whole first segment freed
    assert sp.bytes_used == 12 * rec
    assert len(_segments(tmp_path)) == 4
    assert sp.append(b"\x10" * 1000) == 16  # the refused appends consumed no sequence number
    assert sp.append(b"\x11" * 1000) == 17
    assert sp.append(b"\x12" * 1000) == 18
    with pytest.raises(SpoolFull):
        sp.append(b"\x00" * 1000)
    assert [s for s, _ in sp.read_from(0, max_records=100)] == list(range(4, 19))
    with pytest.raises(ValueError):
        sp.append(b"\x00" * 16384)  # can never fit: permanent, not retryable
    sp.close()


def test_torn_tail_recovers_complete_records(tmp_path: Path) -> None:
    payloads = [bytes([65 + i]) * 500 for i in range(5)]
    with Spool(tmp_path) as sp:
        for p in payloads:
            sp.append(p)
    (seg,) = _segments(tmp_path)
    assert seg.stat().st_size == 5 * (HEADER + 500)
    with open(seg, "r+b") as f:  # crash in the middle of writing record 5's payload
        f.truncate(4 * (HEADER + 500) + HEADER + 200)

    sp = Spool(tmp_path)
    assert sp.recovered_torn_records == 1
    assert sp.corrupt_records == 0
    assert list(sp.pending()) == list(zip(range(1, 5), payloads[:4]))
    assert seg.stat().st_size == 4 * (HEADER + 500)  # torn bytes cut off
    new = sp.append(b"after crash")
    assert new > 4
    assert sp.read_from(new) == [(new, b"after crash")]
    sp.close()

    sp = Spool(tmp_path)  # the repaired file is clean
    assert sp.recovered_torn_records == 0
    assert [s for s, _ in sp.pending()] == [1, 2, 3, 4, new]
    sp.close()


def test_torn_header_recovers(tmp_path: Path) -> None:
    with Spool(tmp_path) as sp:
        sp.append(b"a" * 100)
        sp.append(b"b" * 100)
    (seg,) = _segments(tmp_path)
    with open(seg, "ab") as f:  # half a header, then the crash
        f.write(b"RSP1\x10\x00")
    sp = Spool(tmp_path)
    assert sp.recovered_torn_records == 1
    assert list(sp.pending()) == [(1, b"a" * 100), (2, b"b" * 100)]
    sp.close()


@pytest.mark.parametrize("where", ["payload", "length_field"])
def test_corrupt_middle_record_is_skipped(tmp_path: Path, where: str) -> None:
    payloads = [bytes([97 + i]) * 300 for i in range(5)]
    with Spool(tmp_path) as sp:
        for p in payloads:
            sp.append(p)
    (seg,) = _segments(tmp_path)
    data = bytearray(seg.read_bytes())
    start = data.find(payloads[2])  # record 3's payload
    assert start == 2 * (HEADER + 300) + HEADER
    pos = start + 150 if where == "payload" else start - HEADER + 4  # a payload byte / length
    data[pos] ^= 0x40
    seg.write_bytes(bytes(data))

    sp = Spool(tmp_path)
    assert sp.corrupt_records == 1
    assert sp.recovered_torn_records == 0
    survivors = list(sp.pending())
    assert survivors == [(1, payloads[0]), (2, payloads[1]), (4, payloads[3]), (5, payloads[4])]
    assert sp.append(b"more") == 6
    sp.close()


_CHILD = textwrap.dedent(
    """
    import sys
    from relyscope.collector.spool import Spool
    sp = Spool(sys.argv[1], segment_bytes=32768, max_bytes=1 << 30, fsync=True)
    for i in range(100000):
        seq = sp.append(b"%d:" % i + bytes([i % 251]) * (100 + (i * 7919) % 3000))
        print(seq, i, flush=True)
    """
)


def test_sigkill_never_loses_an_acknowledged_record(tmp_path: Path) -> None:
    pythonpath = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=pythonpath)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    acked: dict[int, int] = {}
    try:
        assert child.stdout is not None
        for line in child.stdout:  # bounded: we stop after 150 acknowledgements
            seq, i = map(int, line.split())
            acked[seq] = i
            if len(acked) >= 150:
                break
        child.send_signal(signal.SIGKILL)
        rest, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, err.decode()
    for line in rest.decode().splitlines():  # acknowledged before the kill, still in the pipe
        if line.strip():
            seq, i = map(int, line.split())
            acked[seq] = i
    assert len(acked) >= 150

    sp = Spool(tmp_path, segment_bytes=32768)
    records = list(sp.pending())
    seqs = [s for s, _ in records]
    assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)
    by_seq = dict(records)
    for seq, i in acked.items():
        assert seq in by_seq, f"acknowledged sequence {seq} lost"
        expected = b"%d:" % i + bytes([i % 251]) * (100 + (i * 7919) % 3000)
        assert by_seq[seq] == expected
    assert sp.corrupt_records == 0  # at most a torn tail, never mid-file damage
    sp.close()


def test_concurrent_appends_unique_and_gap_free(tmp_path: Path) -> None:
    n_threads, per_thread = 8, 40
    results: dict[int, list[tuple[int, bytes]]] = {}
    errors: list[BaseException] = []
    sp = Spool(tmp_path, segment_bytes=8192, fsync=True)
    barrier = threading.Barrier(n_threads)

    def worker(t: int) -> None:
        try:
            barrier.wait(timeout=30)
            out = []
            for k in range(per_thread):
                payload = b"t%d-k%d-" % (t, k) + b"z" * ((t * 37 + k * 11) % 500)
                out.append((sp.append(payload), payload))
            results[t] = out
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    got = sorted(s for out in results.values() for s, _ in out)
    assert got == list(range(1, n_threads * per_thread + 1))
    for out in results.values():  # per thread, order of calls = order of sequence numbers
        assert [s for s, _ in out] == sorted(s for s, _ in out)
    expected = {s: p for out in results.values() for s, p in out}
    assert dict(sp.read_from(1, max_records=10_000)) == expected
    sp.close()

    sp = Spool(tmp_path, segment_bytes=8192)
    assert dict(sp.pending()) == expected
    sp.close()
