"""What a run refuses before anything trains (issue 56): its settings against its model, task and strategy,
checked once its job exists. [`check_job`][hetprune.pruning.preflight.check_job] runs in `hetprune.prune`
(and its ``--plan``), and for every row of a compare or an ablation before the first trains."""

from __future__ import annotations

from ..core.config import SCHEDULES
from ..training.train import check_training_modes
from .job import PruneJob


def check_job(strategy, job: PruneJob) -> None:
    """Refuse now what would fail or be ignored after hours of work: every schedule's training modes on the
    dense model (``kd_token`` without a distillation token, a ``drop_path`` its adapter cannot place), then the
    strategy's own ``check_settings(job)`` where it has one (HetDPT: a ``verify_budget`` too small for its
    candidates' selections, too few points for its predictor)."""
    for section in SCHEDULES:
        check_training_modes(job.dense, job.config.schedule(section), section)
    check = getattr(strategy, "check_settings", None)
    if check is not None:
        check(job)
