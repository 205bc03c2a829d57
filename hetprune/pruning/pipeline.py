"""The shared pipeline every depth strategy runs, as public building blocks:

    allocate (n_attn, n_act) -> select sites per kind -> remove -> fine-tune
    (KD from the dense model) -> merge -> recipe + report

A strategy usually subclasses [`DepthStrategy`][hetprune.pruning.depth.DepthStrategy] and overrides
[`DepthStrategy.allocate`][hetprune.pruning.depth.DepthStrategy.allocate] only; everything else is held equal across
strategies, which is what makes ``hetprune compare`` fair.

This module gathers the public names of the four modules that hold them, one concern each: the job
(`hetprune.pruning.job`), the steps (`hetprune.pruning.steps`), the depth strategy (`hetprune.pruning.depth`), the report
(`hetprune.pruning.report`) and what a run refuses before it trains (`hetprune.pruning.preflight`). Plugins import them
from ``hetprune.plugin_api``.
"""

from __future__ import annotations

from .depth import DepthStrategy, FixedSplit
from .job import PruneJob, ScoringContext, check_untied, resolve_adapter, scoring_context
from .preflight import check_job
from .report import REPORT_KEYS, PruneResult, Report, legacy_metric, metric_entries
from .steps import (allocation, cost_report, finetune, finetune_and_measure, finish, merge, model_structure,
                    rank_lowest, remove_sites, reported_epoch, select_sites)

__all__ = ["DepthStrategy", "FixedSplit", "PruneJob", "ScoringContext", "check_untied", "resolve_adapter",
           "scoring_context", "REPORT_KEYS", "PruneResult", "Report", "legacy_metric", "metric_entries",
           "allocation", "cost_report", "finetune", "finetune_and_measure", "finish", "merge", "model_structure",
           "rank_lowest", "remove_sites", "reported_epoch", "select_sites", "check_job"]
