"""Scoring stage: reliability metrics (``metrics``), task-clustered bootstrap (``bootstrap``) and
the per-group reliability profile (``profile``) of formula set ``relyscope-v1`` (metrics.md).

Import submodules for the full API; the names below are the usual entry points.
"""

from relyscope.scorers.bootstrap import BootstrapCI, DeltaCI, bootstrap_mean, bootstrap_ratio, paired_bootstrap, paired_bootstrap_mean
from relyscope.scorers.metrics import MetricResult
from relyscope.scorers.profile import GroupScore, MetricValue, metric_keys, score_group

__all__ = [
    "BootstrapCI",
    "DeltaCI",
    "GroupScore",
    "MetricResult",
    "MetricValue",
    "bootstrap_mean",
    "bootstrap_ratio",
    "metric_keys",
    "paired_bootstrap",
    "paired_bootstrap_mean",
    "score_group",
]
