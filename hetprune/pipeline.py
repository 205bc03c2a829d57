"""The shared pipeline every depth strategy runs, as public building blocks:

    allocate (n_attn, n_act) -> select sites per kind -> remove -> fine-tune
    (KD from the dense model) -> merge -> recipe + report

A strategy usually subclasses [`DepthStrategy`][hetprune.pipeline.DepthStrategy] and overrides
[`DepthStrategy.allocate`][hetprune.pipeline.DepthStrategy.allocate] only; everything else is held equal across
strategies, which is what makes ``hetprune compare`` fair.
"""

from __future__ import annotations

import contextlib
import copy
import numbers
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, TypeVar

import torch
from torch import nn

from . import contract, devices, model_checks
from . import distributed as dist
from .budget import Budget, feasible_pairs, kinds_by_saving, max_per_kind, reached_cost
from .config import RunSettings, Section, per_gpu_resolved
from .cost_model import build as build_cost_model, run_model_name
from .costs import cost_summary
from .data import DataBundle
from .adapters import Adapter, adapter_for, serving
from .errors import HetpruneError
from .models import ModelSpec, model_hash
from .plan import PlanStep, evaluation_step, finetune_step
from .plugins import Registry
from .recipe import Recipe, arch_of, recipe_from_model
from .resume import base_key, structure_key, weights_key
from .sites import Site, sites
from .task import Task, as_task, reuse_tag
from .train import TrainConfig


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
    ``task`` is what the model is pruned for ([`hetprune.Task`][hetprune.task.Task]); a
    classification `DataBundle` given as ``data`` is
    today's default task. ``spec`` says how to build the base model again, or
    None for a model the user built (its recipe then records that). A
    strategy must not modify ``dense``.
    """

    dense: nn.Module
    spec: ModelSpec | None
    data: DataBundle | None
    budget: Budget
    settings: dict
    registry: Registry
    workdir: Path
    base_info: dict = field(default_factory=dict)   # provenance of the dense weights (its hash: computed if absent)
    resume: bool = False
    progress: bool = True
    log: Callable[[str], None] = print
    strategy_name: str = ""
    shared_dir: Path | None = None   # state reusable across runs of the same settings (MAP points)
    measure_cost: bool = True        # time the result against the dense model when the cost model can
    task: Task | None = None         # what the model is pruned for (default: classification of ``data``)
    adapter: Adapter | None = None   # the dense model's adapter (default: the registry's choice)
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
        self.settings = per_gpu_resolved(self.settings, dist.world())
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
        spec (`hetprune.resume.base_key`)."""
        return self.once("base key", lambda: base_key(self.dense, self.base_hash, self.spec))

    @property
    def reuse_tag(self) -> str | None:
        """Which stored MAP points this job may reuse without ``--resume`` (`hetprune.task.reuse_tag`): None
        for all with a matching key, else only those of this run (the task's code cannot be read)."""
        return self.once("reuse tag", lambda: reuse_tag(self.task, self.resume, self.log))

    @property
    def config(self) -> RunSettings:
        """The run's core settings, typed (read from ``settings`` each time: a strategy may hand a sub-job
        changed settings)."""
        return RunSettings.of(self.settings)

    def options(self, section: type[S]) -> S:
        """A strategy's own settings section, typed and checked: ``job.options(HetDPTOptions)``."""
        return section.of(self.settings)

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
        """Move a model or batch to the run's device (`hetprune.devices.place`)."""
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
            from .models import build_with_weights

            model = self.place(build_with_weights(spec, pretrained=cfg.teacher_pretrained,
                                                  checkpoint=cfg.teacher_checkpoint or None)).eval()
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
        self.event("on_stage_start", stage=stage, info={"strategy": self.strategy_name,
                                                         "workdir": str(self.workdir), **info})
        return time.time()

    def stage_end(self, stage: str, started: float, **info) -> None:
        contract.leave_stage(stage)
        self.event("on_stage_end", stage=stage,
                   info={"strategy": self.strategy_name, "seconds": round(time.time() - started, 2), **info})

    def evaluate(self, model: nn.Module) -> float:
        """The task's metric of ``model`` on its validation data (top-1 in percent by default)."""
        return self.task.evaluate(model, self.device, amp=self.amp, workers=self.workers)

    val_accuracy = evaluate   # the name from before tasks had other metrics

    @contextlib.contextmanager
    def serving(self):
        """A context in which this job's adapter serves its models, and the contract checks a model whose
        input shape hetprune cannot tell on the task's example (what [`hetprune.prune`][hetprune.api.prune] runs in)."""
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
    """What a scorer may use: the task (its batches and loss), the dense teacher, settings and a work folder."""

    data: DataBundle | None
    teacher: nn.Module
    settings: dict
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
    distributed: bool = False          # the scorer runs on every rank together (its training under DDP), not alone

    def __post_init__(self):
        if self.task is None and self.data is None:
            raise HetpruneError("a ScoringContext needs a task (hetprune.Task) or a classification DataBundle")
        self.task = as_task(self.task if self.task is not None else self.data)

    @property
    def config(self) -> RunSettings:
        """The run's core settings, typed."""
        return RunSettings.of(self.settings)

    def place(self, obj):
        """Move a model or batch to the run's device (`hetprune.devices.place`)."""
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


# what every strategy's report holds (``finish`` fills all but the last three); checked by the contract
REPORT_KEYS = ("strategy", "n_attn", "n_act", "sites", "params", "macs", "dense_params", "dense_macs",
               "macs_convention", "metric_name", "metric_before_finetune", "metric", "seconds")


@dataclass
class PruneResult:
    model: nn.Module
    recipe: Recipe
    report: dict


def scoring_context(job: PruneJob, workdir: Path | None = None) -> ScoringContext:
    return ScoringContext(
        data=job.data, task=job.task, registry=job.registry, teacher=job.dense, settings=job.settings, device=job.device,
        seed=job.seed, base_key=job.base_key,
        workdir=workdir or job.workdir / "scoring", progress=job.progress, resume=job.resume, log=job.log,
        on_epoch_end=lambda e, m: job.event("on_epoch_end", stage="select", epoch=e, metrics=m),
    )


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
    report = {
        "strategy": job.strategy_name,
        "budget": job.budget.to_dict(),
        "seed": job.seed,
        "n_attn": recipe.n_attn,
        "n_act": recipe.n_act,
        "sites": [str(s) for s in recipe.removed_sites],
        **metric_entries(job, report),
        "params": cost["params"],
        "macs": cost["macs"],
        "dense_params": dense_cost["params"],
        "dense_macs": dense_cost["macs"],
        "macs_convention": cost["macs_convention"],
        **cost_report(job, model, example),
        "settings": job.settings,
    }
    return PruneResult(model, recipe, report)


def metric_entries(job: PruneJob, report: dict) -> dict:
    """``report`` with the task's metric under its own keys: ``metric``, ``metric_before_finetune`` and
    ``metric_dense``, named by ``metric_name`` (and ``higher_is_better``). A classification task keeps the
    ``top1*`` keys too; a strategy that still writes only ``top1*`` has them read as the metric."""
    out = dict(report)
    # the dense model's metric from the base's info (the embedded bases' info has it under top1)
    if "metric_dense" not in out and "top1_dense" not in out:
        out["metric_dense"] = job.base_info.get("metric", job.base_info.get("top1"))
    for suffix in ("", "_before_finetune", "_dense"):
        if f"metric{suffix}" not in out and f"top1{suffix}" in out:
            out[f"metric{suffix}"] = out[f"top1{suffix}"]
        if job.task.metric_name == "top1":
            out[f"top1{suffix}"] = out.get(f"metric{suffix}")
        else:   # another metric is not top-1: no key may say it is
            out.pop(f"top1{suffix}", None)
    out["metric_name"], out["higher_is_better"] = job.task.metric_name, job.task.higher_is_better
    return out


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


class DepthStrategy:
    """Depth pruning with a rule for splitting the budget between kinds.

    Subclasses set ``name``/``description`` and override `allocate`;
    ``defaults`` adds a settings section of their own.
    """

    name = "depth"
    description = "depth pruning with a fixed split"
    defaults: dict = {}

    def allocate(self, job: PruneJob) -> tuple[tuple[int, int], dict]:
        """Return ``((n_attn, n_act), info)`` for the job's budget."""
        raise NotImplementedError

    def choose(self, job: PruneJob, model: nn.Module, counts: dict[str, int]) -> list[Site]:
        """Which sites to remove (default: the configured scorer, within each kind)."""
        return select_sites(job, model, counts)

    def remove(self, job: PruneJob, model: nn.Module, chosen: list[Site]) -> dict:
        """Turn the chosen sites off (default: the configured removers)."""
        return remove_sites(job, model, chosen)

    def prepare(self, job: PruneJob) -> nn.Module:
        """The model to prune: a copy of the dense one, on the run's device (subclasses may change it)."""
        return job.place(copy.deepcopy(job.dense))

    def run(self, job: PruneJob) -> PruneResult:
        job.strategy_name = job.strategy_name or self.name
        started = time.time()
        t = job.stage_start("allocate", budget=job.budget.to_dict())
        (n_attn, n_act), alloc_info = dist.broadcast(allocation(self.allocate(job)))
        job.stage_end("allocate", t, n_attn=n_attn, n_act=n_act, **alloc_info)
        job.log(f"[{job.strategy_name}] split: {n_attn} attention + {n_act} activation sites")

        model = self.prepare(job)
        t = job.stage_start("select", n_attn=n_attn, n_act=n_act, scorer=job.config.scorer)
        chosen = self.choose(job, model, {"attn": n_attn, "act": n_act})
        job.stage_end("select", t, sites=[str(s) for s in chosen])
        job.log(f"[{job.strategy_name}] sites: {', '.join(str(s) for s in chosen) or '(none)'}")

        removal = self.remove(job, model, chosen)
        more, budget_check = self.meet_budget(job, model)   # before the fine-tune: no training is wasted
        removal = {**removal, **more} if more else removal
        metric_pruned, history, metric = finetune_and_measure(job, model, "removal")

        t = job.stage_start("merge")
        merged = merge(job, model)
        job.stage_end("merge", t, merged=merged)
        report = {
            "allocation": alloc_info,
            "removal": removal,
            "merged": merged,
            "metric_before_finetune": metric_pruned,
            "metric": metric,
            "finetune_history": history,
            **({"finetune_reported": reported_epoch(history)} if reported_epoch(history) else {}),
            **budget_check,
            "seconds": round(time.time() - started, 1),
        }
        return finish(job, model, report, fold_norm=job.folds_norm)

    # -- the plan (--plan): the stages above, counted, nothing run ------------------------------------------
    def plan(self, job: PruneJob) -> list[PlanStep]:
        """The run's stages without running them: the allocation's (`plan_allocation`), the selection (a scorer
        with a training phase describes it: ``plan(job, counts)``), the final fine-tune, and the evaluations
        (the dense model, and the pruned one before and after its fine-tune)."""
        most = self.plan_sites(job)
        counts = {"attn": most - most // 2, "act": most // 2}   # a scorer's phase counts the removals, not the split
        steps = list(self.plan_allocation(job))
        scorer = job.registry.build("scorer", job.config.scorer, **job.config.options_for("scorer", job.config.scorer))
        if hasattr(scorer, "plan"):
            steps.append(scorer.plan(job, counts))
        cfg = job.config.schedule("finetune")
        steps.append(finetune_step(job, "finetune", "stage 2: fine-tune", f"{cfg.epochs} epochs, batch {cfg.batch_size}"))
        steps.append(evaluation_step(job, "evaluations", "dense; pruned before and after its fine-tune", 3))
        return steps

    def plan_allocation(self, job: PruneJob) -> list[PlanStep]:
        """What the allocation costs (nothing for a fixed rule; HetDPT's points and checks)."""
        return []

    @staticmethod
    def plan_sites(job: PruneJob) -> int:
        """The most sites the budget removes (a cost target: its feasible split with the most)."""
        if job.budget.sites is not None:
            return job.budget.sites
        return max((a + m for a, m in job.feasible_pairs()), default=0)

    def meet_budget(self, job: PruneJob, model: nn.Module) -> tuple[dict, dict]:
        """Check the pruned model's own cost against a cost target, and correct it: ``(removal records,
        report entries)``.

        The split was planned with mean per-site savings, which hold for identical blocks only (not for Swin
        stages or width-pruned models), so the chosen sites may save less. While the target is missed, one
        more site is chosen and removed (this strategy's ``choose`` and ``remove``; the kind that saves more
        on this model first). Where no site left saves cost, the log says the target is missed. The report
        gets ``budget_met`` and ``budget_check`` (limit, cost reached, sites added). Under torchrun rank 0
        counts and every rank receives its numbers.
        """
        if not job.budget.counts_cost:
            return {}, {}
        merge = bool(job.config.mergers)
        example = job.example
        dense = dist.on_main(lambda: job.cost(job.dense, example))
        limit = job.budget.limit(dense)

        def status() -> tuple[float, list[str]]:
            reached = reached_cost(model, example, merge, job.cost, job.prepare_costs)
            kinds = kinds_by_saving(model, example, merge, job.cost, job.prepare_costs) if reached > limit else []
            return reached, kinds

        reached, kinds = dist.on_main(status)
        planned, added, records = reached, [], {}
        while reached > limit and kinds:
            more = next((found for kind in kinds
                         for found in [list(self.choose(job, model, {"attn": int(kind == "attn"),
                                                                     "act": int(kind == "act")}))] if found), [])
            if not more:
                break
            records.update(self.remove(job, model, more) or {})
            added += more
            reached, kinds = dist.on_main(status)
        met = reached <= limit
        unit = getattr(job.cost_model, "unit", "")
        if added:
            job.log(f"[{job.strategy_name}] the chosen sites left {planned:.4g} {unit} > the limit {limit:.4g} "
                    f"(blocks differ in cost); removed {', '.join(map(str, added))} as well: {reached:.4g} {unit}")
        if not met:
            job.log(f"[{job.strategy_name}] warning: {job.budget.describe()} is NOT met: the pruned model costs "
                    f"{reached:.4g} {unit}, the limit is {limit:.4g}, and no site left saves cost")
        return records, {"budget_met": met, "budget_check": {
            "model": job.cost_model_name, "unit": unit, "limit": limit, "reached": reached,
            "reached_as_planned": planned, "added_sites": [str(s) for s in added]}}


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


class FixedSplit(DepthStrategy):
    """Prune exactly ``n_attn`` attention and ``n_act`` activation sites (ablation studies)."""

    name = "fixed-split"
    description = "a given (n_attn, n_act), for ablations"

    def __init__(self, n_attn: int, n_act: int):
        self.split = (int(n_attn), int(n_act))

    def allocate(self, job: PruneJob):
        limits = max_per_kind(job.dense)
        if self.split[0] > limits["attn"] or self.split[1] > limits["act"]:
            raise HetpruneError(f"split {self.split} is more than this model can lose "
                                f"(at most {limits['attn']} attention and {limits['act']} activation sites)")
        return self.split, {"fixed": True}
