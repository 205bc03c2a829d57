"""hetprune as a library: [`prune`][hetprune.api.prune] a model for a task, from Python.

    result = hetprune.prune(model, task, strategy="hetdpt", budget=12)      # or target_macs=0.5, ...
    result.model, result.recipe, result.report

``model`` is any ``nn.Module`` an adapter knows: a timm or Hugging Face ViT,
one inside the user's own module (a backbone under a head), or the user's own
transformer with ``adapter=hetprune.adapters.generic(...)``. ``task`` is a
[`hetprune.Task`][hetprune.task.Task] (the user's data, loss, metric and training loop) or a
classification `DataBundle`. The CLI's ``hetprune
prune`` parses its options, builds the model and the Task, and calls
[`prune`][hetprune.api.prune]; ``hetprune.compare`` and ``hetprune.ablate`` run the same
jobs for several strategies, splits and seeds.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from . import config as config_mod
from . import cost_model, devices
from . import distributed as dist
from . import result_checks  # noqa: F401 - adds the strategy rule: every result is checked and reloaded
from .adapters import Adapter
from .budget import Budget
from .data import seed_everything
from .errors import HetpruneError
from .io import check_result_folder, no_empty_folder_on_error
from .models import ModelSpec, model_hash
from .pipeline import PruneJob, PruneResult
from .plugins import Registry, get_registry
from .recipe import PRUNED_MODEL, REPORT_FILE, save
from .task import Task, as_task


def make_budget(budget: int | Budget | None = None, target_macs: float | None = None,
                target_speedup: float | None = None, target_latency: float | None = None) -> Budget:
    """Exactly one budget: a site count (or a [`Budget`][hetprune.budget.Budget]), a MAC target (a share of dense <= 1, or an
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


def resolve_settings(strategy, settings: dict | None = None, config_file: str | None = None,
                     sets: list[str] | None = None, **overrides) -> dict:
    """The run's settings: the strategy's defaults <- a YAML file <- ``settings`` (a nested dict) <- the
    keyword overrides (``device``, ``amp``, ``seed``, ``scorer``, ``cost_model``) <- ``--set`` items."""
    given = {**(settings or {}), **{k: v for k, v in overrides.items() if v is not None}}
    return config_mod.resolve(getattr(strategy, "defaults", {}), config_file, given, sets,
                              types=getattr(strategy, "setting_types", None))


def run_device(settings: dict) -> torch.device:
    """Resolve the run's device and mixed precision once, at the start.

    ``settings["device"]`` becomes the checked, rank-independent name (``auto``
    resolved) and ``settings["amp"]`` the precision that will run; under
    torchrun this process joins the process group (nccl on CUDA, gloo on CPU).
    Returns this process's ``torch.device``.
    """
    settings["device"] = devices.canonical(settings["device"])
    device = devices.resolve(settings["device"])
    settings["amp"] = devices.resolve_amp(settings["amp"], device)
    dist.init_from_env(device)
    return device


def check_names(registry: Registry, settings: dict) -> None:
    """Unknown component names fail now, not after an hour of work: the run's scorer, and in every section a
    ``predictor`` or a ``..._scorer`` (``hetdpt.point_scorer``) that names one."""
    registry.component("scorer", settings["scorer"])
    for name, section in settings.items():
        if not isinstance(section, dict):
            continue
        for key, value in section.items():
            kind = ("predictor" if key == "predictor" or key.endswith("_predictor") else
                    "scorer" if key == "scorer" or key.endswith("_scorer") else None)
            if kind is None or not isinstance(value, str):
                continue
            try:
                registry.component(kind, value)
            except HetpruneError as exc:
                raise HetpruneError(f"setting {name}.{key}: {exc}") from None


def dense_info(model: nn.Module, task: Task, spec: ModelSpec | None, base_info: dict | None, settings: dict) -> dict:
    """The dense model's provenance for a run: where it came from, its hash, and its metric on the task
    (measured on the run's device, as every pruned model will be; ``top1`` too for a classification task)."""
    info = dict(base_info or {})
    info.setdefault("source", "user model" if spec is None else spec.name)
    info.setdefault("hash", model_hash(model))
    device = devices.resolve(settings["device"])
    devices.place(model, device)
    if "metric" not in info:
        info["metric"] = task.evaluate(model, device, amp=settings["amp"], workers=settings["finetune"]["workers"])
    if task.metric_name == "top1":
        info["top1"] = info["metric"]
    return info


def check_out(out: Path, overwrite: bool) -> Path:
    """Refuse an output folder before any work: one that cannot be written, a link to nothing, one whose
    ``OUT.work`` is a file, one that holds anything hetprune did not write (overwrite or not), or another
    result without ``overwrite``. Returns the folder to write (a link's target)."""
    return check_result_folder(out, PRUNED_MODEL, overwrite)


def prune(model: nn.Module, task: Task, strategy: str = "hetdpt", budget: int | Budget | None = None, *,
          target_macs: float | None = None, target_speedup: float | None = None,
          target_latency: float | None = None, settings: dict | None = None, out: str | Path | None = None,
          resume: bool = False, overwrite: bool = False, device: str | None = None, amp: str | None = None,
          seed: int | None = None, adapter: Adapter | None = None, registry: Registry | None = None,
          spec: ModelSpec | None = None, base_info: dict | None = None, progress: bool = True,
          log: Callable[[str], None] = print, provenance: dict | None = None) -> PruneResult:
    """Prune ``model`` for ``task`` with one strategy; returns the pruned model, its recipe and its report.

    ``model`` is not changed: the strategy prunes a copy, and the dense model
    is the teacher (it is evaluated and moved to the run's device meanwhile;
    its modules' train/eval modes and its device are restored at the end). Give one budget: ``budget`` (sites), ``target_macs``,
    ``target_speedup`` or ``target_latency``. ``settings`` is a nested dict
    over the strategy's defaults (e.g. ``{"finetune": {"epochs": 10}}``;
    ``hetprune prune --help`` and the docs list them). With ``out`` the
    result is saved there (``recipe.json``, ``model.safetensors``,
    ``report.json``) and checkpoints go beside it (``OUT.work``), so
    ``resume=True`` continues an interrupted run; without it the run works in
    a temporary folder. ``adapter`` pins the architecture adapter (a user's
    own transformer: `hetprune.adapters.generic`); ``spec`` says how
    hetprune can build the base again (a timm name), else the recipe records
    a user-built base.
    """
    if not isinstance(model, nn.Module):
        raise HetpruneError(f"prune() takes a torch module as its model, got {type(model).__name__}")
    registry = registry or get_registry()
    strat = registry.build("strategy", strategy) if isinstance(strategy, str) else strategy
    name = getattr(strat, "name", type(strat).__name__)
    the_budget = make_budget(budget, target_macs, target_speedup, target_latency)
    run_settings = resolve_settings(strat, settings, device=device, amp=amp, seed=seed)
    run_device(run_settings)
    the_budget = cost_model.bind(the_budget, run_settings, registry)
    check_names(registry, run_settings)
    task = as_task(task)
    out = Path(out) if out is not None else None
    if out is None and resume:
        raise HetpruneError("resume=True needs out=FOLDER: checkpoints live beside the result")
    if out is not None:
        out = check_out(out, overwrite)
    seed_everything(run_settings["seed"])
    with _workdir(out) as workdir, as_given(model):
        job = PruneJob(dense=model, spec=spec, data=None, task=task, budget=the_budget, settings=run_settings,
                       registry=registry, workdir=workdir, resume=resume, progress=progress, log=log,
                       strategy_name=name, adapter=adapter, base_info=dict(base_info or {}))
        job.base_info.update(dense_info(model, task, spec, job.base_info, run_settings))   # adapter checked first
        with job.serving():
            result = strat.run(job)
            if out is not None and dist.is_main():   # under torchrun rank 0 writes
                result.recipe.provenance.update(provenance or {})
                save(out, result.model, result.recipe, overwrite=overwrite,
                     extra_files={REPORT_FILE: result.report})
    return result


@contextlib.contextmanager
def as_given(model: nn.Module):
    """Give the caller's model back as it came: the run evaluates it (eval mode) and moves it to the run's
    device as the teacher; afterwards every module's train/eval mode and the model's device are restored.
    Its weights are never changed (strategies prune a copy)."""
    modes = [(m, m.training) for m in model.modules()]
    devices_ = {t.device for t in [*model.parameters(), *model.buffers()]}
    try:
        yield model
    finally:
        for module, training in modes:
            module.train(training)
        if len(devices_) == 1:
            model.to(next(iter(devices_)))


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
