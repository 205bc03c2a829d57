"""hetprune as a library: [`prune`][hetprune.harness.api.prune] a model for a task, from Python.

    result = hetprune.prune(model, task, strategy="hetdpt", budget=12)      # or target_macs=0.5, ...
    result.model, result.recipe, result.report

``model`` is any ``nn.Module`` an adapter knows: a timm or Hugging Face ViT,
one inside the user's own module (a backbone under a head), or the user's own
transformer with ``adapter=hetprune.model.adapters.generic(...)``. ``task`` is a
[`hetprune.Task`][hetprune.training.task.Task] (the user's data, loss, metric and training loop) or a
classification `DataBundle`. The CLI's ``hetprune
prune`` parses its options, builds the model and the Task, and calls
[`prune`][hetprune.harness.api.prune]; ``hetprune.compare`` and ``hetprune.ablate`` run the same
jobs for several strategies, splits and seeds.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from torch import nn

from ..core import distributed as dist
from ..model.adapters import Adapter
from ..pruning.budget import Budget
from ..training.loaders import closing_loaders, row_threading, seed_everything
from ..core.errors import HetpruneError
from ..core.io import check_result_folder, no_empty_folder_on_error
from ..model.spec import ModelSpec
from ..pruning.pipeline import PruneJob, PruneResult, check_job
from ..core.plugins import Registry
from ..pruning.plan import Plan, probe, read_probe, val_size
from ..pruning.plan import write as write_plan
from ..model.recipe import PRUNED_MODEL, REPORT_FILE, save
from ..pruning import run_start
from ..pruning.run_start import RunStart, as_given, check_names, dense_info, run_device, run_key  # noqa: F401 - public here
from ..training.task import Task


def make_budget(budget: int | Budget | None = None, target_macs: float | None = None,
                target_speedup: float | None = None, target_latency: float | None = None) -> Budget:
    """Exactly one budget: a site count (or a [`Budget`][hetprune.pruning.budget.Budget]), a MAC target (a share of dense <= 1, or an
    absolute count), a speedup or a latency in seconds."""
    given = {k: v for k, v in (("budget", budget), ("target_macs", target_macs), ("target_speedup", target_speedup),
                               ("target_latency", target_latency)) if v is not None}
    if len(given) != 1:
        raise HetpruneError(f"give exactly one budget: budget=K (sites), target_macs=F, target_speedup=S or "
                            f"target_latency=T; got {', '.join(given) or 'none'}")
    if isinstance(budget, Budget):
        return budget
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise HetpruneError(f"budget counts sites to remove: a whole number, got {budget!r}")
        return Budget(sites=budget)
    if target_macs is not None:
        return Budget(target_macs=float(target_macs))
    if target_speedup is not None:
        return Budget(target_speedup=float(target_speedup))
    return Budget(target_latency=float(target_latency))


def check_out(out: Path, overwrite: bool) -> Path:
    """Refuse an output folder before any work: one that cannot be written, a link to nothing, one whose
    ``OUT.work`` is a file, one that holds anything hetprune did not write (overwrite or not), or another
    result without ``overwrite``. Returns the folder to write (a link's target)."""
    return check_result_folder(out, PRUNED_MODEL, overwrite)


@closing_loaders()   # the call leaves no loader worker behind
def prune(model: nn.Module, task: Task, strategy: str = "hetdpt", budget: int | Budget | None = None, *,
          target_macs: float | None = None, target_speedup: float | None = None,
          target_latency: float | None = None, settings: dict | None = None, config: str | None = None,
          out: str | Path | None = None,
          resume: bool = False, overwrite: bool = False, device: str | None = None, amp: str | None = None,
          seed: int | None = None, adapter: Adapter | None = None, registry: Registry | None = None,
          spec: ModelSpec | None = None, base_info: dict | None = None, progress: bool = True,
          log: Callable[[str], None] = print, provenance: dict | None = None,
          start: RunStart | None = None, plan: bool = False,
          plan_probe: float | None = None) -> PruneResult | Plan:
    """Prune ``model`` for ``task`` with one strategy; returns the pruned model, its recipe and its report.

    ``model`` is not changed: the strategy prunes a copy, and the dense model
    is the teacher (it is evaluated and moved to the run's device meanwhile;
    its modules' train/eval modes and its device are restored at the end). Give one budget: ``budget`` (sites), ``target_macs``,
    ``target_speedup`` or ``target_latency``. ``settings`` is a nested dict
    over the strategy's defaults (e.g. ``{"finetune": {"epochs": 10}}``;
    the [settings reference](../reference/settings.md) lists them), ``config`` a YAML file or a shipped
    config's name (``"deit-b-paper"``, ``"deit-s-paper"``, ``"quick"``) under it. On real data (an ImageFolder,
    or a training set far larger than the embedded benchmarks') a run whose schedules nobody chose stops. With ``out`` the
    result is saved there (``recipe.json``, ``model.safetensors``,
    ``report.json``) and checkpoints go beside it (``OUT.work``), so
    ``resume=True`` continues an interrupted run; without it the run works in
    a temporary folder. ``adapter`` pins the architecture adapter (a user's
    own transformer: `hetprune.model.adapters.generic`); ``spec`` says how
    hetprune can build the base again (a timm name), else the recipe records
    a user-built base. ``start`` is a run already started with
    [`start_run`][hetprune.pruning.run_start.start_run] (the command line starts one
    before it builds the base model); the run's own arguments are then its.

    ``plan=True`` trains nothing and returns a [`Plan`][hetprune.pruning.plan.Plan]: every stage with its
    fine-tunes and images, and after a probe of ``plan_probe`` seconds of the final fine-tune's real step
    (default 45; 0: none) its rates, memory, hours and GPU-hours; it is written to ``OUT.work/plan.json``, and
    the run that follows reports the probe (``report["plan_probe"]``). ``plan_probe`` without ``plan`` is
    refused (the run would train in full).
    """
    if not isinstance(model, nn.Module):
        raise HetpruneError(f"prune() takes a torch module as its model, got {type(model).__name__}")
    if out is None and resume:
        raise HetpruneError("resume=True needs out=FOLDER: checkpoints live beside the result")
    plan_probe = run_start.probe_for(plan, plan_probe)   # a probe without a plan is refused: the run would train
    if start is None:
        start = run_start.start_run([strategy], [make_budget(budget, target_macs, target_speedup, target_latency)],
                          folder=PRUNED_MODEL, out=out, resume=resume, overwrite=overwrite, settings=settings,
                          config_file=config,
                          overrides={"device": device, "amp": amp, "seed": seed}, registry=registry, plan=plan)
    strat, name = start.strategy, getattr(start.strategy, "name", type(start.strategy).__name__)
    seed_everything(start.config.seed)
    with _workdir(start.out) as workdir, as_given(model):
        dense = start.attach(model, task, spec, base_info, adapter, log, measure=not plan)   # adapter checked first
        job = PruneJob(dense=model, spec=spec, data=None, task=dense.task, budget=start.budget,
                       settings=start.settings, registry=start.registry, workdir=workdir, resume=start.resume,
                       progress=progress, log=log, strategy_name=name, adapter=dense.adapter, base_info=dense.info)
        key = run_key(start, dense, name)
        with job.serving():
            check_job(strat, job)   # what can be refused is refused before anything trains (or is planned)
            if plan:
                return make_plan(job, strat, plan_title(job, name, start.budget.describe()), key,
                                 *start.probe_here(plan_probe), workdir=workdir, before=start.before)
            workers = start.config.schedule("finetune").workers or int(getattr(getattr(dense.task, "data", None),
                                                                               "workers", None) or 0)
            with row_threading(start.device, 1, workers, log if dist.is_main() else None):
                result = strat.run(job)
            result.report["plan_probe"] = read_probe(workdir, key)   # what a --plan of this run measured
            result.report.setdefault("base_weights", dense.info)   # where the dense model came from (a made base)
            if start.out is not None and dist.is_main():   # under torchrun rank 0 writes
                result.recipe.provenance.update(provenance or {})
                save(start.out, result.model, result.recipe, overwrite=start.overwrite,
                     extra_files={REPORT_FILE: result.report})
    return result


def plan_title(job: PruneJob, what: str, budget: str) -> str:
    """A plan's first line: strategy and budget, the base model, the data's sizes and the ranks."""
    val, held = val_size(job.task), val_size(job.task, "selection")
    train = job.task.train_size
    selection = "" if held is None else f"{held:,} selection / "
    sizes = (f"{train:,} train / {selection}{val:,} val images" if train is not None and val is not None
             else "sizes unknown")
    model = job.spec.label() if job.spec is not None else "user model"
    return f"{what}, {budget}; {model}; data {job.task.name} ({sizes}); {dist.world()} rank(s)"


def make_plan(job: PruneJob, strategy, title: str, key: str, probe_s: float, notes: list[str] = (),
              workdir: Path | None = None, before: list = ()) -> Plan:
    """The plan of one job: the work before it (``before``: making its base), its strategy's steps (a strategy
    that does not describe them says so), the probe, written where the run finds it (rank 0)."""
    notes = list(notes)
    if hasattr(strategy, "plan"):
        steps = [*before, *strategy.plan(job)]
    else:
        steps = list(before)
        notes.append(f"strategy {job.strategy_name} does not describe its stages (no plan method)")
    found = probe(job, probe_s) if probe_s > 0 else None
    made = Plan(title, steps, found, key, dist.world(), notes)
    if workdir is not None and dist.is_main():
        write_plan(made, workdir)
    return made


@contextlib.contextmanager
def _workdir(out: Path | None):
    """Where checkpoints go: beside ``out`` (``OUT.work``, kept for resume), else a temporary folder."""
    if out is not None:
        work = out.with_name(out.name + ".work")
        with no_empty_folder_on_error(work):   # bad input found during the run leaves no empty work folder
            yield work
        return
    tmp = Path(tempfile.mkdtemp(prefix="hetprune-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
