"""Spool records decoded in worker processes (relyscope.decode_pool) equal the in-thread decode.

The oracle is the in-thread call of the same function (``decode_spool_record``, what the worker
thread runs with ``decode_workers = 1``): every payload below — protobuf with every value type,
events, links, rejected and duplicate spans, OTLP/JSON, an unusable body — must come back from the
pool equal field by field, in spool order, also across a rewind (a failed store write), skipped
(unreadable) sequences and a worker process killed with SIGKILL.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from relyscope.collector.otlp import DecodeResult, Limits
from relyscope.decode_pool import DecodePool, OrderedPrefetch
from relyscope.collector.records import decode_spool_record


def _kv(kvs, key, value) -> None:
    a = kvs.add()
    a.key = key
    _set(a.value, value)


def _set(av, v) -> None:
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    elif isinstance(v, str):
        av.string_value = v
    elif isinstance(v, bytes):
        av.bytes_value = v
    elif isinstance(v, dict):
        for k, x in v.items():
            _kv(av.kvlist_value.values, k, x)
    else:
        for x in v:
            _set(av.array_value.values.add(), x)


def proto_record(n: int, salt: int) -> bytes:
    """A protobuf spool record (tag ``P``) of ``n`` spans with every attribute type, events and
    links; span 3 has no trace id (rejected), span 5 repeats span 4's id (duplicate in batch)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    _kv(rs.resource.attributes, "service.name", f"svc-{salt}")
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "pool-test", "1"
    for i in range(n):
        sp = ss.spans.add()
        sp.trace_id = b"" if i == 3 else bytes([1 + salt % 200]) + (i // 4).to_bytes(15, "big")
        sp.span_id = (i if i != 5 else 4).to_bytes(8, "big") if i else b"\x00" * 7 + b"\x09"
        if i % 4:
            sp.parent_span_id = (i - i % 4).to_bytes(8, "big") or b"\x00" * 7 + b"\x09"
        sp.name = ["invoke_agent a", "chat m", "execute_tool t", "chat m"][i % 4]
        sp.kind = i % 5
        sp.start_time_unix_nano = 1_760_000_000_000_000_000 + i * 1000 + salt
        sp.end_time_unix_nano = sp.start_time_unix_nano + (900 if i % 7 else -5)  # end before start
        for k, v in (("gen_ai.operation.name", sp.name.split()[0]), ("text", "é" * (i % 4)),
                     ("gen_ai.usage.input_tokens", 10 + i), ("list", ["a", 1, 2.5]),
                     ("map", {"x": 1, "y": ["z"]}), ("gen_ai.request.temperature", 0.25),
                     ("flag", i % 2 == 0), ("blob", b"\x00\xff")):
            _kv(sp.attributes, k, v)
        ev = sp.events.add()
        ev.name, ev.time_unix_nano = "gen_ai.evaluation.result", sp.end_time_unix_nano
        _kv(ev.attributes, "gen_ai.evaluation.score.value", 0.5)
        ln = sp.links.add()
        ln.trace_id, ln.span_id = b"\x07" * 16, b"\x08" * 8
        sp.status.code = i % 3
        sp.status.message = "boom" if i % 3 == 2 else ""
    return b"P" + req.SerializeToString()


def json_record(salt: int) -> bytes:
    body = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeSpans": [{"scope": {"name": "j"}, "spans": [{
            "traceId": f"{salt + 1:032x}", "spanId": f"{i + 1:016x}", "name": "chat m", "kind": 3,
            "startTimeUnixNano": str(10**18 + i), "endTimeUnixNano": str(10**18 + i + 5),
            "attributes": [{"key": "gen_ai.usage.output_tokens", "value": {"intValue": str(i)}}]}
            for i in range(6)]}]}]}
    return b"J" + json.dumps(body).encode()


RECORDS = [proto_record(40, 1), json_record(2), b"P" + b"\xff\xfe not protobuf", proto_record(13, 3),
           proto_record(1, 4), b"J{not json", proto_record(64, 5)]
LIMITS = Limits(max_attributes=5, max_attribute_length=2)  # limits must reach the workers too


@pytest.fixture(scope="module")
def pool():
    p = DecodePool(functools.partial(decode_spool_record, limits=LIMITS), 2)
    yield p
    p.close()


def _in_thread(payload: bytes) -> DecodeResult:
    return decode_spool_record(payload, LIMITS)


def test_records_are_not_trivial():
    """The oracle itself: the payloads exercise rejection, repairs, limits and the empty result."""
    got = [_in_thread(r) for r in RECORDS]
    # 40 spans: one without a trace id (rejected), one duplicate id in the batch (last wins)
    assert len(got[0].spans) == 38 and [len(g.spans) for g in got[1:]] == [6, 0, 11, 1, 0, 62]
    assert got[0].rejected == 1 and got[0].warnings["duplicate_in_batch"] == 1
    assert got[0].attributes_dropped > 0 and any("truncated_attribute" in s.flags for s in got[0].spans)
    assert any("end_before_start" in s.flags for s in got[0].spans)
    assert got[1].spans and got[1].spans[0].attributes["gen_ai.usage.output_tokens"] == 0
    assert got[2] == DecodeResult() and got[5] == DecodeResult()


def test_pool_results_equal_in_thread_decoding(pool):
    futs = [pool.submit(r) for r in RECORDS]
    for rec, fut in zip(RECORDS, futs):
        assert pool.unpack(fut.result(timeout=120)) == _in_thread(rec)


def _source(records: dict[int, object]):
    def fetch(s: int):
        keys = sorted(k for k in records if k >= s)
        return (keys[0], records[keys[0]]) if keys else None
    return fetch


def test_prefetch_returns_spool_order_across_rewind_and_gaps(pool):
    # seq 4 and 9 unreadable (absent from the source); seq 6 handed over already decoded
    recs = {i: RECORDS[i % len(RECORDS)] for i in range(1, 13) if i not in (4, 9)}
    pre_decoded = _in_thread(RECORDS[0])
    recs[6] = pre_decoded
    fetch = _source(recs)
    pf = OrderedPrefetch(pool, max_records=3, max_bytes=1 << 20)
    seen = []
    seq = 1
    rewound = False
    while (got := pf.take(seq, fetch)) is not None:
        rseq, res, payload = got
        want = recs[rseq]
        assert res == (want if isinstance(want, DecodeResult) else _in_thread(want)), rseq
        assert payload == (None if isinstance(want, DecodeResult) else want)
        seen.append(rseq)
        seq = rseq + 1
        if rseq == 8 and not rewound:  # a failed store write: the caller starts again at 5
            rewound, seq = True, 5
    assert seen == [1, 2, 3, 5, 6, 7, 8, 5, 6, 7, 8, 10, 11, 12]
    assert pf.take(13, fetch) is None


def test_prefetch_survives_a_killed_worker(pool):
    recs = {i: RECORDS[i % len(RECORDS)] for i in range(1, 30)}
    fetch = _source(recs)
    pf = OrderedPrefetch(pool, max_records=6, max_bytes=1 << 30)
    seq, seen = 1, []
    while (got := pf.take(seq, fetch)) is not None:
        rseq, res, _ = got
        assert res == _in_thread(recs[rseq])
        seen.append(rseq)
        seq = rseq + 1
        if rseq == 3:
            pids = pool.pids()
            assert pids
            os.kill(pids[0], signal.SIGKILL)
            time.sleep(0.5)
    assert seen == list(range(1, 30))
    assert pool.pids() and pids[0] not in pool.pids()  # restarted


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except OSError:
        return False


def test_prefetch_kills_and_replaces_stopped_workers_after_the_timeout():
    """SIGSTOP every worker: ``take`` used to wait on ``fut.result()`` for ever. Now, past
    ``timeout_s``, the stopped processes are killed (shutdown would wait on them), the record is
    decoded in the calling thread, the pool restarted and every record still comes back right."""
    p = DecodePool(functools.partial(decode_spool_record, limits=LIMITS), 2)
    stopped: list[int] = []
    try:
        p.started.result(timeout=120)
        recs = {i: RECORDS[i % len(RECORDS)] for i in range(1, 12)}
        fetch = _source(recs)
        pf = OrderedPrefetch(p, max_records=4, max_bytes=1 << 30, timeout_s=1.0)
        rseq, res, _ = pf.take(1, fetch)
        assert (rseq, res) == (1, _in_thread(recs[1])) and pf.restarts == 0
        for _ in range(100):  # processes are spawned on demand: wait for both
            if len(p.pids()) == 2:
                break
            time.sleep(0.1)
        stopped = p.pids()
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        pf.reset(2)  # drop what was prefetched before the stop: the next results need the workers
        t0 = time.monotonic()
        seq, seen = 2, []
        while (got := pf.take(seq, fetch)) is not None:
            rseq, res, _ = got
            assert res == _in_thread(recs[rseq])
            seen.append(rseq)
            seq = rseq + 1
        assert seen == list(range(2, 12))
        assert pf.restarts >= 1 and "hung or stopped" in pf.last_restart[1]
        assert time.monotonic() - t0 < 60  # bounded: not waiting for a SIGCONT
        assert not any(_alive(pid) for pid in stopped)
        assert p.pids() and not set(p.pids()) & set(stopped)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        p.close()


def test_a_worker_runs_fn_with_the_cyclic_gc_off_and_ships_its_result_pickled():
    """The decode runs with the GC off (its objects all live until pickled) and only bytes cross
    back, unpickled by the caller; the worker's GC is on again after each call."""
    import builtins
    import gc
    import pickle

    p = DecodePool(builtins.eval, 1)  # eval(payload bytes): a picklable stand-in decode
    try:
        got = p.submit(b"(__import__('gc').isenabled(), [1, 'two'])").result(timeout=120)
        assert isinstance(got, bytes) and pickle.loads(got) == (False, [1, "two"])
        assert p.unpack(got) == (False, [1, "two"])
        assert p._ex.submit(gc.isenabled).result(timeout=60) is True  # restored after the call
        pf = OrderedPrefetch(p, max_records=2, max_bytes=1 << 20)
        assert pf.take(1, _source({1: b"(1, {'a': 2})"}))[:2] == (1, (1, {"a": 2}))
    finally:
        p.close()


def test_workers_exit_when_their_parent_dies(tmp_path):
    """kill -9 of the process that owns the pool leaves no decode process behind."""
    import subprocess
    import sys

    script = (
        "import functools, sys, time\n"
        "from relyscope.decode_pool import DecodePool\n"
        "from relyscope.collector.records import decode_spool_record\n"
        "from relyscope.collector.otlp import Limits\n"
        "p = DecodePool(functools.partial(decode_spool_record, limits=Limits()), 2)\n"
        "p.submit(b'P').result(60)\n"
        "print(' '.join(map(str, p.pids())), flush=True)\n"
        "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) >= 1
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    deadline = time.monotonic() + 15
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and
                 "zombie" not in open(f"/proc/{p}/status").read().lower()]
    assert not alive, f"decode workers outlived their parent: {alive}"


def test_a_reset_then_a_dead_worker_leaves_the_pools_manager_thread_alive_and_every_future_done():
    """Regression (the thread-exception warning of the test above, seen in every ``make test``):
    ``reset`` cancelled the futures it dropped. A future cancelled while still queued in the
    executor, then a worker death before it was dequeued, made ``ProcessPoolExecutor``'s manager
    thread raise ``InvalidStateError`` in ``terminate_broken`` (CPython gh-107219, unfixed in
    3.11): it died before failing the futures after it and before closing the pool's queues.
    One worker busy for 30 s keeps records 3.. waiting in the executor's queue."""
    import builtins
    import threading

    p = DecodePool(builtins.eval, 1)  # eval(payload bytes): a picklable stand-in decode
    errors: list = []
    old_hook = threading.excepthook
    threading.excepthook = lambda a: errors.append(a.exc_type)
    try:
        p.started.result(timeout=120)
        recs = {1: b"1", **{i: b"__import__('time').sleep(30)" for i in range(2, 9)}}
        pf = OrderedPrefetch(p, max_records=8, max_bytes=1 << 20)
        assert pf.take(1, _source(recs))[:2] == (1, 1)
        manager = p._ex._executor_manager_thread
        futs = [f for f, _ in pf._ahead.values()]
        assert len(futs) == 7
        for _ in range(100):  # record 2 reached the worker
            if futs[0].running():
                break
            time.sleep(0.05)
        pf.reset(100)  # the caller rewound elsewhere: the window is dropped
        for pid in p.pids():
            os.kill(pid, signal.SIGKILL)
        manager.join(30)
        assert not manager.is_alive() and errors == []
        assert all(f.done() and not f.cancelled() and f.exception(0) is not None for f in futs)
    finally:
        threading.excepthook = old_hook
        p.close()


def test_a_rewind_takes_up_the_dropped_futures_and_they_still_count_against_the_window():
    """Dropped (not cancelled) futures must not multiply the work in flight: until done they
    count against ``max_records``, and a rewind to their records reuses them. By hand, with a
    window of 4: records 1–5 submitted, a rewind to 1 resubmits only record 1, then 2–5 are taken
    up again and 6–8 are new: 9 submissions (13 if every rewind decoded its window again)."""
    import builtins

    p = DecodePool(builtins.eval, 1)
    submitted: list[bytes] = []
    real = p.submit
    p.submit = lambda payload: submitted.append(payload) or real(payload)
    try:
        p.started.result(timeout=120)
        recs = {i: f"{i} + 0 * (__import__('time').sleep(0.2) or 0)".encode() for i in range(1, 9)}
        fetch = _source(recs)
        pf = OrderedPrefetch(p, max_records=4, max_bytes=1 << 20)
        assert pf.take(1, fetch)[:2] == (1, 1) and len(submitted) == 5
        seq, seen = 1, []  # the caller rewound: a failed store write
        while (got := pf.take(seq, fetch)) is not None:
            assert len(pf._ahead) + len(pf._dropped) <= 4
            seen.append(got[:2])
            seq = got[0] + 1
        assert seen == [(i, i) for i in range(1, 9)]
        assert len(submitted) == 9 and pf.reused == 4
    finally:
        p.close()


_BIG_MODULE = '''
import os, time
def big(payload: bytes) -> bytes:
    """A result far larger than the pipe buffer; a marker file says it is about to be sent."""
    out = b"x" * (200 << 20)
    open(os.path.join(os.path.dirname(__file__), "sending-%d" % os.getpid()), "w").close()
    return out
'''

_KILL_MID_RESULT = '''
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from bigmod import big
from relyscope.decode_pool import DecodePool, OrderedPrefetch
pool = DecodePool(big, 2)
pf = OrderedPrefetch(pool, max_records=2, max_bytes=1 << 30, timeout_s=3)
pool.started.result(60)
def killer():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = [n for n in os.listdir(sys.argv[1]) if n.startswith("sending-")]
        if names:
            pid = int(names[0].split("-")[1])
            while time.monotonic() < deadline:  # until it is inside write(2) (x86-64: 1, arm64: 64)
                try:
                    with open(f"/proc/{pid}/syscall") as f:
                        nr = f.read().split()[0]
                except (OSError, IndexError):
                    nr = ""
                if nr in ("1", "64"):
                    break
                time.sleep(0.001)
            time.sleep(0.02)  # part of the message is in the pipe, the rest not
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.005)
threading.Thread(target=killer, daemon=True).start()
recs = {0: b"a", 1: b"b"}
for s in (0, 1):
    rseq, res, _ = pf.take(s, lambda q: (q, recs[q]) if q in recs else None)
    assert rseq == s and len(res) == 200 << 20
pf.reset(0)
pool.close()
print("restarts", pf.restarts, flush=True)
'''


def _run_script(script: str, tmp_path, when: str) -> tuple[int, str, str]:
    """Run ``script`` in a Python process of its own (argv[1] = ``tmp_path``): a hang at its exit
    must not hang the test run. Returns (returncode, stdout, stderr); fails past 90 s."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the process did not exit {when}: {out} {err[-2000:]}")
    return proc.returncode, out, err


def test_a_worker_killed_while_sending_its_result_leaves_no_thread_that_blocks_the_exit(tmp_path):
    """h-breaker: kill -9 of a decode process while it wrote a large result left the executor's
    manager thread blocked for ever reading the rest of the message (this process kept a write end
    of the result pipe open): the records came back (decoded in the calling thread after the
    timeout) but the interpreter, which joins that thread at exit, never exited — a sidecar's
    SIGTERM hung. Now the script's records come back and it exits."""
    (tmp_path / "bigmod.py").write_text(_BIG_MODULE)
    rc, out, err = _run_script(_KILL_MID_RESULT, tmp_path, "after its pool was closed")
    assert rc == 0, err[-2000:]
    assert "restarts 1" in out or "restarts 2" in out, (out, err[-2000:])


def test_workers_ignore_a_ctrl_c_or_stop_sent_to_the_whole_process_group():
    """h-breaker: SIGINT / SIGTERM to the process group (Ctrl-C, systemd's control-group kill)
    reached the decode processes too: tracebacks, "a decode worker died", a pool restart during
    the sidecar's own drain. They are the sidecar's to handle: the processes ignore them when
    anyone but their parent sends them (here ``kill(1)``, a process of its own)."""
    import subprocess

    p = DecodePool(functools.partial(decode_spool_record, limits=LIMITS), 2)
    try:
        p.started.result(timeout=120)
        deadline = time.monotonic() + 30
        while len(p.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = p.pids()
        assert len(pids) == 2

        def initialized(pid: int) -> bool:  # the initializer ran: SIGINT ignored, SIGTERM blocked
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f)
            ign, blk = int(fields["SigIgn"], 16), int(fields["SigBlk"], 16)
            return bool(ign & (1 << (signal.SIGINT - 1)) and blk & (1 << (signal.SIGTERM - 1)))

        while not all(initialized(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            for sig in ("-INT", "-TERM"):
                subprocess.run(["kill", sig, str(pid)], check=True, timeout=30)
        time.sleep(1.0)
        assert all(_alive(pid) for pid in pids)
        rec = RECORDS[0]
        assert DecodePool.unpack(p.submit(rec).result(timeout=60)) == _in_thread(rec)
    finally:
        p.close()


def test_a_sigterm_from_the_parent_ends_a_worker():
    """What the executor sends the processes of a broken pool (``terminate()``) must end them:
    see the next test."""
    p = DecodePool(functools.partial(decode_spool_record, limits=LIMITS), 1)
    try:
        p.started.result(timeout=120)
        (pid,) = p.pids()
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        p.close()


_SLOW_BIG_MODULE = '''
import os, time
def slow_big(payload: bytes) -> bytes:
    """Says it is busy (a marker file), works 3 s, then returns far more than the pipe buffer."""
    open(os.path.join(os.path.dirname(__file__), "busy-%d" % os.getpid()), "w").close()
    time.sleep(3)
    return b"x" * (64 << 20)
'''

_BREAK_WHILE_BUSY = '''
import os, signal, sys, time
from concurrent.futures.process import BrokenProcessPool
sys.path.insert(0, sys.argv[1])
from slowbig import slow_big
from relyscope.decode_pool import DecodePool
pool = DecodePool(slow_big, 2)
pool.started.result(60)
deadline = time.monotonic() + 60
while len(pool.pids()) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
fut = pool.submit(b"work")
busy = None
while busy is None and time.monotonic() < deadline:
    names = [n for n in os.listdir(sys.argv[1]) if n.startswith("busy-")]
    busy = int(names[0].split("-")[1]) if names else None
    time.sleep(0.01)
other = next(pid for pid in pool.pids() if pid != busy)
os.kill(other, signal.SIGKILL)
try:
    fut.result(60)
except BrokenProcessPool:
    print("broken", flush=True)
# no pool.close(): what a process that dies with its pool broken leaves is the executor's to end
'''


def test_a_pool_broken_while_a_worker_is_busy_does_not_block_the_exit(tmp_path):
    """The CI of 2026-12-06 hung for an hour after "1456 passed": a test had killed one decode
    process while the other was busy; the broken pool's manager thread ``terminate()``s the
    processes left, but they ignored SIGTERM, so the busy one went on, blocked writing a result
    nobody read any more, and the manager thread waited for it for ever — the interpreter joins
    that thread at exit. Now the worker obeys its parent's SIGTERM and the script exits."""
    (tmp_path / "slowbig.py").write_text(_SLOW_BIG_MODULE)
    rc, out, err = _run_script(_BREAK_WHILE_BUSY, tmp_path, "with its pool broken")
    assert rc == 0 and "broken" in out, (out, err[-2000:])
