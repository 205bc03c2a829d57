"""What a run refuses before anything trains (issue 56): its settings against its model, task and strategy,
checked once its job exists. [`check_job`][hetprune.pruning.preflight.check_job] runs in `hetprune.prune`
(and its ``--plan``), and for every row of a compare or an ablation before the first trains."""

from __future__ import annotations

from ..core.config import SCHEDULES
from ..core.errors import HetpruneError
from ..training.train import check_source, check_training_modes
from .job import PruneJob


def check_job(strategy, job: PruneJob) -> list | None:
    """Refuse now what would fail or be ignored after hours of work: every schedule's training modes on the
    dense model (``kd_token`` without a distillation token, a ``drop_path`` its adapter cannot place) and its
    options against the task's batches (mixup or ``accum_steps`` on a Task's own loader: `check_source`), then
    the strategy's own ``check_settings(job)`` where it has one (HetDPT: a checks budget too small for its
    candidates' selections, too few points for its predictor), then the strategy's plan of the run, which
    builds every component the run will (a plugin that breaks its Protocol is refused by name here, as
    ``--plan`` refuses it, not after stage 1). Returns the plan's steps (None: a strategy that plans nothing)."""
    for section in SCHEDULES:
        cfg = job.config.schedule(section)
        check_training_modes(job.dense, cfg, section)
        if not job.task.own_finetune:   # a task's own loop takes the schedule as it is
            try:
                check_source(job.task.source(), cfg)
            except HetpruneError as exc:
                raise HetpruneError(f"{section}: {exc}") from None
    check = getattr(strategy, "check_settings", None)
    if check is not None:
        check(job)
    return list(strategy.plan(job)) if hasattr(strategy, "plan") else None
