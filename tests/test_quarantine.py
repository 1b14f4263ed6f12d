"""A record the store refuses with a data error (StoreRejected: permanent) is quarantined, after a
bounded retry, instead of blocking every record behind it. Runs in a subprocess: chDB allows one
data path per process. (Transient errors are never quarantined: tests/test_store_faults.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


SCRIPT = textwrap.dedent("""
    import json, os, sys
    from relyscope.config import Settings
    from relyscope.pipeline import Pipeline
    from relyscope.store import Store, StoreRejected

    class PoisonStore(Store):
        # a real chDB store that refuses any batch holding a span named "poison" (as ClickHouse
        # refuses data it cannot hold, e.g. TYPE_MISMATCH 53), while answering every other query
        def insert_spans(self, spans):
            if any(s.name == "poison" for s in spans):
                raise StoreRejected("refused: poison", 53)
            return super().insert_spans(spans)

        def insert_span_columns(self, cols):  # the worker's hot path (ingest_decoder=fast) writes this
            if "poison" in cols.name:
                raise StoreRejected("refused: poison", 53)
            return super().insert_span_columns(cols)

    root = sys.argv[1]
    st = PoisonStore(f"chdb://{root}/data")
    p = Pipeline(Settings(store=f"chdb://{root}/data", spool_dir=f"{root}/spool", grace_period_s=0,
                          quarantine_after_s=0, decode_workers=int(sys.argv[2])), st)
    p.start()
    for i, name in enumerate(["good-1", "poison", "good-2"]):
        span = {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": name, "kind": 1,
                "startTimeUnixNano": "1760000000000000000", "endTimeUnixNano": "1760000001000000000"}
        body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
        assert p.accept(body, "application/json").rejected == 0
    ok = p.flush(timeout_s=60)
    names = sorted(r[0] for r in st.query("SELECT SpanName FROM {db}.otel_traces FINAL"))
    quarantined = sorted(os.listdir(f"{root}/spool.quarantine"))  # record + its metadata
    print(json.dumps({"flushed": ok, "names": names, "quarantined": quarantined,
                      "unstorable": p.stats.rejected["unstorable"], "pending": p.spool.pending_records}))
    p.shutdown()
    st.close()
""")


# 2 decode processes: narrowing down re-reads records decoded ahead; they come back in spool order
@pytest.mark.parametrize("workers", [1, 2])
def test_poison_record_is_quarantined_and_later_records_are_stored(tmp_path, workers):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(workers)], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["flushed"] is True
    assert out["names"] == ["good-1", "good-2"]  # the record behind the poison one was stored
    # the poison record, kept for inspection and replay, with the store's error beside it
    assert out["quarantined"] == ["00000000000000000002.json", "00000000000000000002.otlp"]
    assert out["unstorable"] == 1
    assert out["pending"] == 0  # committed past it: it will not block a restart either
