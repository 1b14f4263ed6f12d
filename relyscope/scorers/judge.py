"""Optional LLM judge (metrics.md §6 item 3): off by default, consulted last, only for trials whose
outcome nothing else decided. Pure: builds the OpenAI-compatible chat-completions request from a
trial and parses the reply; the pipeline does the HTTP call.

The judge sees the task id, the ordered actions, tool arguments/results (truncated) and errors,
and must answer with a JSON object ``{"success": bool, "score": 0..1, "explanation": str}``.
Its verdict becomes an evaluation named :data:`relyscope.scorers.outcomes.JUDGE_EVALUATION`.
"""

from __future__ import annotations

import json
from typing import Any

from relyscope.model import Evaluation, Trial
from relyscope.scorers.outcomes import JUDGE_EVALUATION

__all__ = ["DEFAULT_RUBRIC", "judge_request", "parse_judge_reply"]

DEFAULT_RUBRIC = (
    "You grade whether an AI agent run accomplished its task. Judge only from the trajectory. "
    'Answer with JSON only: {"success": true|false, "score": <0..1>, "explanation": "<one sentence>"}.'
)


def _short(v: Any, n: int = 400) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    return s if len(s) <= n else s[:n] + "…"


def judge_request(trial: Trial, model: str, rubric: str = DEFAULT_RUBRIC, *, max_steps: int = 60) -> dict:
    """OpenAI chat-completions body (``POST {base}/chat/completions``) asking for a verdict."""
    lines = [f"task: {trial.task_id}", f"agent: {trial.agent_name} {trial.agent_version}", "steps:"]
    for i, s in enumerate(trial.steps[:max_steps]):
        line = f"{i + 1}. {s.action}"
        if s.arguments is not None:
            line += f" args={_short(s.arguments)}"
        if s.result is not None:
            line += f" result={_short(s.result)}"
        if s.error:
            line += f" error={s.error}"
        lines.append(line)
    if len(trial.steps) > max_steps:
        lines.append(f"… {len(trial.steps) - max_steps} more steps")
    return {"model": model, "temperature": 0,
            "messages": [{"role": "system", "content": rubric}, {"role": "user", "content": "\n".join(lines)}]}


def parse_judge_reply(reply: dict) -> Evaluation | None:
    """The judge's evaluation from a chat-completions response, or None when it gave no usable
    verdict (no JSON object, no success/score). Never raises on a malformed reply."""
    try:
        content = reply["choices"][0]["message"]["content"]
        start, end = content.index("{"), content.rindex("}") + 1
        verdict = json.loads(content[start:end])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not isinstance(verdict, dict):
        return None
    success = verdict.get("success")
    score = verdict.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
        score = None
    if not isinstance(success, bool) and score is None:
        return None
    label = None if not isinstance(success, bool) else ("pass" if success else "fail")
    expl = verdict.get("explanation")
    return Evaluation(name=JUDGE_EVALUATION, score=float(score) if score is not None else None, label=label,
                      explanation=str(expl)[:2000] if expl is not None else None)
