"""The comparison harness: several strategies, budgets and seeds on the same
dense model, data, settings and timer; one table and one plot.

Work happens in two phases so that timing never competes with training:
1. prune + fine-tune every (strategy, budget, seed) row, saving each pruned
   model and its row the moment it finishes (``rows.jsonl``; `rows`);
2. time every pruned model against the dense one, interleaved, in one process
   (`timing`);
then the results are written (`report`). A rerun with ``--resume``
reuses every finished row whose settings match, so an interrupted run loses
at most the row in progress.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torch import nn

from ...core import distributed as dist
from ...pruning.budget import Budget
from ...core.errors import HetpruneError, option
from ...core.io import no_empty_folder_on_error
from ...pruning.plan import read_probe
from ...core.plugins import Registry
from ...training.loaders import closing_loaders
from ...pruning.run_start import probe_for, run_key
# the names other modules, benchmarks and tests import from hetprune.harness.compare
from .report import aggregate, base_text, budget_text, markdown_table, mean_std, rows_csv, write_outputs  # noqa: F401
from .rows import COMPARE_FOLDER, ROWS_FILE, RowStore, plan_rows, prepare_out, row_job, run_one, run_rows  # noqa: F401
from .spec import CompareSpec, RowPlan, distinct, row_id, row_key, whole_number  # noqa: F401
from .report import untrusted_timing  # noqa: F401
from .timing import attach_speed, measure_rows, structure_of  # noqa: F401


DEFAULT_STRATEGIES = ("hetdpt", "attn-only", "act-only", "mix50")


@dataclass
class CompareResult:
    """What [`compare`][hetprune.harness.compare.compare] returns: one row per (strategy, budget, seed), their mean ± std per (strategy,
    budget), the dense model's row, and the Markdown table also written to ``out/results.md``."""

    rows: list[dict]
    aggregates: list[dict]
    dense: dict
    markdown: str
    out: Path


def plan_of_rows(plans: list[RowPlan], registry, model, spec, task, info: dict, out: Path, adapter, log,
                 probe_s: float, key: str, title: str, group=lambda plan: plan.label or plan.strategy,
                 before: list | None = None, notes: list[str] = (), preceding: list = ()):
    """The plan of a harness's rows (a compare's, an ablation's): the work before them (``preceding``: making their
    base), each row's job planned by its strategy, summed per ``group``; one probe of the final fine-tune (the
    rows share the schedule); written to ``OUT/work/plan.json``."""
    from ...pruning.pipeline import check_job
    from ...pruning.plan import Plan, grouped, probe, write

    rows, first = list(before or []), None
    for row in plans:
        strategy, job = row_job(row, registry, model, spec, task, info, out, log=log, adapter=adapter)
        with job.serving():
            check_job(strategy, job)   # a plan catches what the rows would refuse
            rows.append((group(row), list(strategy.plan(job)) if hasattr(strategy, "plan") else []))
        first = first or job
    with first.serving():
        found = probe(first, probe_s) if probe_s > 0 and first is not None else None
    made = Plan(title, [*preceding, *grouped(rows)], found, key, dist.world(), list(notes))
    if dist.is_main():
        write(made, out / "work")
    return made


def python_call(function: str, **arguments) -> str:
    """How a Python call is named in a results file (where a command line would be): ``hetprune.compare(model,
    task, strategies=[...], ...)``."""
    return f"hetprune.{function}(model, task, " + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"


@closing_loaders()   # the call leaves no loader worker behind
def compare(model: nn.Module, task, strategies=DEFAULT_STRATEGIES, budgets=(12,), seeds=(0,), *,
            settings: dict | None = None, out: str | Path = "runs/compare", resume: bool = False,
            overwrite: bool = False, batch_sizes=(1, 256), speed_budget_s: float = CompareSpec.speed_budget_s,
            jobs: int = 1, spec=None, base_info: dict | None = None,
            registry: Registry | None = None, device: str | None = None, amp: str | None = None, adapter=None,
            data_spec: str | None = None, meta: dict | None = None, log: Callable[[str], None] = print,
            progress: bool = True, start=None, plan: bool = False, plan_probe: float | None = None,
            reuse_older: bool = False):
    """Run several strategies on ``model`` for ``task`` under one harness: the same dense model, data,
    settings, seeds and timer; write ``results.md``, ``results.csv``, ``results.json`` and ``pareto.png``
    to ``out`` and return the rows.

    ``speed_budget_s``: seconds per batch size the timer may add to know every speedup within ±2 %
    (models with the same structure are timed once and share their figure).
    ``budgets`` are site counts or [`Budget`][hetprune.pruning.budget.Budget] objects (``Budget(target_macs=0.5)``);
    every other argument means what it means for [`hetprune.prune`][hetprune.harness.api.prune]. Finished rows are kept as they
    finish, so ``resume=True`` continues an interrupted comparison; a row made by another behaviour of a
    component than this release's is made again unless ``reuse_older`` (marked in the table). ``start`` is a run already started with
    [`start_run`][hetprune.pruning.run_start.start_run] (the command line's); the run's own arguments are then its.
    ``plan=True`` trains nothing and returns the [`Plan`][hetprune.pruning.plan.Plan] of every row, summed per
    strategy (see [`hetprune.prune`][hetprune.harness.api.prune]); it goes to ``OUT/work/plan.json``.
    """
    from ...pruning import cost_choice as cost_model
    from ...core import devices
    from ...pruning.run_start import as_given, start_run

    names = [strategies] if isinstance(strategies, str) else list(strategies)
    if not names or len(set(names)) != len(names):
        raise HetpruneError(f"strategies must name each strategy once, got {names}")
    seeds = distinct([whole_number(s, "a seed") for s in seeds], option("seeds"))
    batch_sizes = [whole_number(b, "a batch size") for b in batch_sizes]
    if not budgets or not seeds or not batch_sizes or any(b < 1 for b in batch_sizes):
        raise HetpruneError(f"compare needs budgets, seeds and batch sizes >= 1; got {list(budgets)}, {seeds}, "
                            f"{batch_sizes}")
    if jobs < 1:
        raise HetpruneError(f"jobs must be >= 1, got {jobs}")
    if dist.active() and jobs > 1:
        raise HetpruneError("jobs > 1 runs rows in parallel processes on one machine; under torchrun use jobs=1")
    if not (isinstance(speed_budget_s, (int, float)) and speed_budget_s >= 0):
        raise HetpruneError(f"speed_budget_s must be a number of seconds >= 0, got {speed_budget_s!r}")
    plan_probe = probe_for(plan, plan_probe)   # a probe without a plan is refused: the rows would train
    if start is None:
        the_budgets = distinct([b if isinstance(b, Budget) else Budget(sites=whole_number(b, "a budget"))
                                for b in budgets], option("budgets"))
        start = start_run(names, the_budgets, folder=COMPARE_FOLDER, out=out, resume=resume, overwrite=overwrite,
                          settings=settings, overrides={"device": device, "amp": amp}, registry=registry, plan=plan,
                          reuse_older=reuse_older)
    registry, run_settings, the_budgets = start.registry, start.settings, start.budgets
    for name in sorted(cost_model.refuse_parallel(jobs, the_budgets, run_settings)):
        cm = cost_model.build(registry, name, run_settings)   # time the models where it predicts, too
        if isinstance(getattr(cm, "batch_size", None), int) and cm.batch_size not in batch_sizes:
            batch_sizes.append(cm.batch_size)
    with no_empty_folder_on_error(start.out), as_given(model):   # bad input found later leaves no folder behind
        out = start.prepare_out()
        dense = start.attach(model, task, spec, base_info, adapter, log, measure=not plan)
        task, adapter, info = dense.task, dense.adapter, dense.info
        run_settings = start.settings   # schedules sized by the data (image_passes) once attached
        spec_ = CompareSpec(names, the_budgets, seeds, run_settings, batch_sizes=batch_sizes,
                            device=start.config.device, speed_budget_s=float(speed_budget_s))
        plans = plan_rows(spec_, dense.key, task.key)
        key = run_key(start, dense, ",".join(names))
        if plan:
            probe_s, notes = start.probe_here(plan_probe)
            return plan_of_rows(plans, registry, model, spec, task, info, out, adapter, log, probe_s, key,
                                f"compare {', '.join(names)}, {len(plans)} rows", notes=notes, preceding=start.before)
        rows = run_rows(plans, registry, model, spec, task, info, out, resume=start.resume, jobs=jobs,
                        reuse_older=start.reuse_older,
                        data_spec=data_spec, adapter=adapter, log=log, progress=progress)
        if not dist.is_main():  # rank 0 times the models and writes the results
            return CompareResult(rows, [], {}, "", out)
        from ...model.adapters import serving
        from ...model.macs import cost_summary

        example = devices.place(task.example(2), start.device)
        with serving(adapter):   # the job's adapter counts and loads every model (a generic one is registered nowhere)
            dense_row = {"strategy": "dense", "metric": info["metric"], **cost_summary(model, example)}
            if task.metric_name == "top1":
                dense_row["top1"] = info["metric"]
            reached = [r for r in rows if "unreachable" not in r]   # a row that cannot meet its budget has no model
            timing = measure_rows(spec_, model, reached, out, input_shape=tuple(example.shape[1:]), log=log,
                                  model_spec=spec, adapter=adapter)
        attach_speed(reached, dense_row, timing)
        call = python_call("compare", strategies=names, budgets=[b.as_argument() for b in the_budgets],
                           seeds=seeds, out=str(out))
        written = write_outputs(out, spec_, dense_row, rows, timing,
                                {"model": spec.name if spec is not None else info["source"],
                                 "data": task.name, "metric_name": task.metric_name,
                                 "higher_is_better": task.higher_is_better, "base": info, "command": call,
                                 "plan_probe": read_probe(out / "work", key), **(meta or {})})
        return CompareResult(rows, written["aggregates"], dense_row, written["markdown"], out)
