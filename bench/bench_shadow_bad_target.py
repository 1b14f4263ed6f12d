"""Shadow replays against a misbehaving replay target: how long one dispatch takes and how much
the sidecar's memory grows, with ``SHADOW_REPLAY_TIMEOUT_S`` = 1 s.

Targets (loopback sockets in this process), each run in a fresh subprocess so its peak RSS is
its own:

- ``ok`` (the baseline): answers a valid replay reply at once;
- ``drip``: sends a chunked body one byte every 0.3 s for 30 s (each byte well within any
  per-read timeout);
- ``huge``: answers 300 MiB of JSON whitespace.

Reported per target: the wall time of ``ShadowStage.dispatch()`` for one replay, the growth of
peak RSS (``ru_maxrss``) during it, and the replay's status — with the ``ok`` run as baseline.

Command: ``.venv/bin/python bench/bench_shadow_bad_target.py`` (~1 min; run against an older
commit to see the figures before the fix).
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def serve(srv: socket.socket, mode: str) -> None:
    while True:
        try:
            c, _ = srv.accept()
        except OSError:
            return
        with c:
            try:
                raw = c.recv(1 << 16)
                while b"\r\n\r\n" not in raw:
                    raw += c.recv(1 << 16)
                head, body = raw.split(b"\r\n\r\n", 1)
                n = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
                while len(body) < n:
                    body += c.recv(1 << 16)
                if mode == "ok":
                    reply = json.dumps({"replay_id": json.loads(body)["replay_id"], "status": "completed"}).encode()
                    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                              % (len(reply), reply))
                elif mode == "drip":
                    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                              b"transfer-encoding: chunked\r\n\r\n")
                    for _ in range(100):
                        c.sendall(b"1\r\n \r\n")
                        time.sleep(0.3)
                elif mode == "huge":
                    size = 300 << 20
                    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % size)
                    for _ in range(size >> 20):
                        c.sendall(b" " * (1 << 20))
            except OSError:
                pass


def one(mode: str) -> dict:
    import dataclasses

    from relyscope.config import Settings
    from relyscope.shadow.stage import ShadowStage
    from relyscope.store import Store
    from test_shadow_units import PROD

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    threading.Thread(target=serve, args=(srv, mode), daemon=True).start()
    with tempfile.TemporaryDirectory() as d:
        store = Store(f"chdb://{d}/data")
        store.insert_trials([dataclasses.replace(PROD, trial_id="p1", end_ns=time.time_ns())])
        stage = ShadowStage(Settings(shadow_targets={"1.0": f"http://127.0.0.1:{srv.getsockname()[1]}/replay"},
                                     shadow_k=1, shadow_families=["nominal"], shadow_replay_timeout_s=1.0),
                            store, proxy_base_url="http://127.0.0.1:9")
        stage.plan_now(trial_ids=["p1"])
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        stage.dispatch()
        took = time.monotonic() - t0
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        row, = stage.ledger.replays()
        srv.close()
        return {"target": mode, "dispatch_s": round(took, 2), "peak_rss_growth_mib": round(grew, 1),
                "status": row["status"]}


def main() -> None:
    if len(sys.argv) > 1:
        print(json.dumps(one(sys.argv[1])))
        return
    for mode in ("ok", "drip", "huge"):
        out = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True, timeout=300)
        print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:])


if __name__ == "__main__":
    main()
