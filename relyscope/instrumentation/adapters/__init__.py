"""Framework adapters: task id, outcome and confidence on the spans a framework already emits.

One module per framework, each importing its framework (so import only the one you use):

- :mod:`relyscope.instrumentation.adapters.pydantic_ai` — a pydantic-ai capability;
- :mod:`relyscope.instrumentation.adapters.openai_agents` — an OpenAI Agents SDK trace processor
  (with OpenInference's OTel bridge);
- :mod:`relyscope.instrumentation.adapters.langchain` — a LangChain / LangGraph callback handler
  (with OpenInference's LangChain instrumentation).

Any other framework: put ``relyscope.task.id`` in OTel baggage
(:func:`relyscope.instrumentation.task_baggage` with :class:`~relyscope.instrumentation.BaggageSpanProcessor`),
or open your own span around the framework call and set ``relyscope.task.id`` /
``relyscope.outcome`` / ``relyscope.confidence`` on it (the sidecar honours them on the span around
the trial's root), or wrap the call in :func:`relyscope.instrumentation.agent_run`.
"""

__all__: list[str] = []
