"""The steps every depth strategy shares, as public building blocks: choose sites with the scorer, remove
them, fine-tune (KD from the dense model) and measure, merge, and finish into a recipe and a
[`Report`][hetprune.pruning.report.Report]. Each takes the [`PruneJob`][hetprune.pruning.job.PruneJob] it runs in."""

from __future__ import annotations

import numbers
from dataclasses import replace

import torch
from torch import nn

from ..core import contract
from ..core import distributed as dist
from .budget import max_per_kind
from ..model.macs import cost_summary
from ..core.errors import HetpruneError
from .job import PruneJob, ScoringContext, scoring_context
from ..model.recipe import arch_of, recipe_from_model
from .report import PruneResult, Report, metric_entries
from ..training.resume import structure_key, weights_key
from ..model.sites import Site, sites

def rank_lowest(scores: dict[Site, float], n: int) -> list[Site]:
    """The ``n`` lowest-scoring sites (ties broken by block index, for determinism)."""
    return sorted(scores, key=lambda s: (scores[s], s.block))[:n]


def select_sites(job: PruneJob, model: nn.Module, counts: dict[str, int], scorer_name: str | None = None,
                 ctx: ScoringContext | None = None, shared: bool = True) -> list[Site]:
    """Choose ``counts[kind]`` sites of each kind with the configured scorer.

    A scorer with ``select`` (learning while it removes) may adapt ``model``'s
    weights in place; it must leave every site present. Under torchrun a
    scorer whose ``every_rank(ctx)`` says so (gate-taylor on hetprune's own
    trainer) selects on every rank together, training under exact DDP, so no
    rank sits idle and the global batch is split; any other selects on rank
    0. Either way every rank receives rank 0's choice and weights.
    ``shared=False``: this process selects on its own model, alone.
    """
    name = scorer_name or job.config.scorer
    scorer = job.registry.build("scorer", name, **job.config.options_for("scorer", name))
    ctx = ctx or scoring_context(job)
    if not shared or not dist.active():
        return _select_sites(model, counts, name, scorer, ctx)
    every_rank = getattr(scorer, "every_rank", None)
    if every_rank is not None and every_rank(ctx):
        chosen = dist.broadcast(_select_sites(model, counts, name, scorer, replace(ctx, distributed=True)))
    else:
        chosen = dist.on_main(lambda: _select_sites(model, counts, name, scorer, ctx))
    dist.broadcast_module(model)
    return chosen


def _select_sites(model: nn.Module, counts: dict[str, int], name: str, scorer, ctx: ScoringContext) -> list[Site]:
    limits = max_per_kind(model)
    for kind, n in counts.items():
        if n > limits[kind]:
            raise HetpruneError(f"cannot remove {n} {kind} sites: at most {limits[kind]} may go from this model")
    if hasattr(scorer, "select"):
        chosen = list(scorer.select(model, dict(counts), ctx))
    else:
        chosen = []
        for kind, n in counts.items():
            if n:
                chosen += rank_lowest(scorer.score(model, sites(model, kind), ctx), n)
    got = {k: sum(1 for s in chosen if s.kind == k) for k in counts}
    if got != {k: n for k, n in counts.items()} or len(set(chosen)) != len(chosen):
        raise HetpruneError(f"scorer {name!r} chose {got} sites, but {dict(counts)} were asked for")
    return sorted(chosen, key=lambda s: (s.kind, s.block))


def remove_sites(job: PruneJob, model: nn.Module, chosen: list[Site]) -> dict:
    """Turn the chosen sites off with the configured removers; returns what they recorded."""
    removers = job.removers
    records: dict = {}
    for site in chosen:
        remover = removers[site.kind]
        if getattr(remover, "kind", site.kind) != site.kind:
            raise HetpruneError(f"remover {remover.name!r} removes {remover.kind} sites, not {site.kind}")
        records.update(remover.remove(model, site) or {})
    return records


def finetune(job: PruneJob, model: nn.Module, section: str = "finetune", stage: str = "finetune",
             **changes) -> list[dict]:
    cfg = job.config.schedule(section, **changes)
    # a checkpoint is reused only for the same start: model (weights, and its structure: removed sites, attention
    # mode, merges, widths; the state dict alone does not show a removed activation), teacher, data
    teacher, teacher_key = job.teacher_for(cfg)
    key = {"starting weights": weights_key(model), "structure": structure_key(model, model_structure(job, model)),
           "teacher": teacher_key, "data": job.task.key}
    return job.task.fit(model, teacher, cfg, stage, checkpoint_dir=job.workdir / stage, resume=job.resume,
                        progress=job.progress, desc=f"{job.strategy_name}: {stage}", resume_key=key, log=job.log,
                        on_epoch_end=lambda e, m: job.event("on_epoch_end", stage=stage, epoch=e, metrics=m))


def model_structure(job: PruneJob, model: nn.Module) -> dict:
    """What the model's recipe says of its structure (removed sites, attention mode, merges, adapter, shape facts):
    part of a resume key, read the way a saved result's recipe is."""
    recipe = recipe_from_model(model, job.spec, arch_of(model)).to_dict()
    return {k: v for k, v in recipe.items() if k not in ("base", "provenance")}


def finetune_and_measure(job: PruneJob, model: nn.Module, after: str) -> tuple[float, list[dict], float]:
    """The task's metric before the (long) fine-tune, its history, and the metric after it."""
    before = job.evaluate(model)
    t = job.stage_start("finetune")
    history = finetune(job, model)
    after_ft = job.evaluate(model)
    job.stage_end("finetune", t, metric=after_ft)
    kept = reported_epoch(history)
    if kept:
        job.log(f"[{job.strategy_name}] the fine-tune returns the weights of epoch {kept['epoch']} of {len(history)} "
                f"({kept['reported']}{' by ' + job.task.metric_name if kept['reported'] == 'best' else ''})")
    job.log(f"[{job.strategy_name}] {job.task.format(before)} after {after}, {job.task.format(after_ft)} after "
            "fine-tune")
    worse = after_ft < before if job.task.higher_is_better else after_ft > before
    if worse:
        augment = getattr(job.data, "augment", None)
        hint = (f" (the training images are augmented as '{augment}': try --augment none or light)"
                if augment == "imagenet" else "")
        job.log(f"[{job.strategy_name}] warning: the fine-tune made the model worse ({job.task.format(before)} -> "
                f"{job.task.format(after_ft)}): its schedule does not suit this model and data; try a lower "
                f"finetune.lr, more epochs or more images{hint}")
    return before, history, after_ft


def reported_epoch(history: list[dict]) -> dict | None:
    """The epoch of a fine-tune's history whose weights it returned when they are not the last epoch's
    (``keep: best`` or ``ema``): ``{"epoch", "reported"}``; None for the last (the default)."""
    for h in history or []:
        if isinstance(h, dict) and h.get("reported"):
            return {"epoch": h.get("epoch"), "reported": h["reported"], **({"metric": h["metric"]} if "metric" in h
                                                                          else {})}
    return None


def merge(job: PruneJob, model: nn.Module) -> list[int]:
    """Apply the configured mergers; each is checked to keep the function within its declared tolerance."""
    changed: list[int] = []
    for merger in job.mergers:
        changed += merger.merge(model)
    model.eval()
    return sorted(set(changed))


def finish(job: PruneJob, model: nn.Module, report: dict, fold_norm: bool = False,
           widths: dict | None = None) -> PruneResult:
    """Turn a pruned, fine-tuned, merged model into a recipe and a complete report."""
    job.place(model).eval()
    example = job.example
    recipe = recipe_from_model(
        model, job.spec, arch_of(job.dense), fold_norm=fold_norm, widths=widths,
        provenance={"strategy": job.strategy_name, "budget": job.budget.to_dict(), "seed": job.seed,
                    "base_weights": job.base_info, "data": job.task.describe()},
    )
    dense_cost = cost_summary(job.dense, example)   # the model, the teacher and the example share the device
    cost = cost_summary(model, example)
    entries = metric_entries(job, report)
    metrics = {k: entries.pop(k) for k in ("metric", "metric_before_finetune", "metric_dense", "metric_name",
                                           "higher_is_better", "top1", "top1_before_finetune", "top1_dense")
               if k in entries}
    done = Report(
        strategy=job.strategy_name, budget=job.budget.to_dict(), seed=job.seed, n_attn=recipe.n_attn,
        n_act=recipe.n_act, sites=[str(s) for s in recipe.removed_sites], metric_name=metrics["metric_name"],
        higher_is_better=metrics["higher_is_better"], metric=metrics["metric"],
        metric_before_finetune=metrics["metric_before_finetune"], metric_dense=metrics["metric_dense"],
        seconds=entries.pop("seconds", None), params=cost["params"], macs=cost["macs"],
        dense_params=dense_cost["params"], dense_macs=dense_cost["macs"], macs_convention=cost["macs_convention"],
        settings=job.settings.as_settings(), extra={**entries, "splits": job.splits(), **cost_report(job, model, example)})
    return PruneResult(model, recipe, done.to_dict())


def cost_report(job: PruneJob, model: nn.Module, example: torch.Tensor) -> dict:
    """For a cost model other than MACs: the predicted cost and speedup, and (where the model can measure)
    the measured ones beside them, so a reader sees whether the budget was met on the hardware."""
    name = job.cost_model_name
    if name == "macs":
        return {}
    cm = job.cost_model
    job.prepare_costs([job.dense, model], example)   # new parts (width-pruned blocks) timed in one session
    dense, pruned = cm.cost(job.dense, example), cm.cost(model, example)
    out = {"model": name, "unit": cm.unit, "predicted": pruned, "dense_predicted": dense,
           "predicted_speedup": dense / pruned}
    if job.budget.counts_cost:
        out["limit"] = job.budget.limit(dense)
    if job.measure_cost and hasattr(cm, "measure"):
        measured = cm.measure({"dense": job.dense, "pruned": model}, example)
        out.update(measured=measured["pruned"], dense_measured=measured["dense"],
                   measured_speedup=measured["dense"] / measured["pruned"])
        out["prediction_error"] = out["predicted_speedup"] / out["measured_speedup"] - 1
        job.log(f"[{job.strategy_name}] speedup by {name}: predicted {out['predicted_speedup']:.2f}x, measured "
                f"{out['measured_speedup']:.2f}x")
    if hasattr(cm, "describe"):
        out["about"] = cm.describe()
    return {"cost": out}


def allocation(value) -> tuple[tuple[int, int], dict]:
    """``allocate``'s answer, checked: ``((n_attn, n_act), info)`` with counts >= 0 and a dict."""
    try:
        (n_attn, n_act), info = value
    except (TypeError, ValueError):
        raise contract.Violation(f"allocate() returned {value!r}; it must return ((n_attn, n_act), info)") from None
    counts_ok = all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in (n_attn, n_act))
    if not counts_ok or not isinstance(info, dict):
        raise contract.Violation(f"allocate() returned {value!r}; it must return ((n_attn, n_act), info) with "
                                 "counts that are integers >= 0 and info a dict")
    return (int(n_attn), int(n_act)), info


