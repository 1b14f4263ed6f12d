"""The demo agent as a real HTTP replay target, in its own process (``relyscope demo`` starts it).

``python -m relyscope.demo.target --otlp http://127.0.0.1:4317 --port 8765 \\
      --version 1.0.0=0 --version 1.0.1=0 --version 1.1.0=-0.35``

serves ``POST /v/{version}/replay`` for each version (the number after ``=`` shifts the
probability that the agent's final action is right: a deliberately worse candidate) and
``GET /healthz``. Each version is the same simulated support agent
(:mod:`relyscope.demo.agent`) behind :class:`relyscope.instrumentation.replay.ReplayApp`; spans go
over OTLP to the sidecar. Prints ``{"listening": port}`` on stdout once the server is up.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from relyscope.instrumentation import configure
from relyscope.instrumentation.replay import ReplayApp, ReplayTask


def _app(versions: dict[str, float], seed: int, tp: Any):
    from relyscope.demo.agent import _run_once, task_by_id

    apps = {}
    for version, quality in versions.items():
        def agent(task: ReplayTask, version: str = version, quality: float = quality) -> None:
            _run_once(task_by_id(task.task_id), task.task_id, 0, seed=seed, agent_name=task.agent or "support-agent",
                      version=version, tracer_provider=tp, request=task.input, quality=quality)
        apps[version] = ReplayApp(agent, tracer_provider=tp)

    async def app(scope, receive, send):
        if scope["type"] == "http":
            parts = scope.get("path", "").strip("/").split("/")
            if len(parts) >= 2 and parts[0] == "v" and parts[1] in apps:
                return await apps[parts[1]](scope, receive, send)
            if parts == ["healthz"]:
                return await next(iter(apps.values()))(scope, receive, send)
            from relyscope.instrumentation.replay import _send_json

            return await _send_json(send, 404, {"error": f"no version at {scope.get('path')}; "
                                                f"serving {sorted(apps)} at /v/<version>/replay"})
        if scope["type"] == "lifespan":
            return await next(iter(apps.values()))(scope, receive, send)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--otlp", required=True, help="OTLP/gRPC endpoint of the sidecar")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--version", action="append", required=True, help="VERSION=QUALITY_SHIFT, repeatable")
    a = ap.parse_args(argv)
    versions = {}
    for v in a.version:
        name, _, q = v.partition("=")
        versions[name] = float(q or 0)
    tp = configure(a.otlp, service_name="support-agent")
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(_app(versions, a.seed, tp), host="127.0.0.1", port=a.port,
                                           log_level="warning", lifespan="on"))
    print(json.dumps({"listening": a.port}), flush=True)
    server.run()
    tp.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
