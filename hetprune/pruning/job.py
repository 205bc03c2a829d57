"""The job a strategy runs: [`PruneJob`][hetprune.pruning.job.PruneJob], everything a run resolved once (model, task,
adapter, device, precision, settings, components), and [`ScoringContext`][hetprune.pruning.job.ScoringContext], what a
scorer may use of it. The steps that act on a job live in `hetprune.pruning.steps`."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import torch
from torch import nn

from ..core import contract, devices
from ..model import checks as model_checks
from ..core import distributed as dist
from ..model.adapters import Adapter, adapter_for, serving
from .budget import Budget, feasible_pairs
from ..core.config import RunSettings, Section
from ..core.settings import Settings
from .cost_choice import build as build_cost_model, run_model_name
from .plan import val_size
from ..training.bundle import DataBundle
from ..core.errors import HetpruneError
from ..model.spec import ModelSpec, model_hash
from ..core.plugins import Registry
from ..training.resume import base_key
from ..training.task import Task, as_task, reuse_tag
from ..training.train import TrainConfig

S = TypeVar("S", bound=Section)


def resolve_adapter(model: nn.Module, adapter: Adapter | None = None) -> Adapter:
    """The adapter a job on ``model`` uses: the registry's choice, or the one the caller chose (a generic
    adapter for their own transformer), which must serve the model. One clear error otherwise."""
    if adapter is None:
        adapter = adapter_for(model)
    else:
        adapter.check(model)
        if not adapter.matches(model):
            raise HetpruneError(f"the adapter {adapter.name!r} does not serve {type(model).__name__}")
    check_untied(adapter, model)
    return adapter


def check_untied(adapter: Adapter, model: nn.Module) -> None:
    """Refuse a model whose blocks share a module (``nn.Sequential(*[block] * 4)`` puts one block object at
    every depth): removing a site at one depth would remove it at all of them."""
    owner: dict[int, tuple[int, str]] = {}
    for i, block in enumerate(adapter.blocks(model)):
        for name, module in block.named_modules():
            j, where = owner.setdefault(id(module), (i, name))
            if j == i:
                continue
            depths = [k for k, b in enumerate(adapter.blocks(model)) if b is block] if not name else [j, i]
            what = (f"one block object sits at depths {', '.join(map(str, depths))}" if not name else
                    f"blocks {j} and {i} share one module ({where or 'the block'} of block {j} is {name} of block {i})")
            raise HetpruneError(f"{type(model).__name__}: {what}; hetprune removes a site at one depth at a time, "
                                "so every depth needs modules of its own: build each block separately (e.g. "
                                "copy.deepcopy of one block per depth), not [block] * depth")


@dataclass
class PruneJob:
    """One pruning run: everything a strategy needs, resolved once when the job is made.

    The model's adapter, the device, the mixed precision and the task are
    resolved here and carried down; nothing below the job looks them up again.
    ``task`` is what the model is pruned for ([`hetprune.Task`][hetprune.training.task.Task]); a
    classification `DataBundle` given as ``data`` is
    today's default task. ``spec`` says how to build the base model again, or
    None for a model the user built (its recipe then records that). A
    strategy must not modify ``dense``.
    """

    dense: nn.Module
    spec: ModelSpec | None
    data: DataBundle | None
    budget: Budget
    settings: Settings   # a dict is taken too, and made this object once, when the job is made
    registry: Registry
    workdir: Path
    base_info: dict = field(default_factory=dict)   # provenance of the dense weights (its hash: computed if absent)
    resume: bool = False
    progress: bool = True
    log: Callable[[str], None] = print
    strategy_name: str = ""
    # shared_dir and task are typed as __post_init__ leaves them, which every reader sees: None asks it to resolve
    # them (the ignores: a None default for a field that is never None after it)
    shared_dir: Path = None  # type: ignore[assignment]  # state reusable across runs of these settings (MAP points)
    measure_cost: bool = True        # time the result against the dense model when the cost model can
    task: Task = None  # type: ignore[assignment]  # what the model is pruned for (default: classification of data)
    adapter: Adapter | None = None   # the dense model's adapter (default: the registry's choice)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)   # one per run: a sub-job (replace) keeps it
    _built: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.task is None and self.data is None:
            raise HetpruneError("a PruneJob needs a task (hetprune.Task) or a classification DataBundle as data")
        self.task = as_task(self.task if self.task is not None else self.data)
        if self.data is None:
            self.data = getattr(self.task, "data", None)
        self.adapter = resolve_adapter(self.dense, self.adapter)
        self.spec = self.spec or ModelSpec.user_built(self.dense)
        # a per-GPU batch as the global batch it is on this many ranks (a run's start has done it already):
        # every key made from a schedule sees the global batch
        self.settings = Settings.of(self.settings).per_gpu_resolved(dist.world())
        run = self.config
        self._device = devices.resolve(run.device)
        self._amp = devices.resolve_amp(run.amp, self._device)
        self.workdir = Path(self.workdir)
        self.shared_dir = Path(self.shared_dir) if self.shared_dir else self.workdir
        if not self.base_info.get("hash"):  # every key of resumable state names the dense model, in code too
            self.base_info["hash"] = model_hash(self.dense)
        if not dist.is_main():  # under torchrun only rank 0 talks
            self.log = lambda msg: None
            self.progress = False
        if not self.task.fingerprinted and not getattr(self.task, "_said_unhashed", False):
            self.task._said_unhashed = True
            self.log(f"note: the task's batches ({self.task.name}) hold no tensor hetprune can hash, so nothing this "
                     "run saves (MAP points, checkpoints, compare rows) will be reused by a later run; give "
                     "Task(fingerprint=...) a value that changes when the data changes to make it resumable")
        self.place(self.dense)  # the teacher, and the source of every copy a strategy makes

    @property
    def base_hash(self) -> str:
        """The dense model's content hash: keys the teacher of a fine-tune and the MAP points."""
        return self.base_info["hash"]

    @property
    def base_key(self) -> str:
        """What keys every stored result made from the dense model: its weights, its configuration (dropout and
        drop-path rates, pooling, ...: a model rebuilt with other such kwargs has the same weights) and its
        spec (`hetprune.training.resume.base_key`)."""
        return self.once("base key", lambda: base_key(self.dense, self.base_hash, self.spec))

    @property
    def reuse_tag(self) -> str | None:
        """Which stored MAP points this job may reuse without ``--resume`` (`hetprune.training.task.reuse_tag`): None
        for all with a matching key, else only those of this run (the task's code cannot be read)."""
        return self.once("reuse tag", lambda: reuse_tag(self.task, self.resume, self.log))

    @property
    def config(self) -> RunSettings:
        """The run's core settings, typed (parsed once; a strategy hands a sub-job changed settings with
        ``dataclasses.replace(job, settings=job.settings.replace(...))``)."""
        return self.settings.run

    def options(self, section: type[S]) -> S:
        """A strategy's own settings section, typed and checked: ``job.options(HetDPTOptions)``."""
        return self.settings.section(section)

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def device(self) -> torch.device:
        """This process's device, resolved when the job was made (settings hold the rank-independent name)."""
        return self._device

    @property
    def amp(self) -> str:
        return self._amp

    @property
    def workers(self) -> int:
        return self.config.schedule("finetune").workers

    def place(self, obj):
        """Move a model or batch to the run's device (`hetprune.core.devices.place`)."""
        return devices.place(obj, self.device)

    def once(self, name, build: Callable[[], object]):
        """What ``build()`` returns, built the first time ``name`` is asked for in this job: the parts a
        strategy resolves once and reuses (a point scheme with its settings, the removers)."""
        if name not in self._built:
            self._built[name] = build()
        return self._built[name]

    @property
    def removers(self) -> dict:
        """The configured removers by kind (``attn_remover``, ``act_remover``), built once per job."""
        return self.once("removers", lambda: {
            "attn": self.registry.build("remover", self.config.attn_remover),
            "act": self.registry.build("remover", self.config.act_remover)})

    @property
    def mergers(self) -> list:
        """The configured mergers, built once per job, in order."""
        return self.once("mergers", lambda: [self.registry.build("merger", n) for n in self.config.mergers])

    @property
    def folds_norm(self) -> bool:
        """Whether a configured merger folds the preceding norm's affine too (its ``fold_norm``)."""
        return any(getattr(m, "fold_norm", False) for m in self.mergers)

    def train_config(self, section: str, **changes) -> TrainConfig:
        """The schedule of settings section ``section`` on this job's resolved device and precision."""
        return self.config.schedule(section, device=self.device, amp=self.amp, **changes)

    def teacher_for(self, cfg: TrainConfig) -> tuple[nn.Module, str]:
        """The teacher of a fine-tune and its key: the dense model (the default), or the separate model the
        schedule names (``teacher``: a timm name, with ``teacher_checkpoint`` or ``teacher_pretrained``),
        built once per job, on the run's device, in eval mode."""
        if not cfg.teacher:
            return self.dense, self.base_key
        spec = ModelSpec(cfg.teacher, dict(cfg.teacher_kwargs))
        what = (cfg.teacher, cfg.teacher_checkpoint, cfg.teacher_pretrained, repr(sorted(spec.kwargs.items())))

        def build():
            from ..model.spec import build_with_weights

            # seeded by the run, as the base model is: a teacher whose weights come from no file or hub (or only
            # in part) is the same on every run and on --resume, so its fine-tunes' checkpoints stay reusable
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                model = build_with_weights(spec, pretrained=cfg.teacher_pretrained,
                                           checkpoint=cfg.teacher_checkpoint or None)
            model = self.place(model).eval()
            return model, base_key(model, model_hash(model), spec)

        return self.once(("teacher",) + what, build)

    @property
    def example(self) -> torch.Tensor:
        """Two inputs of the task on the run's device: for exactness checks and counting costs."""
        return self.place(self.task.example(2))

    def event(self, name: str, **kwargs) -> None:
        getattr(self.registry.hook, name)(**kwargs)

    def stage_start(self, stage: str, **info) -> float:
        contract.enter_stage(stage)  # named by any plugin error raised inside it
        self.event("on_stage_start", stage=stage, info={"strategy": self.strategy_name, "workdir": str(self.workdir),
                                                         "run": self.run_id, "resume": self.resume, **info})
        return time.time()

    def stage_end(self, stage: str, started: float, **info) -> None:
        contract.leave_stage(stage)
        self.event("on_stage_end", stage=stage,
                   info={"strategy": self.strategy_name, "seconds": round(time.time() - started, 2), **info})

    def evaluate(self, model: nn.Module) -> float:
        """The task's metric of ``model`` on its validation data (top-1 in percent by default): what a result
        reports. Never inside `choosing` (a task with a selection split refuses it): use `choice_metric`."""
        return self.task.evaluate(model, self.device, amp=self.amp, workers=self.workers)

    val_accuracy = evaluate   # the name from before tasks had other metrics

    def choice_metric(self, model: nn.Module) -> float:
        """The task's metric of ``model`` on the split choices are made on (`choice_split`): what a MAP point,
        a check, a share point or any best-of records."""
        if self.choice_split == "val" and not getattr(self.task, "_said_no_selection", False):
            self.task._said_no_selection = True
            self.log(f"note: the task ({self.task.name}) has no selection split, so this run's choices are "
                     "measured on its val set, the one its result reports (Task(selection=...) holds a part of "
                     "the training data out for them)")
        return self.task.evaluate(model, self.device, amp=self.amp, workers=self.workers, split=self.choice_split)

    @property
    def choice_split(self) -> str:
        """``selection`` where the task has a selection split, else ``val`` (the report says which)."""
        return self.task.choice_split

    def choosing(self, what: str):
        """A context for a part of the run that chooses from measurements (a split, sites, a share): in it the
        task's val set cannot be read where a selection split exists (`hetprune.core.contract.choosing`)."""
        return contract.choosing(what)

    def splits(self) -> dict:
        """What the report says of the data's splits: the one its metric is measured on, the one choices were
        measured on, and their sizes where known."""
        sizes = {name: val_size(self.task, name) for name in ("val", "selection")}
        return {"metric": "val", "choices": self.choice_split,
                **{f"{k}_items": v for k, v in sizes.items() if v is not None}}

    @contextlib.contextmanager
    def serving(self):
        """A context in which this job's adapter serves its models, and the contract checks a model whose
        input shape hetprune cannot tell on the task's example (what [`hetprune.prune`][hetprune.harness.api.prune] runs in)."""
        with serving(self.adapter), model_checks.examples_from(self.example):
            yield self

    @property
    def cost_model_name(self) -> str:
        """What the budget counts (a cost target), else the run's ``cost_model`` setting (auto resolved)."""
        return run_model_name(self.budget, self.settings)

    @property
    def cost_model(self):
        """The run's cost model component, built once per job (a latency table is reused, not re-timed)."""
        name = self.cost_model_name
        cached = getattr(self, "_cost_model", None)
        if cached is None or cached[0] != name:
            model = build_cost_model(self.registry, name, self.settings)
            if hasattr(model, "log"):
                model.log = self.log
            cached = (name, model)
            self._cost_model = cached
        return cached[1]

    def cost(self, model: nn.Module, example: torch.Tensor | None = None) -> float:
        """``model``'s cost in the run's cost model (MACs per image, seconds per pass, ...)."""
        return self.cost_model.cost(model, self.example if example is None else example)

    def prepare_costs(self, models: list[nn.Module], example: torch.Tensor | None = None) -> None:
        """Tell a measuring cost model which models are about to be costed, so it times their parts together
        (one session of the latency table; nothing for MACs)."""
        prepare = getattr(self.cost_model, "prepare", None)
        if prepare is not None:
            prepare(models, self.example if example is None else example)

    def feasible_pairs(self) -> list[tuple[int, int]]:
        """The splits ``(n_attn, n_act)`` that meet the budget. Under torchrun rank 0 finds them and every
        rank receives them (a measured cost differs between ranks); every rank must call this together."""
        merge = bool(self.config.mergers)
        counted = self.budget.counts_cost
        return dist.on_main(lambda: feasible_pairs(
            self.dense, self.budget, self.example, merge=merge,
            cost=self.cost if counted else None, prepare=self.prepare_costs if counted else None))


@dataclass
class ScoringContext:
    """What a scorer may use: the task (its batches and loss), the teacher of short_finetune (the dense model
    unless that schedule names another), settings and a work folder."""

    data: DataBundle | None
    teacher: nn.Module
    settings: Settings   # a dict is taken too (made this object once)
    device: torch.device
    seed: int
    workdir: Path
    progress: bool = True
    resume: bool = False
    log: Callable[[str], None] = print
    on_epoch_end: Callable[[int, dict], None] | None = None
    task: Task | None = None
    registry: Registry | None = None   # the job's (components a scorer builds, e.g. the remover it simulates)
    base_key: str = ""                 # the job's: what keys a checkpoint made from the dense model (its config too)
    teacher_key: str = ""              # what keys the teacher (empty: its weights' hash)
    distributed: bool = False          # the scorer runs on every rank together (its training under DDP), not alone
    shared_states: Path | None = None  # where a learning scorer keeps states other selections from the same start
    #                                    continue from (gate-taylor: its gate phase after n removals)
    keep_states_at: tuple[int, ...] = ()   # the removal counts whose state this selection keeps there

    def __post_init__(self):
        if self.task is None and self.data is None:
            raise HetpruneError("a ScoringContext needs a task (hetprune.Task) or a classification DataBundle")
        self.task = as_task(self.task if self.task is not None else self.data)
        self.settings = Settings.of(self.settings)

    @property
    def config(self) -> RunSettings:
        """The run's core settings, typed."""
        return self.settings.run

    def place(self, obj):
        """Move a model or batch to the run's device (`hetprune.core.devices.place`)."""
        return devices.place(obj, devices.resolve(self.device))

    def batches(self):
        """The few fixed batches one-shot scorers use (the task's first training batches), on the device."""
        run = self.config
        sc, workers = run.scoring_batches, run.schedule("short_finetune").workers
        cuda = devices.resolve(self.device).type == "cuda"
        for batch in self.task.scoring_batches(sc.subset, sc.batch_size, sc.batches, self.seed, workers,
                                               pin_memory=cuda):
            yield self.place(batch)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The task's loss of ``model`` on one of `batches` (what scorers differentiate)."""
        return self.task.loss(model, batch)

    def train_config(self, section: str = "short_finetune", **changes) -> TrainConfig:
        return self.config.schedule(section, **changes)



def scoring_context(job: PruneJob, workdir: Path | None = None) -> ScoringContext:
    """A scorer's view of ``job``; its teacher is short_finetune's, whose schedule a learning scorer (the gate
    phase) trains on."""
    teacher, teacher_key = job.teacher_for(job.train_config("short_finetune"))
    return ScoringContext(
        data=job.data, task=job.task, registry=job.registry, teacher=teacher, teacher_key=teacher_key,
        settings=job.settings, device=job.device,
        seed=job.seed, base_key=job.base_key, shared_states=job.workdir / "shared-selections",
        workdir=workdir or job.workdir / "scoring", progress=job.progress, resume=job.resume, log=job.log,
        on_epoch_end=lambda e, m: job.event("on_epoch_end", stage="select", epoch=e, metrics=m),
    )
