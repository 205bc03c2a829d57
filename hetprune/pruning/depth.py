"""[`DepthStrategy`][hetprune.pruning.depth.DepthStrategy]: depth pruning with a rule for splitting the budget between
kinds. A strategy overrides ``allocate`` only; the steps after it (`hetprune.pruning.steps`) are held equal across
strategies, which is what makes ``hetprune compare`` fair. [`FixedSplit`][hetprune.pruning.depth.FixedSplit] prunes a
given split (ablations)."""

from __future__ import annotations

import copy
import time

from torch import nn

from ..core import distributed as dist
from .budget import kinds_by_saving, max_per_kind, reached_cost
from ..core.errors import HetpruneError
from .job import PruneJob
from .plan import PlanStep, evaluation_step, finetune_step
from .report import PruneResult
from ..model.sites import Site
from .steps import allocation, finetune_and_measure, merge, finish, remove_sites, reported_epoch, select_sites

class DepthStrategy:
    """Depth pruning with a rule for splitting the budget between kinds.

    Subclasses set ``name``/``description`` and override `allocate`;
    ``defaults`` adds a settings section of their own.
    """

    name = "depth"
    description = "depth pruning with a fixed split"
    defaults: dict = {}

    def allocate(self, job: PruneJob) -> tuple[tuple[int, int], dict]:
        """Return ``((n_attn, n_act), info)`` for the job's budget."""
        raise NotImplementedError

    def choose(self, job: PruneJob, model: nn.Module, counts: dict[str, int]) -> list[Site]:
        """Which sites to remove (default: the configured scorer, within each kind)."""
        return select_sites(job, model, counts)

    def remove(self, job: PruneJob, model: nn.Module, chosen: list[Site]) -> dict:
        """Turn the chosen sites off (default: the configured removers)."""
        return remove_sites(job, model, chosen)

    def prepare(self, job: PruneJob) -> nn.Module:
        """The model to prune: a copy of the dense one, on the run's device (subclasses may change it)."""
        return job.place(copy.deepcopy(job.dense))

    def run(self, job: PruneJob) -> PruneResult:
        job.strategy_name = job.strategy_name or self.name
        started = time.time()
        t = job.stage_start("allocate", budget=job.budget.to_dict())
        with job.choosing("the split"):   # measured on the selection split, never on the val set reported
            (n_attn, n_act), alloc_info = dist.broadcast(allocation(self.allocate(job)))
        job.stage_end("allocate", t, n_attn=n_attn, n_act=n_act, **alloc_info)
        job.log(f"[{job.strategy_name}] split: {n_attn} attention + {n_act} activation sites")

        model = self.prepare(job)
        t = job.stage_start("select", n_attn=n_attn, n_act=n_act, scorer=job.config.scorer)
        with job.choosing("the sites"):
            chosen = self.choose(job, model, {"attn": n_attn, "act": n_act})
        job.stage_end("select", t, sites=[str(s) for s in chosen])
        job.log(f"[{job.strategy_name}] sites: {', '.join(str(s) for s in chosen) or '(none)'}")

        removal = self.remove(job, model, chosen)
        with job.choosing("the sites that meet the budget"):
            more, budget_check = self.meet_budget(job, model)   # before the fine-tune: no training is wasted
        removal = {**removal, **more} if more else removal
        metric_pruned, history, metric = finetune_and_measure(job, model, "removal")

        t = job.stage_start("merge")
        merged = merge(job, model)
        job.stage_end("merge", t, merged=merged)
        report = {
            "allocation": alloc_info,
            "removal": removal,
            "merged": merged,
            "metric_before_finetune": metric_pruned,
            "metric": metric,
            "finetune_history": history,
            **({"finetune_reported": reported_epoch(history)} if reported_epoch(history) else {}),
            **budget_check,
            "seconds": round(time.time() - started, 1),
        }
        return finish(job, model, report, fold_norm=job.folds_norm)

    # -- the plan (--plan): the stages above, counted, nothing run ------------------------------------------
    def plan(self, job: PruneJob) -> list[PlanStep]:
        """The run's stages without running them: the allocation's (`plan_allocation`), the selection (a scorer
        with a training phase describes it: ``plan(job, counts)``), the final fine-tune, and the evaluations
        (the dense model, and the pruned one before and after its fine-tune)."""
        most = self.plan_sites(job)
        counts = {"attn": most - most // 2, "act": most // 2}   # a scorer's phase counts the removals, not the split
        steps = list(self.plan_allocation(job))
        scorer = job.registry.build("scorer", job.config.scorer, **job.config.options_for("scorer", job.config.scorer))
        if hasattr(scorer, "plan"):
            steps.append(scorer.plan(job, counts))
        cfg = job.config.schedule("finetune")
        steps.append(finetune_step(job, "finetune", "stage 2: fine-tune", f"{cfg.epochs} epochs, batch {cfg.batch_size}"))
        steps.append(evaluation_step(job, "evaluations", "dense; pruned before and after its fine-tune", 3))
        return steps

    def plan_allocation(self, job: PruneJob) -> list[PlanStep]:
        """What the allocation costs (nothing for a fixed rule; HetDPT's points and checks)."""
        return []

    @staticmethod
    def plan_sites(job: PruneJob) -> int:
        """The most sites the budget removes (a cost target: its feasible split with the most)."""
        if job.budget.sites is not None:
            return job.budget.sites
        return max((a + m for a, m in job.feasible_pairs()), default=0)

    def meet_budget(self, job: PruneJob, model: nn.Module) -> tuple[dict, dict]:
        """Check the pruned model's own cost against a cost target, and correct it: ``(removal records,
        report entries)``.

        The split was planned with mean per-site savings, which hold for identical blocks only (not for Swin
        stages or width-pruned models), so the chosen sites may save less. While the target is missed, one
        more site is chosen and removed (this strategy's ``choose`` and ``remove``; the kind that saves more
        on this model first). Where no site left saves cost, the log says the target is missed. The report
        gets ``budget_met`` and ``budget_check`` (limit, cost reached, sites added). Under torchrun rank 0
        counts and every rank receives its numbers.
        """
        if not job.budget.counts_cost:
            return {}, {}
        merge = bool(job.config.mergers)
        example = job.example
        dense = dist.on_main(lambda: job.cost(job.dense, example))
        limit = job.budget.limit(dense)

        def status() -> tuple[float, list[str]]:
            reached = reached_cost(model, example, merge, job.cost, job.prepare_costs)
            kinds = kinds_by_saving(model, example, merge, job.cost, job.prepare_costs) if reached > limit else []
            return reached, kinds

        reached, kinds = dist.on_main(status)
        planned, added, records = reached, [], {}
        while reached > limit and kinds:
            more = next((found for kind in kinds
                         for found in [list(self.choose(job, model, {"attn": int(kind == "attn"),
                                                                     "act": int(kind == "act")}))] if found), [])
            if not more:
                break
            records.update(self.remove(job, model, more) or {})
            added += more
            reached, kinds = dist.on_main(status)
        met = reached <= limit
        unit = getattr(job.cost_model, "unit", "")
        if added:
            job.log(f"[{job.strategy_name}] the chosen sites left {planned:.4g} {unit} > the limit {limit:.4g} "
                    f"(blocks differ in cost); removed {', '.join(map(str, added))} as well: {reached:.4g} {unit}")
        if not met:
            job.log(f"[{job.strategy_name}] warning: {job.budget.describe()} is NOT met: the pruned model costs "
                    f"{reached:.4g} {unit}, the limit is {limit:.4g}, and no site left saves cost")
        return records, {"budget_met": met, "budget_check": {
            "model": job.cost_model_name, "unit": unit, "limit": limit, "reached": reached,
            "reached_as_planned": planned, "added_sites": [str(s) for s in added]}}


class FixedSplit(DepthStrategy):
    """Prune exactly ``n_attn`` attention and ``n_act`` activation sites (ablation studies)."""

    name = "fixed-split"
    description = "a given (n_attn, n_act), for ablations"

    def __init__(self, n_attn: int, n_act: int):
        self.split = (int(n_attn), int(n_act))

    def allocate(self, job: PruneJob):
        limits = max_per_kind(job.dense)
        if self.split[0] > limits["attn"] or self.split[1] > limits["act"]:
            raise HetpruneError(f"split {self.split} is more than this model can lose "
                                f"(at most {limits['attn']} attention and {limits['act']} activation sites)")
        return self.split, {"fixed": True}
