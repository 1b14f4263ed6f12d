"""Trajectory assembly: spans → trials (buffering, out-of-order and late spans, roots, finalization)."""

from relyscope.trajectory.builder import TrajectoryBuilder, assemble, task_fingerprint

__all__ = ["TrajectoryBuilder", "assemble", "task_fingerprint"]
