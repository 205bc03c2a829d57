"""Running hetprune for a study: a command that reuses what an earlier run of it left (`resumable`), and the
ground truth of the embedded benchmarks that the MAP studies (map_points.py, grid_noise.py, check_regret.py)
compare against: the base model, task and settings a study starts from (`context`), the truth rows (every
split pruned and fine-tuned on the final schedule, keyed as ``hetprune ablate`` keys them: `truth_rows`), and
what seed noise alone costs (`oracle_rows`, `floors_of`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from types import SimpleNamespace


def resumable(argv: list[str], out: Path) -> list[str]:
    """``argv`` of a ``hetprune ablate`` or ``compare`` that writes to ``out``, with ``--resume`` where an earlier
    run left its rows there: a rerun of the study reuses every row already made."""
    return argv + ["--resume"] if (Path(out) / "rows.jsonl").exists() else argv


def budget_of(target: str):
    from hetprune.pruning.budget import Budget

    if target.startswith("b"):
        return Budget(sites=int(target[1:]))
    return Budget(target_macs=float(target[len("macs"):]))


# -- the base model, its task and settings, as the CLI builds them -------------------------------------------

def resolved_settings(sets: list[str] | None = None) -> dict:
    """Every setting a hetdpt run with ``sets`` on top of today's defaults has, as plain JSON and as keys see
    them (a renamed setting under its old name: `hetprune.core.config.in_key_form`): what a study's saved work
    is found by, so that a default moved since it was saved is not taken for the settings it ran with (its
    ``--set`` list alone would match), and a rename alone does not make it again."""
    import json

    from hetprune.core.config import in_key_form
    from hetprune.pruning.budget import Budget
    from hetprune.pruning.run_start import start_run

    settings = start_run(["hetdpt"], [Budget(sites=0)], sets=list(sets or [])).settings.as_settings()
    return json.loads(json.dumps(in_key_form(settings)))


def context(bench: str, sets: list[str] | None = None) -> SimpleNamespace:
    """The embedded base model of ``bench`` with its spec, provenance, task and the default settings of
    ``hetdpt`` (``sets`` applied): what ``hetprune ablate --data BENCH`` starts from."""
    from hetprune.pruning.budget import Budget
    from hetprune.cli.commands.common import base_model, data_for
    from hetprune.pruning.run_start import start_run
    from hetprune.training.task import classification

    args = SimpleNamespace(model=None, model_kwargs=None, pretrained=False, checkpoint=None, retrain_base=False,
                           data=bench)
    start = start_run(["hetdpt"], [Budget(sites=0)], sets=list(sets or []))   # the run start every command has
    dense, spec, info = base_model(args, log=lambda m: None)
    attached = start.attach(dense, classification(data_for(args, dense)), spec, info, log=lambda m: None)
    return SimpleNamespace(bench=bench, sets=list(sets or []), registry=start.registry, strategy=start.strategy,
                           settings=start.settings, dense=dense, spec=spec, info=attached.info,
                           task=attached.task, base_key=attached.key)


def truth_rows(ctx, target: str, pairs, seeds, out: Path, jobs: int, log) -> list[dict]:
    """Fine-tune ``pairs`` x ``seeds`` on the final schedule (or reuse the rows already in ``out``), keyed as
    ``hetprune ablate`` keys them, so an ablation with ``--out`` there reuses them too."""
    from hetprune.harness.ablate import split_plans
    from hetprune.harness.compare import run_rows

    plans = split_plans(sorted(pairs), list(seeds), ctx.settings, budget_of(target), ctx.base_key,
                        ctx.task.key, kind="truth", unused=("hetdpt",))
    return run_rows(plans, ctx.registry, ctx.dense, ctx.spec, ctx.task, ctx.info, out, resume=True, jobs=jobs,
                    data_spec=ctx.bench, log=log, progress=False)


def final_images(ctx) -> int:
    """Images through one final fine-tune: epochs x the subset (or the whole training set)."""
    ft = ctx.settings.run.schedule("finetune")
    n = ctx.task.train_size
    return int(ft.epochs * (min(ft.subset, n) if ft.subset else n))


# -- what seed noise alone costs -------------------------------------------------------------------------------

def oracle_rows(truths: dict) -> list[dict]:
    """What seed noise alone costs: each seed picks its own best split by its own truth rows (what MAP could
    do with every split measured by the real pipeline on that seed), judged by the mean over seeds."""
    out = []
    for (bench, target), t in truths.items():
        true = {f"{a}+{m}": t["splits"][(a, m)]["true"] for a, m in map(tuple, t["pairs"])}
        best = max(true, key=lambda k: (true[k], -int(k.split("+")[0])))
        seeds = sorted({int(s) for v in t["splits"].values() for s in v["per_seed"]})
        per = []
        for seed in seeds:
            own = {k: t["splits"][tuple(map(int, k.split("+")))]["per_seed"].get(str(seed)) for k in true}
            if None in own.values():
                continue
            pick = max(own, key=lambda k: (own[k], -int(k.split("+")[0])))
            per.append({"seed": seed, "pick": pick, "true_of_pick": true[pick], "regret": true[best] - true[pick]})
        if per:
            out.append({"bench": bench, "target": target, "best": best, "best_true": true[best], "seeds": per,
                        "mean_regret": statistics.mean(p["regret"] for p in per)})
    return out


def floors_of(oracle: list[dict]) -> dict:
    """Each target's seed-noise floor, ``{(bench, target): mean regret of each seed's own best split}``."""
    return {(o["bench"], o["target"]): o["mean_regret"] for o in oracle}
