"""A global budget of request bytes in flight, shared by both OTLP receivers.

Each receiver reserves a request's bytes before it holds them (HTTP: the declared length, or each
chunk as it streams in; gRPC: the received message) and releases them once ``Pipeline.accept``
returned; ``Pipeline.accept`` also reserves the decompressed body. A reservation that does not fit
is refused at once — the receiver answers the OTLP retryable signal (HTTP 503 + Retry-After,
gRPC RESOURCE_EXHAUSTED + RetryInfo) — so memory for request bodies stays below the budget
whatever the number of concurrent clients. A single request larger than the whole budget is
admitted when nothing else is in flight (it could never fit otherwise; the body limit bounds it).
"""

from __future__ import annotations

import threading

__all__ = ["InflightBudget"]


class InflightBudget:
    """``try_acquire(n) -> bool`` / ``release(n)``. Thread-safe; never blocks.

    Args:
        max_bytes: the budget, bytes (> 0).
    """

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._used = 0
        self.refused = 0  # reservations refused since start
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes reserved now."""
        return self._used

    def try_acquire(self, n: int) -> bool:
        """Reserve ``n`` bytes if they fit (or if nothing is reserved); False (counted) otherwise."""
        if n <= 0:
            return True
        with self._lock:
            if self._used and self._used + n > self.max_bytes:
                self.refused += 1
                return False
            self._used += n
            return True

    def release(self, n: int) -> None:
        """Return ``n`` reserved bytes."""
        if n <= 0:
            return
        with self._lock:
            self._used = max(0, self._used - n)
