"""Replay τ-bench historical trajectories as relyscope-instrumented OTel spans.

Input: a τ-bench ``historical_trajectories/<model>-<domain>.json`` file (a JSON array of
``EnvRunResult`` records: ``task_id``, ``trial``, ``reward``, ``info``, ``traj``; see
/work/shared/data/tau-bench/README.md). Each record becomes one trace:

- root ``invoke_agent tau-bench-<domain>`` (agent version = ``<model>``, ``relyscope.task.id`` =
  ``str(task_id)``, ``relyscope.trial.id`` = ``"{task_id}:{trial}"``, run kind ``offline``) with
  ``relyscope.outcome`` success iff ``|reward − 1| <= 1e-6`` (τ-bench ``run.py::display_metrics``),
  ``relyscope.outcome.score`` = reward (when in [0, 1]) and source ``"tau-bench reward"``;
- one ``chat <model>`` span per assistant message (finish reason ``tool_calls`` or ``stop``; the
  message as ``gen_ai.output.messages`` unless ``include_content=False``);
- one ``execute_tool <name>`` span per tool call with the call id, the arguments JSON string from
  the file unchanged, and the result of the matching tool message, paired by ADJACENCY (the k-th
  tool message after the assistant message answers its k-th call; ids repeat within 49/200 runs).
  A result starting with ``"Error"`` marks the span ERROR with ``error.type = "tool_error"``.

The data has no timestamps; they are synthesized deterministically so order is preserved: run ``r``
(0-based file order) starts at ``base_time_ns + r`` seconds, message ``i`` of its trajectory sits at
``+ (i + 1)`` ms; a chat span lasts 0.4 ms; a tool span runs from 0.5 ms after its assistant
message to 0.4 ms after its result message; the root ends 1 ms after the last message.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opentelemetry.trace import TracerProvider

from relyscope import semconv as sc
from relyscope.instrumentation import agent_run, llm_call, record_outcome, tool_call

__all__ = [
    "BASE_TIME_NS",
    "SUCCESS_TOLERANCE",
    "count_runs",
    "names_from_path",
    "replay_tau_bench",
]

BASE_TIME_NS = 1_732_233_600 * 10**9
"""2024-11-22T00:00:00Z (the day gpt-4o-airline.json was added upstream), in ns."""

SUCCESS_TOLERANCE = 1e-6
"""τ-bench success: ``abs(reward - 1) <= 1e-6`` (tau_bench/run.py::display_metrics)."""

OUTCOME_SOURCE = "tau-bench reward"

_MS = 1_000_000  # ns
_SECOND = 1_000_000_000  # ns

_NAME_RE = re.compile(r"^(?P<model>.+)-(?P<domain>[A-Za-z]+)$")


def names_from_path(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """``(agent_name, model)`` from a file name ``<model>-<domain>.json``.

    ``gpt-4o-airline.json`` → ``("tau-bench-airline", "gpt-4o")``; a name without the pattern
    gives ``("tau-bench", None)``.
    """
    m = _NAME_RE.match(Path(path).stem)
    if not m:
        return "tau-bench", None
    return f"tau-bench-{m.group('domain').lower()}", m.group("model")


def _provider_for(model: str | None) -> str | None:
    if not model:
        return None
    low = model.lower()
    if low.startswith(("gpt", "o1", "o3", "o4", "chatgpt")):
        return "openai"
    if any(k in low for k in ("claude", "sonnet", "haiku", "opus")):
        return "anthropic"
    if "gemini" in low:
        return "gcp.gemini"
    return None


def _load(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:  # both ValueErrors: say which file, and why
        raise ValueError(f"not a UTF-8 JSON file ({e})") from None
    if not isinstance(data, list):
        raise ValueError("expected a JSON array of tau-bench EnvRunResult records")
    return data


def count_runs(path: str | os.PathLike[str]) -> int:
    """Number of runs (records) in the file — the total for a progress bar —, every record checked
    as :func:`replay_tau_bench` checks it, so a bad file fails before anything is sent.

    Raises ValueError if the file is not UTF-8 JSON, not an array, or a record lacks what a run
    needs (naming the record); OSError if unreadable.
    """
    return sum(1 for _ in _records(_load(path)))


def _pair_tool_results(
    traj: list[dict[str, Any]], i: int, n_calls: int
) -> list[tuple[int, dict[str, Any]] | None]:
    """The tool messages answering the n_calls calls of assistant message i, by adjacency."""
    out: list[tuple[int, dict[str, Any]] | None] = []
    j = i + 1
    for _ in range(n_calls):
        if j < len(traj) and traj[j].get("role") == "tool":
            out.append((j, traj[j]))
            j += 1
        else:
            out.append(None)
    return out


def _output_message(msg: dict[str, Any], finish_reason: str) -> list[dict[str, Any]]:
    """An OpenAI chat assistant message in the GenAI semconv ``gen_ai.output.messages`` shape."""
    parts: list[dict[str, Any]] = []
    if msg.get("content"):
        parts.append({"type": "text", "content": msg["content"]})
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": args}
        )
    return [{"role": "assistant", "parts": parts, "finish_reason": finish_reason}]


def _records(data: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The records, each checked for what :func:`_replay_one` reads (ValueError naming the record)."""
    for r, rec in enumerate(data):
        if not isinstance(rec, dict) or not {"task_id", "trial", "reward", "traj"} <= rec.keys():
            raise ValueError(f"record {r}: missing one of task_id, trial, reward, traj")
        reward = rec["reward"]
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"record {r}: reward must be a finite number, got {reward!r:.60}")
        if not isinstance(rec["traj"], list) or not all(isinstance(m, dict) for m in rec["traj"]):
            raise ValueError(f"record {r}: traj must be a list of chat messages (objects)")
        yield r, rec


def _replay_one(
    r: int,
    rec: dict[str, Any],
    *,
    agent_name: str,
    model: str | None,
    provider_name: str | None,
    tracer_provider: TracerProvider,
    base_time_ns: int,
    include_content: bool,
) -> None:
    traj: list[dict[str, Any]] = rec["traj"]
    task_id = str(rec["task_id"])
    reward = float(rec["reward"])
    root_start = base_time_ns + r * _SECOND

    def at(i: int) -> int:
        return root_start + (i + 1) * _MS

    llm_model = model or "unknown"
    with agent_run(
        agent_name,
        task_id=task_id,
        version=model,
        run_kind="offline",
        tracer_provider=tracer_provider,
        start_time=root_start,
    ) as run:
        run.set_attribute(sc.RS_TRIAL_ID, f"{task_id}:{rec['trial']}")
        for i, msg in enumerate(traj):
            if msg.get("role") != "assistant":
                continue
            calls = msg.get("tool_calls") or []
            finish = "tool_calls" if calls else "stop"
            with llm_call(llm_model, provider=provider_name, start_time=at(i)) as chat:
                chat.set_response(model=model, finish_reasons=[finish])
                if include_content:
                    chat.set_output_messages(_output_message(msg, finish))
                chat.set_end_time(at(i) + 4 * _MS // 10)
            for call, paired in zip(calls, _pair_tool_results(traj, i, len(calls)), strict=True):
                fn = call.get("function") or {}
                with tool_call(
                    str(fn.get("name", "unknown")),
                    call_id=call.get("id"),
                    arguments=fn.get("arguments"),
                    tool_type=call.get("type", "function"),
                    start_time=at(i) + _MS // 2,
                ) as tool:
                    if paired is None:
                        tool.set_end_time(at(i) + 9 * _MS // 10)
                        continue
                    j, result_msg = paired
                    content = result_msg.get("content")
                    content = "" if content is None else str(content)
                    tool.set_result(content)
                    if content.startswith("Error"):
                        tool.set_error("tool_error", content)
                    tool.set_end_time(at(j) + 4 * _MS // 10)
        score = reward if 0.0 <= reward <= 1.0 else None
        record_outcome(abs(reward - 1.0) <= SUCCESS_TOLERANCE, score=score, source=OUTCOME_SOURCE)
        run.set_end_time(at(len(traj)))


def replay_tau_bench(
    path: str | os.PathLike[str],
    *,
    tracer_provider: TracerProvider,
    on_progress: Callable[[int], None] | None = None,
    agent_name: str | None = None,
    version: str | None = None,
    base_time_ns: int = BASE_TIME_NS,
    include_content: bool = True,
) -> int:
    """Emit one trace per τ-bench run of ``path`` through ``tracer_provider``; return the run count.

    ``agent_name``/``version`` default to :func:`names_from_path` (``tau-bench-airline``,
    ``gpt-4o``). ``on_progress(done)`` is called after each run with the cumulative number of runs
    emitted. Spans are handed to the provider's processors; the caller flushes/shuts it down.
    Raises ValueError on a file that is not an array of records with task_id/trial/reward/traj.
    """
    derived_name, derived_model = names_from_path(path)
    name = agent_name or derived_name
    model = version or derived_model
    provider_name = _provider_for(model)
    records = list(_records(_load(path)))  # validate the whole file before emitting anything
    done = 0
    for r, rec in records:
        _replay_one(
            r,
            rec,
            agent_name=name,
            model=model,
            provider_name=provider_name,
            tracer_provider=tracer_provider,
            base_time_ns=base_time_ns,
            include_content=include_content,
        )
        done += 1
        if on_progress is not None:
            on_progress(done)
    return done
