"""Ablation: does the accuracy predictor, fitted on cheap short fine-tunes,
pick the split that full fine-tuning would? And which scorer's sites recover
best for that split?

Ground truth is every feasible split (n_attn, n_act) of the budget, each
pruned and fine-tuned with the full schedule (``hetprune.pruning.pipeline.FixedSplit``
under the compare harness, so rows are saved as they finish and resumable).
"""

from __future__ import annotations

from pathlib import Path

from scipy import stats

from ..core import config as config_mod
from ..core.keys import fingerprint
from ..core.settings import Settings
from .compare import ROWS_FILE, RowPlan, distinct, mean_std, whole_number
from ..core.errors import HetpruneError, option
from ..core.io import ResultFolder, no_empty_folder_on_error, write_json_atomic, write_text_atomic
from ..pruning.point_store import metric_of
from ..training.loaders import closing_loaders
from ..training.task import metric_number

# what hetprune writes in an ablation's folder
ABLATION_FOLDER = ResultFolder("ablation", frozenset({ROWS_FILE, "ablation.json", "ablation.md", "splits.png",
                                                     "scorers.png", "models", "work"}), resumable=True,
                               folders=frozenset({"models", "work"}))

Pair = tuple[int, int]


def argmax_pair(values: dict[Pair, float], sign: int = 1) -> Pair:
    """The best pair (``sign`` -1: the lowest value is best); ties go to fewer attention removals (as hetdpt
    breaks them)."""
    return max(values, key=lambda p: (sign * values[p], -p[0]))


def _stat(value) -> float | None:
    value = float(value)
    return None if value != value else value  # NaN (e.g. constant input) -> None


def predictor_metrics(predicted: dict[Pair, float], true: dict[Pair, float], tolerance: float = 0.3,
                      sign: int = 1) -> dict:
    """How good a predictor's pick is against the ground truth over the same splits (``sign`` -1: the
    metric is better lower; regret is then how much higher the pick's true value is)."""
    pairs = sorted(true)
    missing = [p for p in pairs if p not in predicted]
    if missing:
        raise HetpruneError(f"the predictor gave no value for splits {missing}")
    pick = argmax_pair({p: predicted[p] for p in pairs}, sign)
    best = argmax_pair({p: true[p] for p in pairs}, sign)
    regret = sign * (true[best] - true[pick])
    pred = [predicted[p] for p in pairs]
    truth = [true[p] for p in pairs]
    enough = len(pairs) >= 2
    return {
        "pick": list(pick), "pick_predicted": predicted[pick], "pick_true": true[pick],
        "best": list(best), "best_true": true[best], "regret": regret,
        "spearman": _stat(stats.spearmanr(pred, truth).statistic) if enough else None,
        "kendall": _stat(stats.kendalltau(pred, truth).statistic) if enough else None,
        "within_tolerance": regret <= tolerance + 1e-12, "tolerance": tolerance,
    }


def budget_words(budget) -> str:
    """An ablation's budget: a site count (int), or a cost budget's description."""
    return f"{budget} sites" if isinstance(budget, int) else str(budget)


def split_plans(pairs: list[Pair], seeds: list[int], settings: Settings, budget, base_hash: str, data_fp: str,
                scorer: str | None = None, kind: str = "truth", unused: tuple[str, ...] = ()) -> list[RowPlan]:
    """Rows that fine-tune each split fully (ground truth), or one split per scorer. ``unused``: settings
    sections a fixed split never reads (the allocating strategy's own), left out of the rows' keys so that
    ablations of that strategy's options share one ground truth."""
    plans = []
    for seed in seeds:
        for a, m in pairs:
            s = settings.replace(seed=seed, **({"scorer": scorer} if scorer else {}))
            tag = f"{kind}-a{a}-m{m}" + (f"-{scorer}" if scorer else "") + f"__seed{seed}"
            keyed = {k: v for k, v in config_mod.keyed(s).items() if k not in unused}
            key = fingerprint({"kind": kind, "split": [a, m], "seed": seed, "settings": keyed, "base": base_hash,
                               "data": data_fp})
            label = f"scorer {scorer}" if scorer else f"split {a}+{m}"
            plans.append(RowPlan(tag, "fixed-split", budget, seed, s, key, split=(a, m), label=label))
    return plans


def mean_by_pair(rows: list[dict]) -> tuple[dict[Pair, float], dict[Pair, float]]:
    groups: dict[Pair, list[float]] = {}
    for r in rows:
        groups.setdefault((r["n_attn"], r["n_act"]), []).append(r["metric"])
    stats_ = {p: mean_std(v) for p, v in groups.items()}
    return {p: m for p, (m, _) in stats_.items()}, {p: s for p, (_, s) in stats_.items()}


def _unit(result: dict) -> str:
    """How the metric is shown in headers: ``%`` for top-1, else its name."""
    name = result.get("metric_name", "top1")
    return "%" if name == "top1" else f"({name})"


def cheap_points_words(result: dict, schedule: str) -> str:
    """How an ablation's cheap points were made, in a sentence (its point scheme)."""
    how = result.get("point_selection", "oneshot")
    if how == "gradual":
        return f"(chosen gradually by the run's scorer `{result.get('scorer')}`, no further fine-tune)."
    if how == "progressive":
        return (f"(progressive paths: one more site per point, each fine-tuned with `{schedule}`: "
                f"{result[schedule]} from the previous point's weights).")
    return f"(one-shot: each point's sites off the dense model at once, `{schedule}`: {result[schedule]})."


def markdown(result: dict) -> str:
    schedule = result.get("point_finetune", "short_finetune")   # the section that fine-tuned the cheap points
    u = _unit(result)
    num = lambda v: metric_number(result.get("metric_name", "top1"), v)  # noqa: E731
    metric = "top-1" if result.get("metric_name", "top1") == "top1" else result["metric_name"]
    lines = [f"# hetprune ablate: budget {budget_words(result['budget'])}, seeds {result['seeds']}", "",
             f"Command: `{result.get('command', '')}`", "",
             "Ground truth: every feasible split fine-tuned with the full schedule "
             f"(`finetune`: {result['finetune']}); predictors fitted on the cheap points "
             + cheap_points_words(result, schedule), "",
             "## Predictors", "",
             f"| predictor | pick (attn+act) | predicted {u} | true {u} of pick | best split | best true {u} | regret "
             "| Spearman | Kendall | within tolerance |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in result["predictors"].items():
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {name} | {m['pick'][0]}+{m['pick'][1]} | {num(m['pick_predicted'])} | {num(m['pick_true'])} | "
                     f"{m['best'][0]}+{m['best'][1]} | {num(m['best_true'])} | {num(m['regret'])} | "
                     f"{fmt(m['spearman'])} | {fmt(m['kendall'])} | {'yes' if m['within_tolerance'] else 'no'} |")
    lines += ["", "## Every split", "", f"| split (attn+act) | true {metric} {u} (mean ± std) | cheap point {u} | "
              + " | ".join(f"{n} predicted {u}" for n in result["predictors"]) + " |",
              "|---|---|---|" + "---|" * len(result["predictors"])]
    for s in result["splits"]:
        cheap = "-" if s["cheap"] is None else f"{num(s['cheap'])}"
        preds = " | ".join(f"{num(s['predicted'][n])}" for n in result["predictors"])
        lines.append(f"| {s['n_attn']}+{s['n_act']} | {num(s['true'])} ± {num(s['true_std'])} | {cheap} | {preds} |")
    if result.get("scorers"):
        split = result["scorer_split"]
        lines += ["", f"## Scorers at split {split[0]}+{split[1]}", "",
                  f"| scorer | {metric} {u} (mean ± std) | {metric} before fine-tune {u} | sites (first seed) |",
                  "|---|---|---|---|"]
        for name, s in result["scorers"].items():
            lines.append(f"| {name} | {num(s['metric'])} ± {num(s['metric_std'])} | {num(s['before'])} | "
                         f"{' '.join(s['sites'])} |")
    return "\n".join(lines) + "\n"


def plots(out: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = result["splits"]
    x = [s["n_attn"] for s in splits]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(x, [s["true"] for s in splits], yerr=[s["true_std"] for s in splits], fmt="o-", color="black",
                capsize=3, label="true (full fine-tune)")
    cheap = [(s["n_attn"], s["cheap"]) for s in splits if s["cheap"] is not None]
    if cheap:
        ax.plot(*zip(*cheap), "s", color="gray", alpha=0.7, label="cheap points (short fine-tune)")
    for name, m in result["predictors"].items():
        line, = ax.plot(x, [s["predicted"][name] for s in splits], "--", label=f"{name} (predicted)")
        ax.axvline(m["pick"][0], color=line.get_color(), alpha=0.4, linestyle=":")
    ax.set_xlabel("attention sites removed" + (f" (activation sites = {result['budget']} - x)"
                                                if isinstance(result["budget"], int) else ""))
    name = result.get("metric_name", "top1")
    ax.set_ylabel("top-1 accuracy (%)" if name == "top1" else name)
    ax.set_title(f"budget {budget_words(result['budget'])}: predicted vs true {name} of every split", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "splits.png", dpi=120)
    plt.close(fig)
    if result.get("scorers"):
        names = list(result["scorers"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(names, [result["scorers"][n]["metric"] for n in names],
               yerr=[result["scorers"][n]["metric_std"] for n in names], capsize=4, color="tab:blue")
        if name == "top1":
            lo = min(result["scorers"][n]["metric"] - result["scorers"][n]["metric_std"] for n in names)
            ax.set_ylim(max(0, lo - 5), 100)
        split = result["scorer_split"]
        ax.set_ylabel("top-1 after fine-tune (%)" if name == "top1" else f"{name} after fine-tune")
        ax.set_title(f"scorers at split {split[0]}+{split[1]}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "scorers.png", dpi=120)
        plt.close(fig)


def write(out: Path, result: dict) -> None:
    write_json_atomic(out / "ablation.json", result)
    write_text_atomic(out / "ablation.md", markdown(result))
    plots(out, result)


def build_compared(strat, job, predictors: list[str], scorers: list[str], plan: list) -> None:
    """Build every predictor and scorer the ablation compares before the first cheap point trains: one that
    breaks its Protocol is refused by name now (the registry checks what it builds), and a predictor that
    needs more points than the plan has is refused with both counts, not after the points."""
    for name in predictors:
        predictor = strat.predictor(job, name)
        need = getattr(predictor, "min_points", None)
        if need is not None and len(plan) < need:
            raise HetpruneError(f"predictor {name!r} needs at least {need} distinct points and this budget's plan "
                                f"has {len(plan)}: {plan}; compare predictors that need fewer, or a larger budget")
    for name in scorers:
        job.registry.build("scorer", name, **job.config.options_for("scorer", name))


def fitted_predictor(predictor, triples):
    """``predictor`` fitted on ``triples``: fit()'s return value is ignored (the contract's rule), the object
    is the fitted one."""
    predictor.fit(triples)
    return predictor


@closing_loaders()   # the call leaves no loader worker behind
def ablate(model, task, strategy: str = "hetdpt", budget=12, seeds=(0,), *, predictors=None, scorers=(),
           tolerance: float = 0.3, settings: dict | None = None, config: str | None = None,
           out: str | Path = "runs/ablate",
           resume: bool = False, overwrite: bool = False, jobs: int = 1, spec=None, base_info: dict | None = None,
           registry=None, device: str | None = None, amp: str | None = None, adapter=None,
           data_spec: str | None = None, meta: dict | None = None, log=print, progress: bool = True,
           start=None, plan: bool = False, plan_probe: float | None = None, reuse_older: bool = False):
    """Does the strategy's predictor, fitted on cheap points, pick the split full fine-tuning finds best,
    on ``model`` for ``task``? (and, with ``scorers``, which scorer's sites recover best at that split)

    Cheap points are collected exactly as the strategy collects them, one set per seed; every feasible
    split is then fine-tuned with the full schedule (the ground truth, saved as it finishes: ``resume=True``
    continues; ``reuse_older`` reuses rows another behaviour of a component made, as for
    `compare`). ``budget`` is a site count or a [`Budget`][hetprune.pruning.budget.Budget]. Writes ablation.json,
    ablation.md and splits.png (scorers.png) to ``out`` and returns the result dict. ``start`` is a run
    already started with [`start_run`][hetprune.pruning.run_start.start_run] (the command line's). ``plan=True``
    trains nothing and returns the [`Plan`][hetprune.pruning.plan.Plan]: the cheap points of every seed, then every
    truth row and scorer row (see [`hetprune.prune`][hetprune.harness.api.prune]).
    """
    import math

    from ..pruning import cost_choice as cost_model
    from ..core import distributed as dist
    from ..pruning.budget import Budget
    from .compare import plan_of_rows, python_call
    from ..pruning.run_start import probe_for, run_key
    from .compare import run_rows
    from ..pruning.pipeline import PruneJob, check_job
    from ..pruning.run_start import as_given, start_run

    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise HetpruneError(f"tolerance must be a finite number >= 0, got {tolerance}")
    if jobs < 1:
        raise HetpruneError(f"jobs must be >= 1, got {jobs}")
    plan_probe = probe_for(plan, plan_probe)   # a probe without a plan is refused: the rows would train
    seeds = distinct([whole_number(s, "a seed") for s in seeds], option("seeds"))
    if start is None:
        start = start_run([strategy], [budget if isinstance(budget, Budget) else Budget(sites=budget)],
                          folder=ABLATION_FOLDER, out=out, resume=resume, overwrite=overwrite, settings=settings,
                          config_file=config, overrides={"device": device, "amp": amp}, registry=registry, plan=plan,
                          reuse_older=reuse_older)
    registry, strat, the_budget = start.registry, start.strategy, start.budget
    run_settings = start.settings
    if not all(hasattr(strat, m) for m in ("point_plan", "collect_points", "predictor", "predictor_name")):
        raise HetpruneError(f"strategy {strat.name!r} has no cheap predictor points (point_plan, collect_points, "
                            "predictor, predictor_name); use hetdpt or a strategy built like it")
    section = strat.name
    cost_model.refuse_parallel(jobs, [the_budget], run_settings)
    predictors = list(predictors or [strat.predictor_name(run_settings)])
    for name in predictors:
        registry.component("predictor", name)
    scorers = list(scorers)
    for name in scorers:
        registry.component("scorer", name)
    with no_empty_folder_on_error(start.out), as_given(model):   # bad input found later leaves no folder behind
        out = start.prepare_out()
        dense = start.attach(model, task, spec, base_info, adapter, log, measure=not plan)
        task, adapter, info = dense.task, dense.adapter, dense.info
        run_settings = start.settings   # schedules sized by the data (image_passes) once attached
        sign = 1 if task.higher_is_better else -1
        log = log if dist.is_main() else (lambda msg: None)

        # 1. cheap points, exactly as the strategy collects them (one set per seed)
        points, pairs, cheap = [], None, []
        for seed in seeds:
            job = PruneJob(dense=model, spec=spec, data=None, task=task, budget=the_budget,
                           settings=run_settings.replace(seed=seed), registry=registry,
                           workdir=out / "work" / f"points-seed{seed}", shared_dir=out / "work" / "shared",
                           base_info=dict(info), resume=start.resume, log=log, strategy_name=strat.name,
                           adapter=adapter, progress=progress)
            with job.serving():
                check_job(strat, job)   # before the first cheap point trains
                pairs = job.feasible_pairs()
                if seed == seeds[0]:
                    build_compared(strat, job, predictors, scorers, strat.point_plan(job, pairs))
                if plan:
                    cheap.append(("cheap points", list(strat.plan_allocation(job))))
                    continue
                log(f"cheap points, seed {seed} ...")
                points += strat.collect_points(job, strat.point_plan(job, pairs))
        if plan:
            plans = split_plans(pairs, seeds, run_settings, the_budget, dense.key, task.key, kind="truth",
                                unused=(section,))
            plans += [p for name in scorers for p in split_plans(pairs[:1], seeds, run_settings, the_budget,
                                                                 dense.key, task.key, scorer=name, kind="scorer",
                                                                 unused=(section,))]
            probe_s, notes = start.probe_here(plan_probe)
            return plan_of_rows(plans, registry, model, spec, task, info, out, adapter, log, probe_s,
                                run_key(start, dense, strat.name), f"ablate {strat.name}, {the_budget.describe()}, "
                                f"seeds {seeds}", group=lambda p: p.id.split("-")[0] + " rows", before=cheap,
                                notes=notes, preceding=start.before)
        triples = [(p["n_attn"], p["n_act"], metric_of(p)) for p in points]

        # 2. every predictor on the same points
        fitted = {name: fitted_predictor(strat.predictor(job, name), triples) for name in predictors}
        first_pick = argmax_pair({p: fitted[predictors[0]].predict(*p) for p in pairs}, sign)

        # 3. ground truth (every split, full schedule) and the scorer rows, resumable
        plans = split_plans(pairs, seeds, run_settings, the_budget, dense.key, task.key, kind="truth",
                            unused=(section,))
        for name in scorers:
            plans += split_plans([first_pick], seeds, run_settings, the_budget, dense.key, task.key,
                                 scorer=name, kind="scorer", unused=(section,))
        log(f"fine-tuning {len(plans)} rows: {len(pairs)} splits x {len(seeds)} seeds"
            + (f" + {len(scorers)} scorers at {first_pick}" if scorers else ""))
        rows = run_rows(plans, registry, model, spec, task, info, out, resume=start.resume, jobs=jobs,
                        reuse_older=start.reuse_older,
                        data_spec=data_spec,
                        adapter=adapter, log=log, progress=progress)
        if not dist.is_main():
            return {}
        truth_rows = [r for r, p in zip(rows, plans) if p.id.startswith("truth-")]
        true, true_std = mean_by_pair(truth_rows)
        cheap, _ = mean_by_pair([{"n_attn": a, "n_act": m, "metric": acc} for a, m, acc in triples])
        predicted = {name: {p: f.predict(*p) for p in pairs} for name, f in fitted.items()}
        result = {
            "budget": the_budget.sites if the_budget.sites is not None else the_budget.describe(), "seeds": seeds,
            "metric_name": task.metric_name, "higher_is_better": task.higher_is_better, "dense_metric": info["metric"],
            **({"dense_top1": info["metric"]} if task.metric_name == "top1" else {}),
            "command": python_call("ablate", strategy=strategy, budget=the_budget.as_argument(), seeds=seeds,
                                   out=str(out)),
            **(meta or {}),
            "finetune": start.config.finetune.as_settings(),
            "short_finetune": start.config.short_finetune.as_settings(), "points": points,
            "point_finetune": next((p["point_finetune"] for p in points if "point_finetune" in p), "short_finetune"),
            "point_selection": getattr(strat, "point_selection", lambda settings: "oneshot")(run_settings),
            "scorer": start.config.scorer,
            "predictors": {name: {**predictor_metrics(predicted[name], true, tolerance, sign),
                                  "fit": f.fit_report() if hasattr(f, "fit_report") else {}}
                           for name, f in fitted.items()},
            "splits": [{"n_attn": a, "n_act": m, "true": true[(a, m)], "true_std": true_std[(a, m)],
                        "cheap": cheap.get((a, m)), "predicted": {n: predicted[n][(a, m)] for n in predictors}}
                       for a, m in sorted(pairs)],
            "rows": rows,
        }
        if scorers:
            result["scorer_split"] = list(first_pick)
            result["scorers"] = {}
            for name in scorers:
                mine = [r for r, p in zip(rows, plans)
                        if p.id.startswith("scorer-") and p.settings.run.scorer == name]
                mean, std = mean_std([r["metric"] for r in mine])
                result["scorers"][name] = {"metric": mean, "metric_std": std,
                                           **({"top1": mean, "top1_std": std} if task.metric_name == "top1" else {}),
                                           "before": mean_std([r["metric_before_finetune"] for r in mine])[0],
                                           "sites": mine[0]["sites"]}
        write(out, result)
        return result
