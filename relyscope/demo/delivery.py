"""What ``relyscope demo-agent`` sent: spans ended in the agent, and the spans its OTLP exporter
got acknowledged or not — their difference is what the SDK dropped before any export (a full
batch queue)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["CountingExporter", "EndedSpans"]


class CountingExporter(SpanExporter):
    """Wraps a span exporter; ``ok`` / ``failed``: spans of the exports it reported as a success /
    as anything else."""

    def __init__(self, inner: SpanExporter):
        self.inner = inner
        self.ok = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        res = self.inner.export(spans)
        if res == SpanExportResult.SUCCESS:
            self.ok += len(spans)
        else:
            self.failed += len(spans)
        return res

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class EndedSpans(SpanProcessor):
    """Counts the spans that ended (``n``): what the exporter should have been given."""

    def __init__(self) -> None:
        self.n = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.n += 1
