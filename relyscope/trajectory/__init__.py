"""Trajectory assembly: spans → trials (buffering, out-of-order and late spans, roots, finalization)."""

from relyscope.trajectory.builder import SUPERSEDED, TrajectoryBuilder, assemble, sessions, task_fingerprint

__all__ = ["TrajectoryBuilder", "assemble", "task_fingerprint", "sessions", "SUPERSEDED"]
