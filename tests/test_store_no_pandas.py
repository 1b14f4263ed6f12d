"""The store does not load pandas (clickhouse-connect imported it on the first insert: +46 MiB
RSS for a library relyscope never hands a DataFrame). A fresh process: one chDB per process."""

from __future__ import annotations

import subprocess
import sys

_PROBE = r"""
import sys
from relyscope.store import Store
st = Store(f"chdb://{sys.argv[1]}/data")
st.insert_gate_verdict(("agent", "v1", "v2", "shadow"), "digest", {"verdict": "pass"})
got = st.latest_gate_verdicts("digest")
st.close()
print("pandas" in sys.modules, got[("agent", "v1", "v2", "shadow")]["verdict"])
"""


def test_an_insert_and_a_read_do_not_import_pandas(tmp_path):
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "pass"]
