"""The store does not load pandas: clickhouse-connect imported it on the first insert, pyarrow on
its first array (each +46 MiB RSS for a library relyscope never hands a DataFrame). A fresh
process: one chDB per process."""

from __future__ import annotations

import subprocess
import sys

_PROBE = r"""
import sys
from relyscope.model import CanonicalSpan
from relyscope.store import Store
from relyscope.store.clickhouse import span_columns
st = Store(f"chdb://{sys.argv[1]}/data")
st.insert_gate_verdict(("agent", "v1", "v2", "shadow"), "digest", {"verdict": "pass"})
got = st.latest_gate_verdicts("digest")
span = CanonicalSpan(trace_id="ab" * 16, span_id="cd" * 8, parent_span_id="", name="invoke_agent x", kind=1,
                     start_ns=1_000, end_ns=2_000, attributes={"gen_ai.operation.name": "invoke_agent"})
st.insert_span_columns(span_columns([span]))  # one Arrow block through pyarrow
back = st.load_spans(["ab" * 16])
st.close()
loaded = "pandas" in sys.modules
import pandas  # still importable by anything else in the process
print(loaded, pandas.__name__, got[("agent", "v1", "v2", "shadow")]["verdict"],
      [(s.name, s.start_ns, s.end_ns) for s in back] == [("invoke_agent x", 1000, 2000)])
"""


def test_inserts_arrow_blocks_and_reads_do_not_import_pandas(tmp_path):
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "pandas", "pass", "True"]
