"""Scoring stage of the sidecar (architecture.md: score), separate from the ingest worker."""

from relyscope.scoring.stage import GroupKey, ScoreStage, grade_rows_of, score_rows

__all__ = ["ScoreStage", "GroupKey", "score_rows", "grade_rows_of"]
