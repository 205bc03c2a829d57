"""Width strategies: ``isomorphic`` (width only, the baseline) and ``hetdpt-plus``
(HetDPT depth pruning and isomorphic width pruning together, to one MAC target).

Both fine-tune with the shared KD schedule (``finetune`` section) and return
the same report keys as the depth strategies, so ``hetprune compare`` can put
them in one table.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

import hetprune
from hetprune import HetpruneError, get_registry
from hetprune.plugin_api import Budget, PruneJob, PruneResult, pipeline, surgery, widths
from hetprune.plugin_api import budget as budgets
from hetprune.plugin_api import macs as mac
from hetprune.plugin_api import depth as depth_of

from . import share_search
from .options import HetDPTPlusOptions, WidthOptions

@dataclass
class WidthContext:
    """What a width pruner may use: training batches (Taylor), the cost to meet, a log."""

    batches: Callable | None = None
    macs_fn: Callable[[nn.Module], float] | None = None
    log: Callable[[str], None] = print


def mac_target(job: PruneJob, dense_macs: int, who: str) -> float:
    limit = job.budget.mac_limit(dense_macs)
    if limit is None:
        raise HetpruneError(f"{who} needs a cost target: --target-macs F (fraction of dense, or e.g. 2.6G) or "
                            f"--target-speedup S; a site count (--budget) does not say how wide to stay")
    if limit >= dense_macs:
        raise HetpruneError(f"{who}: the target {mac.human(limit)} MACs is not below the dense model's "
                            f"{mac.human(dense_macs)}")
    return float(limit)


def merged_cost(job: PruneJob, example: torch.Tensor, cost=mac.count_macs) -> Callable[[nn.Module], float]:
    """Cost (default MACs) as it will be after the final merge: linear MLPs that pay to merge are counted
    merged."""
    mergers, fold = job.config.mergers, job.folds_norm

    def counted(model: nn.Module):
        linear = [i for i in range(depth_of(model)) if surgery.mergeable(model, i)]
        if not mergers or not linear:
            return cost(model, example)
        twin = copy.deepcopy(model)
        surgery.merge_all(twin, fold_norm=fold, blocks=linear)
        return cost(twin, example)

    return counted


def in_time(job: PruneJob) -> bool:
    """Whether the budget is counted in a cost model other than MACs (measured time)."""
    return job.budget.model_name not in (None, "macs")


def width_prune_to_time(job: PruneJob, model: nn.Module, stage: str = "width") -> tuple[nn.Module, dict]:
    """A width-pruned copy of ``model`` that meets the budget's limit in the run's cost model (time).

    The width pruner takes a MAC target, so the MAC target is searched: each try fits time as a line in
    MACs through the last two known points (the unpruned model is the first) and aims just under the
    limit; the most expensive try that meets the limit wins (within ``tolerance`` of it ends the search)."""
    example = example_for(job, model)
    cost = merged_cost(job, example, cost=job.cost)
    macs_of = merged_cost(job, example)
    limit = job.budget.limit(job.cost(job.dense, example))
    assert limit is not None   # a budget in time (in_time) has a limit
    have, macs = cost(model), macs_of(model)
    tol = tolerance_of(job)
    aim = limit * (1 - tol / 2)
    tries: list[dict] = []
    if have <= limit:
        return model, {"tries": tries, "note": "already within the time limit: no width pruning"}
    known = [(float(macs), have)]
    target, best = macs * aim / have, None
    for i in range(6):
        trial = copy.deepcopy(model)
        try:
            info = width_prune(job, trial, target, stage=stage)
        except HetpruneError as exc:   # the pruner cannot go that far: the best try so far, if any, stands
            tries.append({"target_macs": int(target), "error": str(exc)})
            break
        t = cost(trial)
        tries.append({"target_macs": int(target), "macs": info["macs"], "predicted": t})
        job.log(f"[{job.strategy_name}] width try {i + 1}: {mac.human(info['macs'])} MACs, predicted "
                f"{t * 1e3:.3g} ms (limit {limit * 1e3:.3g} ms)")
        if t <= limit and (best is None or t > best[1]):
            best = (trial, t, info)
        if limit * (1 - tol) <= t <= limit:
            break
        known.append((float(info["macs"]), t))
        (m0, t0), (m1, t1) = known[-2], known[-1]
        slope = (t0 - t1) / (m0 - m1) if m0 != m1 else 0.0
        target = m1 - (t1 - aim) / slope if slope > 0 else target * aim / t
        target = min(0.999 * macs, max(0.5 * m1, target))   # at most halve the MACs per try
    if best is None:
        raise HetpruneError(f"{job.strategy_name}: width pruning found no width within {job.budget.describe()} "
                            f"in {len(tries)} tries (predicted " + ", ".join(f"{x['predicted'] * 1e3:.3g}" for x in tries
                                                              if "predicted" in x)
                            + f" ms against {limit * 1e3:.3g} ms); relax the target")
    trial, t, info = best
    return trial, {**info, "predicted": t, "limit": limit, "tries": tries}


def example_for(job: PruneJob, model: nn.Module) -> torch.Tensor:
    """One example image on the model's device (a fine-tune may have moved the model)."""
    return job.example[:1].to(next(model.parameters()).device)


def width_prune(job: PruneJob, model: nn.Module, target: float, stage: str = "width") -> dict:
    """Prune ``model``'s widths in place to ``target`` MACs with the configured width pruner."""
    opts = job.options(WidthOptions)
    pruner = job.registry.build("width_pruner", opts.pruner, **opts.pruner_options)
    example = example_for(job, model)
    macs_of = merged_cost(job, example)
    ctx = WidthContext(batches=pipeline.scoring_context(job).batches, macs_fn=macs_of, log=job.log)
    t = job.stage_start(stage, target_macs=int(target), pruner=opts.pruner)
    before = copy.deepcopy(model)
    info = pruner.prune(model, target, example, ctx) or getattr(pruner, "last_report", {}) or {}
    widths.track_kept(before, model)  # the recipe records which channels were kept, so it applies to other weights
    del before
    macs = macs_of(model)
    if macs > target:
        raise HetpruneError(f"width pruner {opts.pruner!r} left {mac.human(macs)} MACs, above its target "
                            f"{mac.human(target)}")
    info = {**info, "macs": macs, "widths": widths.read_widths(model)}
    job.stage_end(stage, t, macs=macs)
    job.log(f"[{job.strategy_name}] width pruning: {mac.human(macs)} MACs (target {mac.human(target)})")
    return info


def depth_summary(report: dict, budget: Budget) -> dict:
    """What a hetdpt-plus report keeps of one depth step's report."""
    return {"budget": budget.to_dict(), **{k: report.get(k) for k in (
        "allocation", "sites", "macs", "metric_before_finetune", "metric", "finetune_history", "seconds")}}


def within(macs: float, target: float, tol: float) -> bool:
    return target * (1 - tol) <= macs <= target


def tolerance_of(job: PruneJob) -> float:
    return job.options(WidthOptions).tolerance


class Isomorphic:
    """Width only: Torch-Pruning isomorphic pruning to a MAC target, then the shared KD fine-tune."""

    name = "isomorphic"
    description = ("width only: Torch-Pruning isomorphic pruning (heads, head dims, MLP hidden, embedding) to a "
                   "MAC target, then the shared KD fine-tune")
    sections = {"width": WidthOptions}
    defaults = {"width": WidthOptions.defaults()}

    def run(self, job: PruneJob) -> PruneResult:
        job.strategy_name = job.strategy_name or self.name
        started = time.time()
        if in_time(job):
            model, info = width_prune_to_time(job, job.dense)
            allocation = {"target": job.budget.to_dict(), "width": info,
                          "within_tolerance": within(info["predicted"], info["limit"], tolerance_of(job))}
        else:
            dense_macs = mac.count_macs(job.dense, job.example)
            target = mac_target(job, dense_macs, self.name)
            model = copy.deepcopy(job.dense)
            info = width_prune(job, model, target)
            allocation = {"target_macs": int(target), "width": info,
                          "within_tolerance": within(info["macs"], target, tolerance_of(job))}
        before, history, after = pipeline.finetune_and_measure(job, model, "width pruning")
        report = {
            "allocation": allocation,
            "removal": {},
            "merged": [],
            "metric_before_finetune": before,
            "metric": after,
            "finetune_history": history,
            "seconds": round(time.time() - started, 1),
        }
        return pipeline.finish(job, model, report, widths=widths.read_widths(model))


class _WithDepth:
    """``sections`` / ``defaults`` of hetdpt-plus: its own plus those of the registered depth strategy
    (hetdpt).

    Read through the registry when asked for (not at import), so the hetdpt
    plugin stays an ordinary, separately loaded plugin.
    """

    def __init__(self, attribute: str, own: dict):
        self.attribute, self.own = attribute, own

    def __get__(self, obj, owner) -> dict:
        d = dict(self.own) if self.attribute == "sections" else copy.deepcopy(self.own)
        try:
            depth = get_registry().component("strategy", HetDPTPlusOptions().depth_strategy).factory
        except HetpruneError:
            return d  # reported when the strategy runs
        for key, value in (getattr(depth, self.attribute, None) or {}).items():
            d.setdefault(key, value if self.attribute == "sections" else copy.deepcopy(value))
        return d


class HetDPTPlus:
    """HetDPT+: HetDPT depth pruning and isomorphic width pruning together, to one MAC target."""

    name = "hetdpt-plus"
    description = ("HetDPT+: HetDPT depth pruning (share hetdpt_plus.depth_share of the MAC cut) and isomorphic "
                   "width pruning to one target, width first by default (hetdpt_plus.order); merges only where "
                   "it pays")
    sections = _WithDepth("sections", {"hetdpt_plus": HetDPTPlusOptions, "width": WidthOptions})
    defaults = _WithDepth("defaults", {"hetdpt_plus": HetDPTPlusOptions.defaults(), "width": WidthOptions.defaults()})

    def depth_job(self, job: PruneJob, o: HetDPTPlusOptions, dense: nn.Module, budget: Budget,
                  folder: str = "depth", defaults: dict | None = None) -> PruneJob:
        """The depth part's job: the dense model it prunes, its budget, the intermediate fine-tune as its final
        one, and the depth strategy's own sections (``defaults``) where the run's settings lack them."""
        run = job.config
        section = o.intermediate_finetune
        schedule = dataclasses.replace(run.short_finetune, epochs=0) if section == "none" else getattr(run, section)
        settings = job.settings.replace(finetune=schedule.as_settings()).with_sections(defaults or {})
        base_info = dict(job.base_info)
        if dense is not job.dense:  # width first: MAP points etc. belong to the width-pruned model, which the
            base_info.pop("hash", None)   # sub-job hashes (a job hashes its dense model where no hash is given)
        return dataclasses.replace(job, dense=dense, budget=budget, settings=settings, base_info=base_info,
                                   workdir=job.workdir / folder, measure_cost=False)  # the final model is timed

    def run_depth(self, job: PruneJob, o: HetDPTPlusOptions, dense: nn.Module, budget: Budget, strategy=None,
                  folder: str = "depth") -> PruneResult:
        name = o.depth_strategy if strategy is None else strategy.name
        strategy = strategy or job.registry.build("strategy", name)
        sub = self.depth_job(job, o, dense, budget, folder, defaults=getattr(strategy, "defaults", None))
        job.log(f"[{job.strategy_name}] depth pruning with {name}: {budget.describe()}")
        t = job.stage_start("depth", strategy=name, budget=budget.to_dict())
        result = strategy.run(sub)
        job.stage_end("depth", t, sites=result.report.get("sites"), macs=result.report.get("macs"))
        return result

    def run_interleaved(self, job: PruneJob, o: HetDPTPlusOptions, target: float, dense_macs: int,
                        depth_fraction: float | None) -> tuple[nn.Module, list, list[dict]]:
        """``rounds`` rounds of depth pruning then width pruning, each round taking an equal share of both
        cuts (the same fraction of its input's MACs, or its part of ``depth_sites``), with the intermediate
        fine-tune after every step; the last width step lands the total on ``target``."""
        rounds = o.rounds
        model = job.dense
        depth_rounds, widths_info = [], []
        for r in range(1, rounds + 1):
            if depth_fraction is None:   # sites spread as evenly as they go, the earlier rounds take the rest
                assert o.depth_sites is not None   # no share of the MAC cut: a site count
                n = o.depth_sites // rounds + (1 if r <= o.depth_sites % rounds else 0)
                budget = Budget(sites=n)
            else:
                budget = Budget(target_macs=depth_fraction ** (1 / rounds))
            job.log(f"[{job.strategy_name}] round {r}/{rounds}")
            result = self.run_depth(job, o, model, budget, folder=f"depth-round{r}")
            depth_rounds.append((result, budget))
            earlier = {s for prev, _ in depth_rounds[:-1] for s in prev.report["sites"]}
            result.report["sites"] = [s for s in result.report["sites"] if s not in earlier]   # this round's
            model = result.model
            step_target = dense_macs * (target / dense_macs) ** (r / rounds) if r < rounds else target
            macs = merged_cost(job, example_for(job, model))(model)
            if macs <= step_target:
                job.log(f"[{job.strategy_name}] round {r}: depth pruning reached {mac.human(macs)} MACs, at or below "
                        f"this round's width target {mac.human(step_target)}: no width pruning")
                continue
            widths_info.append(width_prune(job, model, step_target, stage=f"width-round{r}"))
            if r < rounds and o.intermediate_finetune != "none":
                t = job.stage_start(f"width-finetune-round{r}")
                pipeline.finetune(job, model, section=o.intermediate_finetune, stage=f"width-finetune-round{r}")
                job.stage_end(f"width-finetune-round{r}", t)
        return model, depth_rounds, widths_info

    # -- run ---------------------------------------------------------------------
    def run(self, job: PruneJob) -> PruneResult:
        job.strategy_name = job.strategy_name or self.name
        started = time.time()
        o = job.options(HetDPTPlusOptions)
        example = job.example
        dense_macs = mac.count_macs(job.dense, example)
        timed = in_time(job)
        if o.order == "auto":   # width first measured best at equal MACs; it takes MAC budgets only
            o = dataclasses.replace(o, order="depth-width" if timed or o.searched else "width-depth")
            job.log(f"[{job.strategy_name}] order auto: {o.order}")
        searched = False
        if timed:
            if o.depth_share == "search":
                raise HetpruneError(f"{self.name}: hetdpt_plus.depth_share search takes MAC budgets for now; give "
                                    "--target-macs, or a fixed depth_share with a time budget")
            # a time budget: the depth part takes its share of the time cut (in the same cost model), width
            # pruning searches the MAC target that lands the rest on the time limit
            if o.order != "depth-width":
                raise HetpruneError(f"{self.name}: a budget in time ({job.budget.describe()}) is supported with "
                                    f"hetdpt_plus.order depth-width; use --target-macs for {o.order}")
            dense_cost = job.cost(job.dense, example)
            target = dense_macs   # no MAC target: the time limit rules
            limit = job.budget.limit(dense_cost)
            assert limit is not None   # a budget in time has a limit
            keep = 1 - float(o.depth_share) * (1 - limit / dense_cost)   # a number: search was refused above
            depth_budget = (Budget(sites=o.depth_sites) if o.depth_sites is not None else
                            Budget(target_speedup=1 / keep, cost_model=job.budget.model_name))
        else:
            target = mac_target(job, dense_macs, self.name)
            searched = o.searched
            if searched:   # the split whose depth-then-width model predicts best, from cheap points
                with job.choosing("the depth share"):   # share points on the selection split
                    pick, search_info = share_search.search(job, target, dense_macs, width_prune)
                o = dataclasses.replace(o, depth_sites=sum(pick))
            # the depth part's budget: a site count, or its share of the MAC cut as a fraction of its input model
            depth_fraction = 1 - o.depth_share * (1 - target / dense_macs) if o.depth_sites is None else None
            depth_budget = (Budget(sites=o.depth_sites) if depth_fraction is None
                            else Budget(target_macs=depth_fraction))
        tol = tolerance_of(job)
        mergers = bool(job.config.mergers)

        widths_info: list[dict] = []
        depth_rounds: list[tuple[PruneResult, Budget]] = []   # interleaved: each round's depth result
        if o.order == "depth-width":
            depth = self.run_depth(job, o, job.dense, depth_budget,
                                   hetprune.FixedSplit(*pick) if searched else None)
            model = depth.model
            if timed:
                model, info = width_prune_to_time(job, model)
                widths_info.append(info)
            else:
                widths_info.append(width_prune(job, model, target))
        elif o.order == "interleaved":
            model, depth_rounds, rounds_width = self.run_interleaved(job, o, target, dense_macs, depth_fraction)
            depth = depth_rounds[-1][0]
            widths_info += rounds_width
        else:
            # width first, to a target chosen so that the depth step cannot take the model below the final
            # target (one site saves at most `step` of the MACs), then a trim pass lands it within tolerance
            save = budgets.site_savings(job.dense, example, merge=mergers)
            step = max(save.values()) / dense_macs
            if depth_fraction is None:
                keep = max(0.05, 1 - o.depth_sites * step)
            else:
                keep = max(0.05, depth_fraction - step)
            first = min(0.999 * dense_macs, target / keep)
            model = copy.deepcopy(job.dense)
            widths_info.append(width_prune(job, model, first, stage="width"))
            if o.intermediate_finetune != "none":
                t = job.stage_start("width-finetune")
                pipeline.finetune(job, model, section=o.intermediate_finetune, stage="width-finetune")
                job.stage_end("width-finetune", t)
            depth = self.run_depth(job, o, model, depth_budget)
            model = depth.model
            macs = merged_cost(job, example_for(job, model))(model)
            if macs > target:
                widths_info.append(width_prune(job, model, target, stage="width-trim"))
            elif macs < target * (1 - tol):
                job.log(f"[{job.strategy_name}] note: depth pruning took the model to {mac.human(macs)} MACs, more "
                        f"than {tol:.0%} below the target {mac.human(target)}")
        before, history, after = pipeline.finetune_and_measure(job, model, "depth + width pruning")

        t = job.stage_start("merge")
        merged_now = pipeline.merge(job, model) if mergers else []
        job.stage_end("merge", t, merged=merged_now)
        results = [r for r, _ in depth_rounds] or [depth]   # every depth result: the rounds', or the one
        merged = sorted(set(merged_now).union(*((r.report.get("merged") or []) for r in results)))
        dropped = surgery.dropped_blocks(model)
        linear = [i for i in range(depth_of(model)) if i not in dropped
                  and surgery.site_removed(model, hetprune.Site(i, "act")) and not surgery.mergeable(model, i)
                  and i not in merged]
        macs = mac.count_macs(model, example_for(job, model))
        dr = depth.report
        removal = {k: v for r in results for k, v in (r.report.get("removal") or {}).items()}
        report = {
            "allocation": {
                "order": o.order,
                **({"share_search": search_info} if searched else {}),
                **({"target": job.budget.to_dict(),
                    "within_tolerance": "predicted" in widths_info[-1] and within(
                        widths_info[-1]["predicted"], widths_info[-1]["limit"], tol)} if timed else
                   {"target_macs": int(target), "within_tolerance": within(macs, target, tol)}),
                "depth": {"strategy": o.depth_strategy, **depth_summary(dr, depth_budget)},
                **({"depth_rounds": [depth_summary(r.report, b) for r, b in depth_rounds]}
                   if depth_rounds else {}),
                "width": widths_info,
            },
            "removal": removal,
            "merged": merged,
            "not_merged": {str(b): ("merging would not lower MACs at these widths" if mergers
                                    else "no mergers configured") for b in linear},
            "metric_before_finetune": before,
            "metric": after,
            "finetune_history": history,
            "seconds": round(time.time() - started, 1),
        }
        return pipeline.finish(job, model, report, fold_norm=job.folds_norm,
                               widths=widths.read_widths(model))
