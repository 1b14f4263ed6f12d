"""Attribute names relyscope reads and writes, in one place (conventions.md).

GenAI semantic conventions are at stability `development` and their names move; every name used by
relyscope is a constant here, so a rename in the spec is a one-line change. The instrumentation and
the collector both import this module; it imports nothing.

Follows: OpenTelemetry GenAI semantic conventions as of open-telemetry/semantic-conventions-genai
(post May-2026 move). The pre-move aliases and the other conventions' names (OpenInference,
OpenLLMetry, framework bridges) live in the version table ``relyscope.collector.normalize.versions``.
"""

from __future__ import annotations

from typing import Final

GENAI_SEMCONV_VERSION: Final = "semantic-conventions-genai 2026-05 (development)"

# --- GenAI semconv -------------------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_SYSTEM: Final = "gen_ai.system"  # pre-move name of gen_ai.provider.name
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_AGENT_VERSION: Final = "gen_ai.agent.version"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_INVOCATION_IS_NESTED: Final = "gen_ai.invocation.is_nested"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.usage.cache_write.input_tokens"
GEN_AI_USAGE_REASONING_TOKENS: Final = "gen_ai.usage.reasoning_tokens"
GEN_AI_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"  # legacy
GEN_AI_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"  # legacy
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
GEN_AI_EVALUATION_RESULT_EVENT: Final = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"
ERROR_TYPE: Final = "error.type"

# gen_ai.operation.name values
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_CREATE_AGENT: Final = "create_agent"
OP_INVOKE_WORKFLOW: Final = "invoke_workflow"
OP_HANDLE_TURN: Final = "handle_conversation_turn"
OP_CHAT: Final = "chat"
OP_TEXT_COMPLETION: Final = "text_completion"
OP_GENERATE_CONTENT: Final = "generate_content"
OP_EMBEDDINGS: Final = "embeddings"
OP_EXECUTE_TOOL: Final = "execute_tool"

# --- resource ------------------------------------------------------------------------------------
SERVICE_NAME: Final = "service.name"
SERVICE_VERSION: Final = "service.version"

# --- relyscope extension attributes (conventions.md §2) -----------------------------------------
RS_TASK_ID: Final = "relyscope.task.id"
RS_TRIAL_ID: Final = "relyscope.trial.id"
RS_RUN_KIND: Final = "relyscope.run.kind"
RS_OUTCOME: Final = "relyscope.outcome"
RS_OUTCOME_SCORE: Final = "relyscope.outcome.score"
RS_OUTCOME_SOURCE: Final = "relyscope.outcome.source"
RS_CLAIMED_SUCCESS: Final = "relyscope.claimed_success"
RS_CONFIDENCE: Final = "relyscope.confidence"
RS_DECISION: Final = "relyscope.decision"
RS_DECISION_REASON: Final = "relyscope.decision.reason"
RS_TOOL_SIDE_EFFECT: Final = "relyscope.tool.side_effect"
RS_SHADOW_OF: Final = "relyscope.shadow.of"
RS_PERTURBATION_FAMILY: Final = "relyscope.perturbation.family"
RS_PERTURBATION_STRENGTH: Final = "relyscope.perturbation.strength"
RS_PERTURBATION_SEED: Final = "relyscope.perturbation.seed"
RS_FAULT_TYPE: Final = "relyscope.fault.type"
RS_TRIAL_SEPARATE: Final = "relyscope.trial.separate"  # marks a nested agent run as its own trial
RS_REPLAY_ID: Final = "relyscope.replay.id"  # on shadow/canary replay roots
RS_SANDBOX_MATCH: Final = "relyscope.sandbox.match"  # on replayed tool spans: exact|position|live|none
RS_SANDBOX_RECORDED: Final = "relyscope.sandbox.recorded"  # a side effect recorded, never executed

#: error.type of a replayed tool call the sandbox could not answer (no recorded result).
SANDBOX_MISS: Final = "sandbox_miss"

RUN_KINDS: Final = ("production", "shadow", "canary", "offline")
OUTCOMES: Final = ("success", "failure", "unknown")
DECISIONS: Final = ("act", "ask", "refuse", "stop", "confirm", "recover")
SIDE_EFFECTS: Final = ("none", "read", "write", "irreversible")
PERTURBATION_FAMILIES: Final = ("nominal", "fault", "env", "prompt")

FORMULA_SET: Final = "relyscope-v1"
