"""A deterministic refund agent for shadow-replay tests: a real process, real tools.

``get_order`` (read) reads an in-memory order table; ``issue_refund`` (irreversible) appends a
line to ``--effects`` — the side effect a replay must never cause. The agent parses the order id
from the request, reads the order, retries a failed tool call up to twice, and refunds the order
total (``--worse``: half of it, the deliberately wrong candidate). Production runs verify the
outcome themselves (the refund line matches the order total); replays leave the outcome to the
sidecar (side-effect equivalence, metrics.md §6 item 4).

Usage:
    python -m tests.replay_agents.refund_agent prod  --otlp URL --effects FILE --version V --runs N
    python -m tests.replay_agents.refund_agent serve --otlp URL --effects FILE --version V --port P
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from relyscope.instrumentation import agent_run, configure, record_outcome, tool_call
from relyscope.instrumentation.replay import ReplayApp, ToolFault, current_replay

ORDERS = {f"ORD-{1000 + i}": {"order_id": f"ORD-{1000 + i}", "total_amount": 10.0 + 5 * i,
                              "placed_at": "2026-11-20T10:00:00Z", "status": "delivered"} for i in range(40)}
EFFECTS = "effects.log"
WORSE = False
EXTRA_TOOL = False
HUGE_CALL = False
DOUBLE_REFUND = False


@tool_call("get_order", side_effect="read")
def get_order(order_id: str) -> dict:
    return dict(ORDERS[order_id])


@tool_call("issue_refund", side_effect="irreversible")
def issue_refund(order_id: str, amount: float) -> dict:
    with open(EFFECTS, "a") as f:
        f.write(json.dumps({"order_id": order_id, "amount": amount}) + "\n")
    return {"ok": True, "refund_id": f"RF-{order_id}"}


@tool_call("get_customer", side_effect="read")
def get_customer(order_id: str) -> dict:
    return {"customer_id": "CUST-1", "order_id": order_id}


def _retry(fn, *args):
    last = None
    for _ in range(3):
        try:
            out = fn(*args)
        except ToolFault as e:  # a real agent catches its tool client's errors
            last = e
            continue
        if isinstance(out, str):  # a body that is not JSON: treat as a failed call
            try:
                out = json.loads(out)
            except ValueError:
                last = ValueError("malformed tool result")
                continue
        return out
    raise RuntimeError(f"tool kept failing: {last}")


RUN_KIND = "production"


def run_task(task_id: str, request: str, version: str) -> bool:
    with agent_run("refund-agent", task_id=task_id, version=version, input=request, run_kind=RUN_KIND):
        m = re.search(r"ORD-\d+", request)
        if HUGE_CALL:  # a tool call whose arguments exceed what the proxy reads (1 MiB): refused
            try:
                get_order(m.group(0) + " " * (2 << 20))
            except ToolFault:
                pass
        order = _retry(get_order, m.group(0))
        if EXTRA_TOOL:  # a newer version that also looks up the customer (no recording of that)
            try:
                get_customer(order["order_id"])
            except ToolFault:
                pass
        total = order.get("total_amount")
        amount = round(float(total) * (0.5 if WORSE else 1.0), 2)
        _retry(issue_refund, order["order_id"], amount)
        if DOUBLE_REFUND:  # a newer version that also refunds a goodwill 1.00 (production never did)
            _retry(issue_refund, order["order_id"], 1.0)
        if current_replay() is None:  # the production environment check
            record_outcome(abs(amount - ORDERS[order["order_id"]]["total_amount"]) < 1e-9, source="db_state")
    return True


def main(argv: list[str] | None = None) -> int:
    global EFFECTS, WORSE, EXTRA_TOOL, RUN_KIND, HUGE_CALL, DOUBLE_REFUND
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["prod", "serve"])
    ap.add_argument("--otlp", required=True)
    ap.add_argument("--effects", required=True)
    ap.add_argument("--version", default="1.0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--worse", action="store_true")
    ap.add_argument("--extra-tool", action="store_true")
    ap.add_argument("--huge-call", action="store_true", help="first call a tool with 2 MiB of arguments")
    ap.add_argument("--double-refund", action="store_true", help="also refund a goodwill 1.00 after the refund")
    ap.add_argument("--run-kind", default="production", help="production or canary (canary traffic)")
    a = ap.parse_args(argv)
    EFFECTS, WORSE, EXTRA_TOOL, RUN_KIND, HUGE_CALL = a.effects, a.worse, a.extra_tool, a.run_kind, a.huge_call
    DOUBLE_REFUND = a.double_refund
    tp = configure(a.otlp, service_name="refund-service", set_global=True)
    if a.mode == "prod":
        for t in range(a.tasks):
            oid = f"ORD-{1000 + t}"
            for _ in range(a.runs):
                run_task(f"refund-{oid}", f"Please refund order {oid}, it arrived broken.", a.version)
        tp.force_flush()
        tp.shutdown()
        return 0
    import uvicorn

    def agent(task):
        run_task(task.task_id, task.input or "", a.version)

    app = ReplayApp(agent, tracer_provider=tp)
    config = uvicorn.Config(app, host="127.0.0.1", port=a.port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    print(json.dumps({"listening": a.port}), flush=True)
    server.run()
    tp.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
