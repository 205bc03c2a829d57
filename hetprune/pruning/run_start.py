"""How every run starts: [`start_run`][hetprune.pruning.run_start.start_run] for ``prune``, ``compare`` and ``ablate``,
from Python and from the command line alike.

A run resolves, once and in this order: the registry, the strategies, the
budgets, the settings (one [`hetprune.core.loader.resolve`][hetprune.core.loader.resolve]),
the device and precision (joining the process group under torchrun), the cost
model each budget counts in, the component names the settings give, and the
output folder. All of that fails before any model exists, so a command can
start a run, then build or train its base model, then hand both to the entry
point. [`RunStart.attach`][hetprune.pruning.run_start.RunStart.attach] adds what needs
the model: the task, the adapter and the dense model's provenance and metric.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..core import config as config_mod, loader
from . import cost_choice as cost_model
from ..core import devices
from ..core import distributed as dist
from ..model.adapters import Adapter
from .behaviours import named_components
from .budget import Budget
from ..training.bundle import DataBundle
from ..training.embedded_data import EMBEDDED
from ..core.errors import HetpruneError, option, switch
from ..core.io import ResultFolder, check_result_folder, make_result_folder, read_json, write_json_atomic
from ..core.settings import Settings
from ..model.spec import ModelSpec, model_hash
from .pipeline import resolve_adapter
from .plan import PROBE_SECONDS, check_probe, val_size
from ..core.plugins import KINDS, Registry, get_registry
from ..training.resume import base_key, differences
from ..training.task import Task, as_task, check_data_fits, reuse_tag


BASE_RECORD = "base.json"   # in a run's work folder: the base hetprune made for it (RunStart.remember_base;
                            # one of what hetprune.core.io.PLANNED names)


@dataclass
class Dense:
    """The run's base model once attached: the caller's model, its task, adapter, provenance (``info``:
    source, weights hash, metric) and the key every stored result made from it carries."""

    model: nn.Module
    task: Task
    adapter: Adapter
    spec: ModelSpec | None
    info: dict
    key: str


@dataclass
class RunStart:
    """A started run: everything resolved before its model exists (see the module docstring)."""

    registry: Registry
    strategies: list
    budgets: list[Budget]
    settings: Settings   # the loader's checked dict, carried as the typed object (a change: replace_in)
    device: torch.device
    out: Path | None = None
    resume: bool = False
    overwrite: bool = False
    folder: ResultFolder | None = None
    schedules_chosen: bool = False   # whether the caller chose the fine-tune schedules (a config, finetune.*, ...)
    scoring_chosen: bool = False     # whether the caller set scoring.* (a flag or --set; a config: by its value)
    probe_elsewhere: str | None = None   # a plan on a machine without the run's device: why it cannot probe here
    before: list = field(default_factory=list)   # PlanSteps of work done before the run's own (making its base)
    reuse_older: bool = False   # a resume reuses rows another behaviour of a component made (marked)
    _prepared: bool = field(default=False, repr=False)

    def remember_base(self, key: str, inputs: dict) -> None:
        """Keep the record of a base hetprune makes for this run in its work folder, and refuse ``--resume`` into
        an output folder whose results were made from another one: each of them would be made again without a
        word. Before the base trains; rank 0 reads and writes, every rank takes its answer."""
        if self.out is None or self.folder is None:
            return
        path = self.folder.work(self.out) / BASE_RECORD

        def check() -> str | None:
            if self.resume and path.is_file():
                stored = read_json(path, "base model record")
                if stored.get("key") != key:
                    changed = differences(stored.get("inputs"), inputs)
                    was = "; ".join(f"{k} {stored.get('inputs', {}).get(k)!r} -> {inputs.get(k)!r}" for k in changed)
                    return (f"{switch('resume')}: {self.out} holds results made from another base model than the one "
                            f"this run makes ({was or 'its record differs'}): each would be made again; start over "
                            f"with {switch('overwrite')} (without {switch('resume')}), or give another "
                            f"{option('out', 'DIR')}")
            write_json_atomic(path, {"key": key, "inputs": inputs})
            return None

        self.prepare_out()   # an --overwrite clears the earlier result first, its record with it (resume clears nothing)
        problem = dist.on_main(check)
        if problem is not None:
            raise HetpruneError(problem)

    def probe_here(self, seconds: float) -> tuple[float, list[str]]:
        """A plan's probe length on this machine and its notes: none, with a note saying why, where the run's
        device or precision is not here (a login node without the run's GPUs)."""
        if self.probe_elsewhere is None:
            return seconds, []
        return 0.0, [f"no probe: it times the run's own device and precision, which this machine lacks "
                     f"({self.probe_elsewhere}); the counts above hold anywhere: run --plan where the run will run "
                     "for its hours and memory"]

    @property
    def strategy(self):
        """The run's strategy (``prune`` and ``ablate`` run one)."""
        return self.strategies[0]

    @property
    def budget(self) -> Budget:
        return self.budgets[0]

    @property
    def config(self) -> config_mod.RunSettings:
        return self.settings.run

    def prepare_out(self) -> Path | None:
        """Make the output folder ready for a resumable result (compare, ablate): an earlier result's own
        entries deleted on ``overwrite`` (never anything else), the folder made. Once per run, by rank 0
        under torchrun (every rank must call it)."""
        if self.out is not None and not self._prepared and self.folder is not None and self.folder.resumable:
            # rank 0 alone clears and makes it: ranks deleting the same entries at once would fail
            dist.on_main(lambda: make_result_folder(self.out, self.folder, self.resume, self.overwrite))
            self._prepared = True
        return self.out

    def size_schedules(self, train_size: int | None, log: Callable[[str], None] = print) -> None:
        """The schedules that give ``image_passes`` get their epochs from the training set's size, once it is
        known (`hetprune.core.config.sized`), with one line each saying what they became."""
        after = self.settings.sized(train_size)
        if after is self.settings:
            return
        self.settings = after
        for section in config_mod.SCHEDULES:
            cfg = self.config.schedule(section)
            if cfg.image_passes is not None and dist.is_main():
                log(schedule_line(section, cfg, train_size))

    def attach(self, model: nn.Module, task, spec: ModelSpec | None = None, base_info: dict | None = None,
               adapter: Adapter | None = None, log: Callable[[str], None] = print, measure: bool = True) -> Dense:
        """The run's base model: checked to be a module an adapter serves (or ``adapter``'s), its task, and
        its provenance and metric on the task (measured on the run's device, as every pruned model will be;
        not with ``measure=False``: a plan evaluates nothing)."""
        if not isinstance(model, nn.Module):
            raise HetpruneError(f"the model must be a torch module, got {type(model).__name__}")
        task = as_task(task)
        adapter = resolve_adapter(model, adapter)   # a model no adapter serves fails before any work
        if dist.is_main():
            log(f"device: {devices.describe(self.device, self.config.amp, dist.world())}")
        self.size_schedules(task.train_size, log)
        if not self.schedules_chosen:
            check_schedules_fit(task, self.config)   # ImageNet with the embedded benchmarks' toy schedule stops here
        if not self.scoring_chosen:
            check_scoring_fits(task, self.config, self.registry)   # ... and a toy scoring subset a scorer trains on
        check_selection(task, self.config.selection)   # a setting the task's own data would silently ignore
        devices.place(model, self.device)
        check_data_fits(task, model)   # a digits model on digit-pairs data (10 against 19 classes) fails now
        info = dense_info(model, task, spec, base_info, self.settings, measure)
        reuse_tag(task, self.resume, log)   # says aloud when the task's code cannot be keyed
        return Dense(model, task, adapter, spec, info, base_key(model, info["hash"], spec or ModelSpec.user_built(model)))


def schedule_line(section: str, cfg: config_mod.TrainConfig, train_size: int) -> str:
    """What a schedule sized by its image passes became: ``finetune: 40,000 image passes = 10 epochs of 4,012
    images``."""
    per = cfg.epoch_images(train_size)
    return f"{section}: {cfg.image_passes:,} image passes = {cfg.epochs} epoch(s) of {per:,} images"


def start_run(strategies, budgets, *, folder: ResultFolder | None = None, out: str | Path | None = None,
              resume: bool = False, overwrite: bool = False, settings: dict | None = None,
              config_file: str | None = None, sets: list[str] | None = None, overrides: dict | None = None,
              registry: Registry | None = None, plan: bool = False, reuse_older: bool = False) -> RunStart:
    """Start a run of ``strategies`` (names or strategy objects) at ``budgets``: resolve and check
    everything that needs no model, in the order of the module docstring, and return it.

    ``settings`` is the Python call's nested dict, ``overrides`` the keyword options or the command line's
    flags (``device``, ``amp``, ``seed``, ``scorer``, ``cost_model``), ``sets`` the ``--set`` items.
    ``folder`` says what kind of result ``out`` holds; an output folder is refused here, before any work,
    when it cannot take the result (`hetprune.core.io.check_result_folder`). A ``plan`` on a machine without the
    run's device or precision (``--config deit-b-paper`` on a login node) plans on the CPU without a probe
    (`RunStart.probe_here`) instead of stopping."""
    if reuse_older and not resume:   # it would be ignored: nothing is reused without a resume
        raise HetpruneError(f"{switch('reuse-older')} reuses finished rows of a resumed run: give it with "
                            f"{switch('resume')}")
    registry = registry or get_registry()
    built = [registry.build("strategy", s) if isinstance(s, str) else s for s in strategies]
    given = {**(settings or {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    run_settings = loader.resolve(built, config_file, given, sets, elsewhere=sections_elsewhere(registry, built))
    elsewhere = unavailable_here(run_settings) if plan else None
    if elsewhere is not None:   # the counts need no device: plan them here, on the CPU
        run_settings = run_settings.replace(device="cpu", amp="none")
    run_settings, device = run_device(run_settings)
    bound = [cost_model.bind(b, run_settings, registry) for b in budgets]
    check_names(registry, run_settings)
    where = None
    if out is not None:
        if folder is None:
            raise HetpruneError("an output folder needs the kind of result it holds")
        # rank 0 checks the folder (the others may see a shared folder late) and every rank takes its answer
        where = dist.on_main(lambda: check_result_folder(out, folder, overwrite, resume=resume and folder.resumable))
    named = [item.partition("=")[0].strip().split(".")[0] for item in sets or []]
    chosen = bool(config_file) or any(k in config_mod.SCHEDULES for k in given) or any(
        n in config_mod.SCHEDULES for n in named)
    scoring = "scoring" in given or "scoring" in named or (
        run_settings.run.scoring_batches.subset != config_mod.ScoringConfig().subset)
    return RunStart(registry, built, bound, run_settings, device, where, resume, overwrite, folder, chosen,
                    scoring, elsewhere, reuse_older=reuse_older)


def sections_elsewhere(registry: Registry, strategies: list) -> dict[str, list[str]]:
    """Per settings section of a registered strategy the run does not run, the strategies that declare it
    (``hetdpt``: hetdpt): what a setting there is refused for."""
    running = {getattr(s, "name", None) for s in strategies}
    out: dict[str, list[str]] = {}
    for name in registry.names("strategy"):
        if name not in running:
            for section in loader.sections_of(registry.component("strategy", name).factory)[0]:
                out.setdefault(section, []).append(name)
    return out


def probe_for(plan: bool, seconds) -> float | None:
    """The plan probe's length for a run: ``seconds`` checked (None: `PROBE_SECONDS`) where it plans; refused
    where it does not, since the run would train in full with the probe ignored."""
    if plan:
        return check_probe(PROBE_SECONDS if seconds is None else seconds)
    if seconds is not None:
        raise HetpruneError(f"{option('plan-probe', str(seconds))} times the training step for a plan: give it "
                            f"with {switch('plan')}, or drop it for the full run")
    return None


# the default schedules were made for the embedded benchmarks; a training set this many times larger than what
# the default fine-tune sees is data they were not meant for
FAR_LARGER = 10


def check_schedules_fit(task: Task, run: config_mod.RunSettings) -> None:
    """Stop a run on real data (an ImageFolder, or a task whose training set is far larger than the default
    schedules see) whose fine-tune schedules nobody chose: the defaults are the embedded benchmarks' toy
    schedules, and would fine-tune DeiT-B on 900 of ImageNet's 1,281,167 training images without a word."""
    data = getattr(task, "data", None)
    n = _non_embedded_train_size(task)
    if n is None:
        return
    final, short = run.schedule("finetune"), run.schedule("short_finetune")
    sees = final.epochs * min(final.subset or n, n)
    if not (isinstance(data, DataBundle) or n > FAR_LARGER * sees):
        return
    distinct, point = min(final.subset or n, n), short.epochs * min(short.subset or n, n)
    raise HetpruneError(
        f"the default fine-tune schedules are the embedded benchmarks' toy ones: the fine-tune would see "
        f"{distinct:,} of {n:,} training images ({final.epochs} epochs, {sees:,} image passes) and a MAP point "
        f"{point:,} image passes; choose schedules for this data: {_configs_for(n)}, your own "
        f"{option('config', 'FILE')}, or finetune.* and short_finetune.* settings")


def check_scoring_fits(task: Task, run: config_mod.RunSettings, registry: Registry | None = None) -> None:
    """Stop a run on real data whose scoring subset nobody chose, where the run's scorer trains on it (its
    class says ``trains_on_scoring_subset = True``, as gate-taylor does): the default ``scoring.subset`` (300)
    is the embedded benchmarks', and gate-taylor's gate phase trains on it for every epoch of its search, so
    DeiT-B would learn which layers to remove from 300 of ImageNet's images even with hand-chosen fine-tunes.
    A one-shot scorer (taylor, magnitude, ...) reads ``scoring.batches`` batches whatever the subset: no stop."""
    n, subset = _non_embedded_train_size(task), run.scoring_batches.subset
    if n is None or subset is None or n <= FAR_LARGER * subset:
        return
    scorer = (registry or get_registry()).component("scorer", run.scorer).factory
    if not getattr(scorer, "trains_on_scoring_subset", False):
        return
    raise HetpruneError(
        f"the default scoring subset is the embedded benchmarks' toy one: the scorer {run.scorer!r} would train "
        f"on {subset:,} of {n:,} training images; choose the scoring.subset setting for this data (a number of "
        f"images, or null: all), a one-shot scorer ({option('scorer', 'taylor')}), or {_configs_for(n)}")


def check_selection(task: Task, wanted: int | None) -> None:
    """Refuse a ``selection`` setting the task's data does not hold: the setting sizes the selection split of
    data hetprune loads (the command line's ``--data``), while a Task or DataBundle built by the caller brings
    its own split, so a setting that says otherwise would be reported but never used."""
    if wanted is None:
        return
    held = val_size(task, "selection") if task.choice_split == "selection" else 0
    if held == wanted or (held is None and wanted > 0):
        return
    has = ("no selection split" if held == 0 else
           "a selection split of unknown size" if held is None else f"a selection split of {held:,} items")
    raise HetpruneError(f"the selection setting ({wanted}) does not match the task's data, which has {has}: the "
                        "setting sizes the split of data hetprune loads (--data); a Task or DataBundle you build "
                        "brings its own (Task(selection=...)): build it with the split you want and leave the "
                        "setting null")


def _non_embedded_train_size(task: Task) -> int | None:
    """The task's training set size where the default schedules may not suit it: None for an embedded
    benchmark (the defaults were made for them) and for a training set of unknown size."""
    data = getattr(task, "data", None)
    return None if isinstance(data, DataBundle) and data.name in EMBEDDED else task.train_size


# a training set up to this size is a small folder: the stops name the small-folder config, not the ImageNet recipes
SMALL_FOLDER = 100_000
IMAGENET_CONFIGS = ("deit-b-paper", "deit-s-paper", "quick")   # DeiT recipes for ImageNet-sized data


def _configs_for(n: int) -> str:
    """The shipped configs a stop names for a training set of ``n`` items (``--config NAME`` or ``config=NAME``):
    small-folder up to `SMALL_FOLDER` images, the ImageNet recipes above, each said for what it is made."""
    if n <= SMALL_FOLDER:
        return (f"the shipped config for small folders ({option('config', 'small-folder')}: schedules sized by the "
                f"folder's image count, no teacher from the hub, no flips)")
    shipped = " | ".join(option("config", name) for name in IMAGENET_CONFIGS if name in loader.shipped_configs())
    return (f"a shipped ImageNet recipe ({shipped}: a distilled DeiT student, a teacher from timm's hub, "
            f"ImageNet-sized schedules)")


def unavailable_here(settings: Settings) -> str | None:
    """Why the run's device or precision cannot run on this machine (the message a run would stop with), or
    None where it can."""
    run = settings.run
    try:
        devices.resolve_amp(run.amp, devices.resolve(devices.canonical(run.device)))
    except HetpruneError as exc:
        return str(exc)
    return None


def run_device(settings: Settings) -> tuple[Settings, torch.device]:
    """Resolve the run's device and mixed precision once, at the start.

    Returns the settings whose ``device`` is the checked, rank-independent name (``auto`` resolved) and whose
    ``amp`` is the precision that will run, each schedule's per-GPU batch (``batch_per_gpu``) its global batch,
    and this process's ``torch.device``; under torchrun this process joins the process group (nccl on CUDA,
    gloo on CPU; collectives wait ``dist_timeout_min`` for a missing rank).
    """
    run = settings.run
    name = devices.canonical(run.device)
    device = devices.resolve(name)
    settings = settings.replace(device=name, amp=devices.resolve_amp(run.amp, device))
    devices.set_tf32(device, run.tf32)
    dist.init_from_env(device, run.dist_timeout_min)
    return settings.per_gpu_resolved(dist.world()), device   # batch_per_gpu: the global batch from now on


def check_names(registry: Registry, settings: Settings) -> None:
    """Unknown component names fail now, not after an hour of work: every component the settings name (the
    run's scorer, removers and mergers, and in every section a predictor, a ``..._scorer``, a ``..._strategy``
    or a width ``pruner``: `hetprune.pruning.behaviours.named_components`) and every name an options mapping
    gives options to."""
    for where, kind, name in named_components(settings) + options_named(registry, settings):
        try:
            registry.component(kind, name)
        except HetpruneError as exc:
            raise HetpruneError(f"setting {where}: {exc}") from None


def options_named(registry: Registry, settings: Settings) -> list[tuple[str, str, str]]:
    """Every component name an options mapping gives options to (``scorer_options: {gate-taylr: {...}}``,
    ``hetdpt.predictor_options: {polly: {...}}``): ``(where, kind, name)``. Options for a name nobody registers
    would be read by nothing, and the run would use the defaults without a word: `check_names` refuses them."""
    found = []

    def walk(values: dict, prefix: str) -> None:
        for key, value in values.items():
            kind = key[:-len("_options")] if key.endswith("_options") else None
            if kind in KINDS and isinstance(value, dict) and all(isinstance(v, dict)
                                                                           for v in value.values()):
                found.extend((f"{prefix}{key}.{name}", kind, name) for name in value)
            elif isinstance(value, dict) and kind is None:
                walk(value, f"{prefix}{key}.")

    walk(settings.as_settings(), "")
    return found


def dense_info(model: nn.Module, task: Task, spec: ModelSpec | None, base_info: dict | None, settings: Settings,
               measure: bool = True) -> dict:
    """The dense model's provenance for a run: where it came from, its hash, and its metric on the task
    (measured on the run's device, as every pruned model will be; ``top1`` too for a classification task)."""
    info = dict(base_info or {})
    info.setdefault("source", "user model" if spec is None else spec.name)
    info.setdefault("hash", model_hash(model))
    run = settings.run
    device = devices.resolve(run.device)
    devices.place(model, device)
    if "metric" not in info and measure:
        info["metric"] = task.evaluate(model, device, amp=run.amp, workers=run.schedule("finetune").workers)
    if task.metric_name == "top1" and "metric" in info:
        info["top1"] = info["metric"]
    return info


def run_key(start: RunStart, dense: Dense, strategy_name: str) -> str:
    """What a run's plan was made for (its settings, budgets, base model, task and ranks): the run reports
    the probe of a ``--plan`` with the same key."""
    from ..core.keys import fingerprint

    return fingerprint({"strategy": strategy_name, "settings": start.settings,
                        "budgets": [b.to_dict() for b in start.budgets], "base": dense.key, "task": dense.task.key,
                        "world": dist.world()})


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
