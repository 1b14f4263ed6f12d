import json, subprocess, time, sys
sys.path.insert(0, "/work/wt/live/tests")
from conftest import BIN, TAU_FILE, start_sidecar

def test_tau_dbg(tmp_path):
    sc = start_sidecar(tmp_path)
    try:
        r = subprocess.run([str(BIN), "import", "tau-bench", str(TAU_FILE), "--endpoint", sc.otlp_grpc],
                           capture_output=True, text=True, timeout=300)
        sc.flush()
        rep = sc.report()
        n_rep = [g["trials"] for g in rep["groups"]]
        n_api = len(sc.trials(agent="tau-bench-airline"))
        spans = sc.get("/api/v1/spans").json()
        print("REPORT", n_rep, "API", n_api, "SPANS", spans, "IMPORT", r.stderr[-300:])
        assert n_rep == [200], (n_rep, n_api, spans, r.stderr[-500:])
    finally:
        sc.kill()
