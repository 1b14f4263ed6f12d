"""The bundled demo: a simulated, seeded customer-service agent instrumented with relyscope."""

from __future__ import annotations

from relyscope.demo.agent import run_demo

__all__ = ["run_demo"]
