"""``RELYSCOPE_DECODE_WORKERS=auto`` (the default): decode processes when the sidecar may use a
second CPU, by its affinity and its cgroup's CPU quota (issue 13: use every core).

Expected values are worked out by hand from the cgroup files written here (cgroup v2 ``cpu.max``
is ``"<quota> <period>"`` in microseconds or ``max``; v1 splits them into ``cpu.cfs_quota_us``
and ``cpu.cfs_period_us``, -1 for none) and from ``os.sched_getaffinity`` of this process.
The suite itself runs with ``RELYSCOPE_DECODE_WORKERS=1`` (tests/conftest.py); the sidecars below
ask for ``auto`` explicitly.
"""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from relyscope.config import Settings
from relyscope.decode_pool import AUTO_WORKERS, resolve_workers, usable_cpus
from test_durability import (_decode_workers, _post_proto, _start, keys_of, make_trace, metric,  # noqa: F401
                             sidecars, stored_keys, trace_id_of, wait_until)

AFFINITY = len(os.sched_getaffinity(0))


def _cgroup(tmp_path, files: dict[str, str], own: str = "", own_v1: str = "") -> tuple[str, str]:
    """A cgroup tree under tmp_path with these files, and a /proc/self/cgroup naming ``own`` (v2)
    and ``own_v1`` (the v1 cpu controller's cgroup)."""
    root = tmp_path / "cg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(f"4:memory:/elsewhere\n2:cpu,cpuacct:/{own_v1}\n0::/{own}\n")
    root.mkdir(exist_ok=True)
    return str(root), str(proc)


@pytest.mark.parametrize("files, own, own_v1, quota_cpus", [
    ({}, "", "", None),                                              # no cgroup files: affinity only
    ({"cpu.max": "max 100000\n"}, "", "", None),                     # v2, unlimited
    ({"cpu.max": "150000 100000\n"}, "", "", 1),                     # v2, 1.5 CPUs: rounded down to 1
    ({"cpu.max": "50000 100000\n"}, "", "", 1),                      # half a CPU: still at least 1
    ({"cpu.max": "800000 100000\n"}, "", "", 8),                     # 8 CPUs of quota: affinity bounds it
    ({"pod/app/cpu.max": "100000 100000\n", "cpu.max": "max 100000\n"}, "pod/app", "", 1),  # own cgroup first
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", "", 2),  # v1, 2 CPUs
    ({"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, "", "", None),  # v1, none
    ({"cpu.max": "lots of CPUs\n"}, "", "", None),                   # malformed: no quota
    ({"cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "100000\n",                 # v1, own cgroup first
      "cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us": "100000\n",
      "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, "", "kubepods/pod1", 1),
    # h-breaker: a parent's limit binds its children (own cgroup unlimited, a parent at 1 CPU)
    ({"app.slice/svc/cpu.max": "max 100000\n", "app.slice/cpu.max": "100000 100000\n"}, "app.slice/svc", "", 1),
    ({"init.scope/cpu.max": "max 100000\n", "cpu.max": "100000 100000\n"}, "init.scope", "", 1),
    ({"cpu,cpuacct/system.slice/cpu.cfs_quota_us": "100000\n",
      "cpu,cpuacct/system.slice/cpu.cfs_period_us": "100000\n",
      "cpu,cpuacct/system.slice/svc.service/cpu.cfs_quota_us": "-1\n",
      "cpu,cpuacct/system.slice/svc.service/cpu.cfs_period_us": "100000\n"}, "", "system.slice/svc.service", 1),
])
def test_usable_cpus_is_the_affinity_bounded_by_the_cgroup_quota(tmp_path, files, own, own_v1, quota_cpus):
    root, proc = _cgroup(tmp_path, files, own, own_v1)
    want = AFFINITY if quota_cpus is None else max(1, min(AFFINITY, quota_cpus))
    assert usable_cpus(root, proc) == want


def test_auto_is_two_processes_from_two_cpus_and_the_worker_thread_below():
    assert AUTO_WORKERS == 2
    assert resolve_workers("auto", cpus=1) == 1
    assert resolve_workers("auto", cpus=2) == 2
    assert resolve_workers("auto", cpus=16) == 2
    assert resolve_workers(1, cpus=16) == 1  # an explicit number is taken as given
    assert resolve_workers(5, cpus=1) == 5


def test_the_setting_defaults_to_auto_and_says_what_to_change(monkeypatch, tmp_path):
    monkeypatch.delenv("RELYSCOPE_DECODE_WORKERS", raising=False)
    assert Settings().decode_workers == "auto"
    for raw, want in (("auto", "auto"), (" AUTO ", "auto"), ("3", 3), ("64", 64)):
        monkeypatch.setenv("RELYSCOPE_DECODE_WORKERS", raw)
        assert Settings().decode_workers == want, raw
    for raw in ("0", "-1", "65", "two", "", "1.5", "٢", "９", "²"):  # int() takes the first two
        monkeypatch.setenv("RELYSCOPE_DECODE_WORKERS", raw)
        with pytest.raises(ValidationError) as err:
            Settings()
        msg = " ".join(str(err.value).split())
        assert "decode_workers" in msg and "expected 'auto' or a number of decode processes" in msg, raw
    monkeypatch.delenv("RELYSCOPE_DECODE_WORKERS")
    with pytest.raises(ValidationError):
        Settings(decode_workers=True)


@pytest.mark.skipif(AFFINITY < 2, reason="needs 2 CPUs")
def test_a_sidecar_on_two_cpus_decodes_in_processes_by_default(tmp_path, sidecars):
    sc = _start(sidecars, tmp_path, RELYSCOPE_DECODE_WORKERS="auto")
    traces = [make_trace(trace_id_of(7, i), task=f"t{i % 2}") for i in range(6)]
    for spans in traces:
        assert _post_proto(sc, spans).status_code == 200
    want = set().union(*(keys_of(s) for s in traces))
    wait_until(lambda: want <= stored_keys(sc), 30, "spans stored")
    assert metric(sc, "relyscope_decode_workers") == 2
    assert len(_decode_workers(sc)) == 2


@pytest.mark.skipif(AFFINITY < 2, reason="needs 2 CPUs")
def test_auto_starts_both_decode_processes_before_any_work(tmp_path, sidecars):
    """The gauge says 2, so 2 processes run — also on an idle sidecar (the pool used to spawn its
    second process only once a backlog built up)."""
    sc = _start(sidecars, tmp_path, RELYSCOPE_DECODE_WORKERS="auto")
    assert metric(sc, "relyscope_decode_workers") == 2
    wait_until(lambda: len(_decode_workers(sc)) == 2, 30, "2 decode processes on an idle sidecar")


def test_a_sidecar_pinned_to_one_cpu_decodes_in_the_worker_thread(tmp_path, sidecars):
    from relyscope.testing import start_sidecar
    sc = start_sidecar(tmp_path, extra_env={"RELYSCOPE_DECODE_WORKERS": "auto"}, cpu=0)
    sidecars.append(sc)
    spans = make_trace(trace_id_of(7, 99), task="t0")
    assert _post_proto(sc, spans).status_code == 200
    wait_until(lambda: keys_of(spans) <= stored_keys(sc), 30, "spans stored")
    assert metric(sc, "relyscope_decode_workers") == 1
    assert _decode_workers(sc) == []


def test_a_bad_decode_workers_value_stops_the_start_with_the_field_named(tmp_path):
    from relyscope.testing import start_sidecar
    with pytest.raises(RuntimeError) as err:
        start_sidecar(tmp_path, extra_env={"RELYSCOPE_DECODE_WORKERS": "many"}, timeout_s=30)
    msg = " ".join(str(err.value).split())  # the CLI wraps its message
    assert "RELYSCOPE_DECODE_WORKERS='many'" in msg and "expected 'auto' or a number of decode processes" in msg


def test_auto_decodes_in_the_worker_thread_where_processes_cannot_start(tmp_path, monkeypatch, caplog):
    """A container without POSIX semaphores (no /dev/shm) cannot start a process pool: with
    ``auto`` the sidecar still starts and stores, decoding in the worker thread, and says why;
    an explicit number of processes fails the start instead. The failure is injected at the
    pool's construction (such a container cannot be made here without privileges)."""
    import relyscope.pipeline as pipeline_mod
    from relyscope.pipeline import Pipeline
    from relyscope.store import Store

    def no_semaphores(*a, **k):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(pipeline_mod, "DecodePool", no_semaphores)
    monkeypatch.setattr(pipeline_mod, "resolve_workers", lambda setting: 2 if setting == "auto" else int(setting))
    store = Store(f"chdb://{tmp_path}/data", database="auto_fallback")
    try:
        p = Pipeline(Settings(store=store.dsn, spool_dir=str(tmp_path / "spool"), decode_workers="auto",
                              grace_period_s=0.0, score_interval_s=3600), store)
        p.start()
        try:
            assert p.decode_workers == 1
            assert "decoding in the worker thread" in caplog.text and "Function not implemented" in caplog.text
            from test_durability import otlp_proto as proto
            spans = make_trace(trace_id_of(7, 55), task="t0")
            assert p.accept(proto(spans), "application/x-protobuf").rejected == 0
            assert p.flush(30)
            assert {tuple(k) for k in store.span_keys()} >= keys_of(spans)
        finally:
            p.shutdown()
        p2 = Pipeline(Settings(store=store.dsn, spool_dir=str(tmp_path / "spool2"), decode_workers=2,
                               score_interval_s=3600), store)
        with pytest.raises(OSError):
            p2.start()
        p2.shutdown()
    finally:
        store.close()
