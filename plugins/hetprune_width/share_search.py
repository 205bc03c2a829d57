"""HetDPT+'s depth/width share, chosen the way HetDPT chooses its split (``hetdpt_plus.depth_share: search``).

A candidate is a depth split ``(n_attn, n_act)`` whose depth pruning alone
stays above the MAC target; width pruning takes the rest of the cut, so
``(0, 0)`` is width only and the largest candidates are nearly depth only. A
point is one candidate measured cheaply: the depth strategy's removal order
(its point scorer, one site at a time, as for MAP points) removes the sites,
the width pruner prunes to the target, a short KD fine-tune, validation top-1.
The depth strategy's predictor (``hetdpt.predictor``) is fitted on the points
(with the depth strategy's own ``fit``)
and the best predicted candidate wins; ``hetdpt_plus.refine`` rounds measure
the best predicted candidate not yet measured and refit, and the pick then
prefers measured values. Points are stored and reused like MAP points.
"""

from __future__ import annotations

import copy
import functools
import time

from hetprune import HetpruneError
from hetprune.plugin_api import PruneJob, depth, pipeline, storage
from hetprune.plugin_api import budget as budgets
from hetprune.plugin_api import distributed as dist

from .options import HetDPTPlusOptions, WidthOptions


def depth_macs(job: PruneJob):
    """MACs after depth pruning alone, merged, as a function of the split (hetprune.pruning.budget.pair_cost)."""
    save = budgets.kind_savings(job.dense, job.example, merge=bool(job.config.mergers))
    return budgets.pair_cost(save, depth(job.dense))


def candidates(job: PruneJob, target: float, macs) -> list[tuple[int, int]]:
    """Every split whose depth pruning alone (``macs``, from `depth_macs`) stays at or above ``target``."""
    limits = budgets.max_per_kind(job.dense)
    return [(a, m) for a in range(limits["attn"] + 1) for m in range(limits["act"] + 1) if macs(a, m) >= target]


def frontier(cands: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The candidates no other candidate contains (the most depth each mix of kinds can take)."""
    have = set(cands)
    return sorted(p for p in cands if (p[0] + 1, p[1]) not in have and (p[0], p[1] + 1) not in have)


def point_plan(depth_strategy, job: PruneJob, cands: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Width only, the depth strategy's axis and budget-line points over the frontier (its ``grid_plan``,
    whatever its own MAP points are; else its ``point_plan``), all candidates."""
    edge = frontier(cands)
    plan = set(getattr(depth_strategy, "grid_plan", depth_strategy.point_plan)(job, edge))
    plan = {p for p in plan if p in set(cands)} | {(0, 0)}
    return sorted(plan, key=lambda p: (p[0] + p[1], p))


def points_key(job: PruneJob, depth_strategy, target: float, width: WidthOptions) -> str:
    """What shapes a share point: the base, the task, the short schedule, the depth strategy's point scorer,
    the removers and mergers, the scoring batches, the width pruner and the target."""
    run, point_scorer = job.config, depth_strategy.point_scorer(job)
    return storage.PointStore.key_for(job, {
        "short": run.short_finetune, "point_scorer": point_scorer,
        **run.options_entry("scorer", point_scorer, "point_scorer_options"),
        "removers": [run.attn_remover, run.act_remover], "mergers": run.mergers, "scoring": run.scoring,
        "width": width.to_dict(), "target": int(target), "seed": job.seed, "amp": run.amp})


def measure(job: PruneJob, depth_strategy, plan: list[tuple[int, int]], target: float, width_prune) -> list[dict]:
    """Every planned point not already stored: remove, width-prune to ``target``, short fine-tune, evaluate.
    Under torchrun rank 0 decides what is reused and every point is measured on every rank together (the
    fine-tune exact DDP, the evaluation split), as MAP points are; rank 0 writes."""
    store = storage.PointStore(job.shared_dir / "plus-points.jsonl",
                               points_key(job, depth_strategy, target, job.options(WidthOptions)),
                               run=job.reuse_tag)
    have = dist.on_main(store.load)
    todo = [p for p in plan if p not in have]
    store.say_reused(job.log, f"[{job.strategy_name}]", [have[p] for p in plan if p in have], len(plan),
                     "share points")
    orders = None
    cfg = job.train_config("short_finetune")
    for i, (a, m) in enumerate(todo, 1):
        if orders is None:   # scored on rank 0, used by every rank
            limits = {"attn": max(p[0] for p in plan), "act": max(p[1] for p in plan)}
            orders = dist.on_main(functools.partial(depth_strategy.removal_orders, job, limits))
        t0 = time.time()
        model = job.place(copy.deepcopy(job.dense))
        chosen = orders["attn"][:a] + orders["act"][:m]
        pipeline.remove_sites(job, model, chosen)
        info = width_prune(job, model, target, stage="share-point")
        job.task.fit(model, job.teacher_for(cfg)[0], cfg, "share", progress=False, desc="share point")
        acc = job.choice_metric(model)   # a choice: on the selection split, never the val set reported
        point = store.record(job, have, {"n_attn": a, "n_act": m, "metric": acc, "split": job.choice_split,
                                         "sites": [str(s) for s in chosen],
                                         "macs": info["macs"], "seconds": round(time.time() - t0, 2)})
        job.log(f"[{job.strategy_name}] share point {i}/{len(todo)}: {a} attn + {m} act, width to the target -> "
                f"{job.task.format(acc)} ({point['seconds']:.1f}s)")
    return [have[p] for p in plan]


def search(job: PruneJob, target: float, dense_macs: float, width_prune) -> tuple[tuple[int, int], dict]:
    """The depth split (width taking the rest of the cut to ``target``) with the best predicted metric (the
    highest, or the lowest where the task's metric is better lower)."""
    o = job.options(HetDPTPlusOptions)
    depth_strategy = job.registry.build("strategy", o.depth_strategy)
    missing = [m for m in ("removal_orders", "point_plan", "predictor_for", "point_scorer", "fit")
               if not hasattr(depth_strategy, m)]
    if missing:
        raise HetpruneError(f"hetdpt_plus.depth_share search needs a depth strategy with cheap points and a "
                            f"fitted predictor, e.g. hetdpt; {o.depth_strategy!r} lacks {', '.join(missing)}")
    refine = o.refine
    sign = 1 if job.task.higher_is_better else -1   # the best split: the highest metric, or the lowest loss
    macs = depth_macs(job)
    cands = candidates(job, target, macs)
    plan = point_plan(depth_strategy, job, cands)
    predictor = depth_strategy.predictor_for(job, plan, "this target and model (share search)")
    points = measure(job, depth_strategy, plan, target, width_prune)
    predicted = depth_strategy.fit(predictor, points, cands)
    rounds = []
    for _ in range(refine):
        done = {(p["n_attn"], p["n_act"]) for p in points}
        best = max((c for c in cands if c not in done), key=lambda c: (sign * predicted[c], -c[0]), default=None)
        if best is None:
            break
        job.log(f"[{job.strategy_name}] share refinement: measuring {best[0]}+{best[1]}")
        plan = plan + [best]
        points = measure(job, depth_strategy, plan, target, width_prune)
        predicted = depth_strategy.fit(predictor, points, cands)
        rounds.append({"measured": list(best)})
    measured = {(p["n_attn"], p["n_act"]): storage.metric_of(p) for p in points}
    value = {c: measured.get(c, predicted[c]) if refine else predicted[c] for c in cands}
    pick = max(cands, key=lambda c: (sign * value[c], -c[0] - c[1]))   # ties: less depth
    share = (dense_macs - macs(*pick)) / (dense_macs - target) if dense_macs > target else 0.0
    job.log(f"[{job.strategy_name}] share search ({predictor.name}): {pick[0]} attn + {pick[1]} act, depth takes "
            f"{share:.0%} of the MAC cut (predicted {job.task.format(predicted[pick])})")
    return pick, {"predictor": predictor.name, "points": points, "candidates": [list(c) for c in cands],
                  "fit": predictor.fit_report() if hasattr(predictor, "fit_report") else {},
                  "surface": [{"n_attn": a, "n_act": m, "predicted": predicted[(a, m)],
                               **({"measured": measured[(a, m)]} if (a, m) in measured else {})} for a, m in cands],
                  "refinement": rounds, "depth_share": share,
                  "pick": {"n_attn": pick[0], "n_act": pick[1], "predicted": predicted[pick],
                           **({"measured": measured[pick]} if pick in measured else {})}}
