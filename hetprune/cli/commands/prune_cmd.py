"""Prune a model with one strategy and save recipe + weights + report.

    hetprune prune --strategy hetdpt --budget 12
    hetprune prune --strategy hetdpt --target-macs 0.6 --config my.yaml --out runs/mine

Settings come from the strategy's defaults, then --config FILE (YAML), then
the options below, then --set KEY=VALUE (e.g. --set finetune.epochs=10).
"""

from __future__ import annotations

from pathlib import Path

from ...core import loader
from ...core.errors import HetpruneError
from ...core.plugins import get_registry
from .common import add_model_arguments, base_and_data, command_line, print_plan

HELP = "prune a model with one strategy (hetdpt, baselines, plugins)"


def add_budget_arguments(p, many: bool = False, default: str = "") -> None:
    g = p.add_argument_group("budget (give one)")
    b = g.add_mutually_exclusive_group()
    b.add_argument("--budget", type=int, metavar="K", help="remove K sites (n_attn + n_act = K)")
    if many:
        b.add_argument("--budgets", metavar="K,K,...", help="several site budgets, e.g. 4,8,12")
        b.add_argument("--target-macs", metavar="F,F,...",
                       help="MACs at most F of dense (F <= 1) or an absolute amount (2.6G); several give several "
                            f"budgets{default}")
    else:
        b.add_argument("--target-macs", metavar="F|2.6G", help="MACs at most F of dense (F <= 1) or an absolute amount")
    b.add_argument("--target-speedup", type=float, metavar="S",
                   help="at least S times faster than dense, by the cost model (--cost-model: MACs, or measured time)")
    b.add_argument("--target-latency", metavar="T", help="at most T per forward pass, e.g. 12ms (measured time, at "
                                                         "the latency model's batch size, --latency-batch)")


def add_settings_arguments(p) -> None:
    g = p.add_argument_group("settings")
    g.add_argument("--config", metavar="FILE", help="YAML file of settings (unknown keys are errors)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. finetune.epochs=10 (repeatable)")
    g.add_argument("--scorer", metavar="NAME", help="importance scorer within each kind (default gate-taylor)")
    g.add_argument("--predictor", metavar="NAME", help="accuracy predictor of strategies that have one (hetdpt)")
    g.add_argument("--cost-model", metavar="auto|macs|latency",
                   help="what --target-speedup counts: macs, or latency measured on the run's device (cached per "
                        "device, dtype and batch size); default auto = latency on CUDA, else macs")
    g.add_argument("--latency-batch", type=int, metavar="N",
                   help="batch size the latency model times at (default 64; sets "
                        "cost_model_options.latency.batch_size)")
    g.add_argument("--round-to", type=int, metavar="N",
                   help="width strategies: keep head dims, MLP hidden and embedding widths multiples of N "
                        "(default 8; sets width.pruner_options.round_to)")
    g.add_argument("--device", metavar="auto|cpu|cuda|cuda:N",
                   help="where every model and batch of the run lives (default auto: cuda where there is a GPU, "
                        "else cpu; the first line says which)")
    g.add_argument("--amp", metavar="auto|bf16|fp16|none",
                   help="mixed precision of fine-tuning and evaluation (default auto: bf16 on CUDA where native, "
                        "else none)")
    add_plan_arguments(g)
    g.add_argument("--resume", action="store_true", help="continue from checkpoints in the work folder")
    g.add_argument("--overwrite", action="store_true", help="replace an output folder holding another result")


def add_reuse_older_argument(g) -> None:
    """``--reuse-older`` of the commands whose rows a resume reuses (compare, ablate)."""
    g.add_argument("--reuse-older", action="store_true",
                   help="with --resume: reuse finished rows made by another behaviour of a component than this "
                        "release's (an older release's), marked in the table; without it they are made again")


def add_plan_arguments(g) -> None:
    g.add_argument("--plan", action="store_true",
                   help="train nothing: print every stage with its fine-tunes, images and evaluations, and after a "
                        "short probe of the final fine-tune's real step on this device, images/s, peak memory and "
                        "the hours and GPU-hours of each stage (written to the work folder; the run that follows "
                        "reports the probe)")
    g.add_argument("--plan-probe", type=float, metavar="S",
                   help="with --plan: seconds its probe times the training step (default 45; 0: no probe, counts "
                        "only)")


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--strategy", default="hetdpt", metavar="NAME", help="strategy name (see `hetprune plugins`)")
    add_budget_arguments(p)
    add_settings_arguments(p)
    p.add_argument("--seed", type=int, help="seed of selection and fine-tuning (default 0)")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/prune-STRATEGY-BUDGET)")


def budget_from(args, sites: int | None = None):
    from ...pruning.budget import Budget, parse_latency, parse_macs

    if sites is not None:
        return Budget(sites=sites)
    if args.budget is not None:
        return Budget(sites=args.budget)
    if args.target_macs is not None:
        return Budget(target_macs=parse_macs(args.target_macs))
    if args.target_speedup is not None:
        return Budget(target_speedup=args.target_speedup)
    if getattr(args, "target_latency", None) is not None:
        return Budget(target_latency=parse_latency(args.target_latency))
    return None


def latency_batch_flag(latency_batch: int | None) -> dict:
    """``--latency-batch N`` sets the batch size the latency cost model times at."""
    if latency_batch is None:
        return {}
    if latency_batch < 1:
        raise HetpruneError(f"--latency-batch must be a whole number >= 1, got {latency_batch}")
    return {"cost_model_options": {"latency": {"batch_size": latency_batch}}}


def predictor_flag(defaults: dict, predictor: str | None, what: str) -> dict:
    """``--predictor NAME`` sets the predictor of every settings section that has one."""
    if not predictor:
        return {}
    owners = [k for k, v in defaults.items() if isinstance(v, dict) and "predictor" in v]
    if not owners:
        raise HetpruneError(f"--predictor applies to strategies with an accuracy predictor; {what!r} has none")
    return {k: {"predictor": predictor} for k in owners}


def round_to_flag(defaults: dict, round_to: int | None, what: str) -> dict:
    """``--round-to N`` sets the width pruner's ``round_to`` of strategies that prune widths."""
    if round_to is None:
        return {}
    if "width" not in defaults:
        raise HetpruneError(f"--round-to applies to width strategies (isomorphic, hetdpt-plus); {what!r} prunes "
                            "no widths")
    if round_to < 1:
        raise HetpruneError(f"--round-to must be a whole number >= 1, got {round_to}")
    return {"width": {"pruner_options": {"round_to": round_to}}}


def settings_options(args, strategies: list) -> dict:
    """What a command's settings options give `hetprune.pruning.run_start.start_run`: the flags as overrides
    (typed values, nested where a flag sets a section's setting: after the YAML file, before ``--set``, so
    ``--set`` wins), the ``--set`` items and the YAML file."""
    overrides = {"scorer": args.scorer, "device": args.device, "amp": args.amp, "cost_model": args.cost_model}
    if getattr(args, "seed", None) is not None:
        overrides["seed"] = args.seed
    defaults, _ = loader.sections_of(strategies)
    what = ",".join(s.name for s in strategies)
    overrides.update({**predictor_flag(defaults, getattr(args, "predictor", None), what),
                      **round_to_flag(defaults, getattr(args, "round_to", None), what),
                      **latency_batch_flag(args.latency_batch)})
    return {"config_file": args.config, "overrides": overrides, "sets": list(args.set)}


def run(args) -> int:
    """Parse the options, start the run, build the model and its Task, and call
    [`hetprune.prune`][hetprune.harness.api.prune]."""
    from ...core import distributed as dist
    from ...harness.api import prune
    from ...model.macs import human
    from ...model.recipe import PRUNED_MODEL
    from ...pruning.run_start import probe_for, start_run
    from ...training.task import classification

    registry = get_registry()
    probe_for(args.plan, args.plan_probe)   # refused before the base model is built or trained
    strategy = registry.build("strategy", args.strategy)
    budget = budget_from(args)
    if budget is None:
        raise HetpruneError("give a budget: --budget K, --target-macs F, --target-speedup S or --target-latency T")
    tag = budget.to_dict()
    out = Path(args.out or f"runs/prune-{strategy.name}-{'-'.join(f'{k}{v}' for k, v in tag.items())}")
    start = start_run([strategy], [budget], folder=PRUNED_MODEL, out=out, resume=args.resume,
                      overwrite=args.overwrite, registry=registry, **settings_options(args, [strategy]), plan=args.plan)
    dense, spec, base_info, data = base_and_data(args, start, "prune")
    result = prune(dense, classification(data), start=start, spec=spec, base_info=base_info, out=out,
                   resume=args.resume, provenance={"command": command_line(args)},   # quoted by model cards
                   plan=args.plan, plan_probe=args.plan_probe)
    if args.plan:
        return print_plan(result, out.with_name(out.name + ".work"))
    if not dist.is_main():  # under torchrun rank 0 writes and reports
        return 0
    r = result.report
    print(f"\n{strategy.name}: {r['n_attn']} attention + {r['n_act']} activation sites removed: {', '.join(r['sites'])}")
    print(f"top-1: dense {r['metric_dense']:.2f}%, after removal {r['metric_before_finetune']:.2f}%, "
          f"after fine-tune {r['metric']:.2f}%")
    print(f"params {human(r['dense_params'])} -> {human(r['params'])}, MACs {human(r['dense_macs'])} -> "
          f"{human(r['macs'])} ({r['dense_macs'] / r['macs']:.2f}x fewer; {r['macs_convention']})")
    if "cost" in r:
        print(cost_line(r["cost"]))
    print(f"saved {out}/ (recipe.json, model.safetensors, report.json) in {r['seconds']:.0f}s")
    return 0


def cost_line(cost: dict) -> str:
    """The report's cost block in one line: predicted (and measured) speedup by the run's cost model."""
    line = f"{cost['model']}: predicted speedup {cost['predicted_speedup']:.2f}x"
    if "measured_speedup" in cost:
        line += f", measured {cost['measured_speedup']:.2f}x"
    about = cost.get("about", {})
    if "batch_size" in about:
        line += f" (batch {about['batch_size']}, {about.get('dtype', '')}, {about.get('device', '')})"
    if about.get("untrusted"):   # the table's warning scrolled by during the run: the summary repeats it
        line += f"; warning: predictions cannot be trusted here: {about['untrusted']}"
    return line
