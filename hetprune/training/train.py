"""Fine-tuning with knowledge distillation, per-epoch checkpoints, resume, and
a NaN guard; and top-1 evaluation.

One loop serves the embedded base model, the short fine-tunes of MAP points
and the long fine-tune after pruning, so every strategy is trained alike.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..core import devices
from ..core import distributed as dist
from ..core.config import COMPILE_AUTO, KD_MODES, TrainConfig  # noqa: F401 - TrainConfig's public home stays hetprune.training.train too
from .bundle import DataBundle
from .loaders import loader, subset
from .mixing import mix_batch
from ..core.errors import HetpruneError
from ..core.io import note_saved, save_torch_atomic
from .resume import made_when, now, reusable


def resolve_device(name: str | torch.device) -> torch.device:
    """Kept for callers of the old name: `hetprune.core.devices.resolve`."""
    return devices.resolve(name)


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mode: str, temperature: float = 2.0):
    """The distillation term alone: soft KL(teacher || student) * T^2, or CE on the teacher's argmax."""
    if mode == "soft":
        t = temperature
        return F.kl_div(F.log_softmax(student_logits / t, dim=-1), F.log_softmax(teacher_logits / t, dim=-1),
                        reduction="batchmean", log_target=True) * (t * t)
    if mode == "hard":
        return F.cross_entropy(student_logits, teacher_logits.argmax(dim=-1))
    return student_logits.new_zeros(())


def label_loss(logits: torch.Tensor, targets: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """The loss on the labels: timm's ``SoftTargetCrossEntropy`` on mixed (soft) targets, whose label
    smoothing is already folded in; timm's ``LabelSmoothingCrossEntropy`` on class indices with
    ``smoothing``; plain cross-entropy otherwise (the default, as it always was)."""
    if targets.dim() == logits.dim():
        from timm.loss import SoftTargetCrossEntropy

        return SoftTargetCrossEntropy()(logits, targets)
    if smoothing > 0:
        from timm.loss import LabelSmoothingCrossEntropy

        return LabelSmoothingCrossEntropy(smoothing)(logits, targets)
    return F.cross_entropy(logits, targets)


def training_loss(student_logits, labels, teacher_logits, cfg: TrainConfig) -> torch.Tensor:
    """The labels' loss, plus ``kd_alpha`` times the distillation term. ``student_logits`` may be a
    distilled model's ``(class head, distillation head)`` (`kd_token`): the labels train the class head, the
    teacher the distillation head (DeiT's hard distillation)."""
    dist_logits = None
    if isinstance(student_logits, (tuple, list)):
        student_logits, dist_logits = student_logits
    ce = label_loss(student_logits, labels, cfg.label_smoothing)
    if cfg.kd == "none" or teacher_logits is None:
        return ce
    kd_input = dist_logits if dist_logits is not None else student_logits
    return (1 - cfg.kd_alpha) * ce + cfg.kd_alpha * kd_loss(kd_input, teacher_logits, cfg.kd, cfg.kd_temperature)


class NonFiniteLoss(HetpruneError):
    """A NaN loss, or an inf one with no fp16 GradScaler to absorb it: training cannot go on."""

    def __init__(self, value: float):
        super().__init__(f"loss became {value}")
        self.value = value


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.element_size() < 4 else t


def forward_loss(net: nn.Module, x, y, cfg: TrainConfig, device: torch.device, amp: str,
                 teacher: nn.Module | None = None) -> torch.Tensor:
    """One batch's training loss: the forwards under autocast, the loss (KD term included) in fp32 or wider."""
    teacher_logits = None
    with devices.autocast(device, amp):
        if teacher is not None and cfg.kd != "none":
            with torch.no_grad():
                teacher_logits = _at_least_fp32(teacher(x))
        logits = net(x)
    logits = tuple(map(_at_least_fp32, logits)) if isinstance(logits, (tuple, list)) else _at_least_fp32(logits)
    return training_loss(logits, y, teacher_logits, cfg)


@dataclass(frozen=True)
class StepPlan:
    """How the training step runs on its device, decided in one place (`step_plan`), so a test on the CPU can
    ask for CUDA's decision and run it."""

    compile: bool   # the student's forward and backward, and the teacher's forward, under torch.compile
    fused: bool   # torch's fused AdamW kernel (one launch for every parameter)
    bf16_teacher: bool   # the teacher held in bf16 weights (the run's amp is bf16)


def step_plan(cfg: TrainConfig, device: torch.device, amp: str) -> StepPlan:
    """The step a schedule takes on ``device`` at precision ``amp``: compiled where ``compile`` says so (``auto``:
    on CUDA, where it pays; on the CPU compiling costs more than it saves at hetprune's sizes), AdamW fused on
    CUDA (on the CPU the step stays the unfused one it always was), a bf16 teacher under bf16 autocast (its
    matmuls ran in bf16 already: the weights' copy halves what is read)."""
    on_cuda = device.type == "cuda"
    return StepPlan(compile=on_cuda if cfg.compile == COMPILE_AUTO else bool(cfg.compile), fused=on_cuda,
                    bf16_teacher=amp == "bf16")


class FrozenTeacher(nn.Module):
    """The teacher as a training step calls it: its logits under ``torch.inference_mode`` (no autograd record,
    no version counters) and the run's autocast, handed back as ordinary fp32 tensors a loss can use in its
    graph (an inference tensor cannot be saved for backward)."""

    def __init__(self, net: nn.Module, device: torch.device, amp: str):
        super().__init__()
        self.net, self.device, self.amp = net, device, amp

    def forward(self, x):
        with torch.inference_mode(), devices.autocast(self.device, self.amp):
            out = self.net(x)
        return out.float() if out.element_size() < 4 else out.clone()


def frozen_teacher(teacher: nn.Module | None, device: torch.device, amp: str, plan: StepPlan) -> FrozenTeacher | None:
    """``teacher`` placed on ``device`` in eval mode, as `FrozenTeacher`: a bf16 copy where ``plan`` says so (the
    teacher given, often the dense model itself, is left in its own precision), compiled where the step is."""
    if teacher is None:
        return None
    net = devices.place(teacher, device).eval()
    if plan.bf16_teacher:
        net = copy.deepcopy(net).to(torch.bfloat16)
    return FrozenTeacher(torch.compile(net) if plan.compile else net, device, amp)


def grad_scaler(device: torch.device, amp: str) -> torch.amp.GradScaler:
    """The GradScaler of a training loop: on for fp16 only (off, its step is a plain ``optimizer.step()``)."""
    return torch.amp.GradScaler(device.type, enabled=amp == "fp16")


def optimisation_step(loss: torch.Tensor, optimizers: list, scaler, device: torch.device | None = None,
                      distributed: bool = False, clip: TrainConfig | None = None) -> bool:
    """Backward, then one step of every optimizer through ``scaler``; False when the step was skipped.

    The one step every training loop takes, so AMP is handled alike everywhere.
    An inf loss under fp16 is the overflow a GradScaler exists for: the step
    is skipped and the scale backed off. A NaN loss (or an inf one without
    fp16) raises `NonFiniteLoss`. Under DDP the ranks' flags are summed,
    so all skip or stop together (or the others would wait forever).
    ``clip``: the schedule whose ``clip_grad`` clips the first optimizer's gradients (the weights').
    """
    flags = torch.stack([torch.isnan(loss.detach()), torch.isinf(loss.detach())]).double()
    if distributed:
        flags = dist.sum_tensor(flags.to(device)).cpu()
    nan, inf = (bool(v) for v in flags.tolist())
    if nan or (inf and not scaler.is_enabled()):
        value = loss.item()
        raise NonFiniteLoss(value if not math.isfinite(value) else float("nan" if nan else "inf"))
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    if inf:   # what GradScaler does on overflow; scale() first makes its scale tensor if this is the first step
        scaler.scale(loss.detach())
        scaler.update(scaler.get_scale() * scaler.get_backoff_factor())
        return False
    scaler.scale(loss).backward()   # without fp16 the scaler is off: plain backward and step
    if clip is not None:
        clip_gradients(optimizers[0], scaler, clip)
    for opt in optimizers:
        scaler.step(opt)
    scaler.update()
    return True


def share_weighted(loss: torch.Tensor, share: int, whole: int, world: int) -> torch.Tensor:
    """This rank's mean ``loss`` over ``share`` of a global batch of ``whole`` items, weighted so that
    DDP's gradient average over ``world`` ranks is the single-process gradient of the global batch's mean:
    ``loss * share / whole * world`` (exactly ``loss`` in a single process). A stand-in item (``share`` 0)
    weighs nothing and flags nothing: the ranks with real items decide whether the step is taken."""
    if share == whole and world == 1:
        return loss
    weighted = loss * (share * world / whole)
    return weighted if share else torch.nan_to_num(weighted, nan=0.0, posinf=0.0, neginf=0.0)


@torch.inference_mode()
def evaluate(model: nn.Module, data_loader, device: str | torch.device = "cpu", reduce: bool = False,
             amp: str = "none") -> float:
    """Top-1 accuracy in percent, with the model moved to ``device`` (``reduce``: sum the counts of all ranks)."""
    device = devices.resolve(device)
    amp = devices.resolve_amp(amp, device)
    devices.place(model, device)
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no sync per batch
    total = 0
    for x, y in data_loader:
        x, y = devices.place((x, y), device)
        with devices.autocast(device, amp):
            logits = model(x)
        correct += (logits.argmax(dim=-1) == y).sum()
        total += y.numel()
    model.train(was_training)
    counts = torch.tensor([correct.item(), total], dtype=torch.float64)
    if reduce:
        counts = dist.sum_tensor(counts.to(device)).cpu()
    if counts[1] == 0:
        raise HetpruneError("evaluation set is empty")
    return float(100.0 * counts[0] / counts[1])


def evaluate_dataset(model: nn.Module, dataset, device: str | torch.device = "cpu", batch_size: int = 256,
                     workers: int = 0, amp: str = "none") -> float:
    """Top-1 on a whole data set; under torchrun each rank takes a share and the counts are summed."""
    device = devices.resolve(device)
    return evaluate(model, loader(dataset, batch_size, shuffle=False, workers=workers, rank=dist.rank(),
                                  world=dist.world(), pin_memory=device.type == "cuda"),
                    device, reduce=dist.active(), amp=amp)


def _checkpoint_path(folder: Path) -> Path:
    return folder / "finetune-checkpoint.pt"


def _save_checkpoint(folder: Path, model, optimizer, scheduler, epoch: int, history: list, cfg: TrainConfig,
                     scaler=None, key: dict | None = None, extra: dict | None = None):
    """The fine-tune's state after ``epoch`` whole epochs (``extra``: the steps done in the next one, the
    EMA, the best epoch's weights), written atomically by rank 0."""
    if not dist.is_main():
        return

    folder.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "epoch": epoch, "history": history, "config": cfg.to_dict(),
             "scaler": scaler.state_dict() if scaler is not None else {}, "key": key or {}, "saved_at": now(),
             **(extra or {})}
    save_torch_atomic(_checkpoint_path(folder), state)
    note_saved(f"a checkpoint in {folder}")


def _load_checkpoint(folder: Path) -> dict | None:
    path = _checkpoint_path(folder)
    if not path.is_file():
        return None
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise HetpruneError(f"fine-tune checkpoint {path} is corrupt or truncated ({exc}); "
                            "delete it to start this fine-tune over") from exc


def resume_checkpoint(folder: Path, current: dict, desc: str, log: Callable[[str], None],
                      distributed: bool) -> dict | None:
    """The checkpoint in ``folder`` a fine-tune continues from (its key must be ``current``), or None.

    Under DDP rank 0 decides and every rank loads that same checkpoint (its
    epoch, step and save time checked); a rank that finds none, or another,
    stops every rank with one error (`hetprune.core.distributed.follow_saved`)
    instead of starting afresh while the others resume, which hangs."""
    def reuse(path: Path, ckpt: dict) -> bool:
        stored = {**ckpt.get("key", {}), "training settings": ckpt.get("config")}
        return reusable(stored, current, f"the fine-tune checkpoint in {folder}", log)

    found = dist.follow_saved([_checkpoint_path(folder)], lambda path: _load_checkpoint(folder), _saved,
                              f"resume: {desc}", reuse=reuse, describe=lambda t: f"epoch {t[0]}, saved {t[2]}",
                              distributed=distributed)
    return None if found is None else found[1]


def _saved(ckpt: dict) -> tuple:
    """What names one saved checkpoint: its epoch, its step within the next and when it was saved."""
    return int(ckpt.get("epoch", 0)), int(ckpt.get("step", 0)), str(ckpt.get("saved_at", ""))


def workers_for(data: DataBundle, cfg: TrainConfig) -> int:
    """Loader processes: the schedule's ``workers``, else the data set's own default (ImageFolder: a share of
    the CPUs; the embedded sets: none)."""
    return cfg.workers or int(getattr(data, "workers", None) or 0)


class ClassificationSource:
    """What `train` iterates for a classification `DataBundle` (the default Task).

    A training source says how many steps an epoch has, yields each step's
    ``(batch, share, whole)`` (this rank's items of a global batch of
    ``whole``), and computes a batch's loss; [`hetprune.training.task.Task`][hetprune.training.task.Task]
    gives one for a user's own loader and loss. This one takes a seeded
    subset, splits every global batch across ranks (a rank with no item gets
    a zero-weight stand-in, so every rank takes every step), mixes it
    (``mixup``/``cutmix``: `hetprune.training.mixing`), and trains on cross-entropy
    (or soft targets) + KD from the teacher.
    """

    metric_name = "top1"
    higher_is_better = True
    splits = True   # a batch is (images, labels): `train` can cut it into micro-batches (accum_steps)

    def __init__(self, data: DataBundle):
        self.data = data

    def steps_per_epoch(self, cfg: TrainConfig) -> int:
        return max(1, math.ceil(len(subset(self.data.train, cfg.subset, cfg.seed)) / cfg.batch_size))

    def epoch(self, cfg: TrainConfig, seed: int, rank: int, world: int, device: torch.device, distributed: bool,
              start: int = 0):
        """This rank's batches of the epoch seeded ``seed``, from global batch ``start`` on."""
        train_set = subset(self.data.train, cfg.subset, cfg.seed)
        batches = loader(train_set, cfg.batch_size, shuffle=True, seed=seed, workers=workers_for(self.data, cfg),
                         rank=rank, world=world, pin_memory=device.type == "cuda", pad_empty=distributed,
                         pairs=cfg.mixes, repeats=cfg.repeats, start=start)
        for step, (batch, (share, whole)) in enumerate(zip(batches, batches.batch_sampler.shares()), start):
            x, y = devices.place(tuple(batch), device)
            if cfg.mixes:
                x, y = mix_batch(x, y, cfg, self.data.num_classes, seed, step)
            yield (x, y), share, whole

    def loss(self, net: nn.Module, batch, teacher: nn.Module | None, cfg: TrainConfig, device: torch.device,
             amp: str) -> torch.Tensor:
        x, y = batch
        return forward_loss(net, x, y, cfg, device, amp, teacher)

    @property
    def eval_split(self) -> str:
        """The split an epoch is evaluated on: the selection split where there is one (a best epoch is a choice)."""
        return "selection" if self.data.selection is not None else "val"

    def evaluate(self, model: nn.Module, cfg: TrainConfig, device: torch.device, amp: str, distributed: bool) -> float:
        workers = workers_for(self.data, cfg)
        dataset = getattr(self.data, self.eval_split)   # the selection split, else val
        if distributed:
            return evaluate_dataset(model, dataset, device, workers=workers, amp=amp)
        return evaluate(model, loader(dataset, 256, shuffle=False, workers=workers,
                                      pin_memory=device.type == "cuda"), device, amp=amp)


# -- pieces of the training loop ------------------------------------------------------------------------------

def scaled_lr(cfg: TrainConfig) -> float:
    """timm's learning-rate rule: ``lr * (batch_size / lr_base_batch)`` (``linear``) or its square root
    (``sqrt``); ``none`` leaves ``lr`` as given. ``batch_size`` is the global batch (a ``batch_per_gpu``
    schedule is resolved to it first: `TrainConfig.global_batch`)."""
    if cfg.lr_scale == "none":
        return cfg.lr
    ratio = cfg.batch_size / cfg.lr_base_batch
    return cfg.lr * (ratio if cfg.lr_scale == "linear" else math.sqrt(ratio))


def make_optimizer(model: nn.Module, cfg: TrainConfig, lr: float, device: torch.device, fused: bool | None = None):
    """timm's AdamW (no weight decay on norms, biases, tokens); fused where ``fused`` (None: as `step_plan`
    decides for ``device``: on CUDA, where torch has that kernel)."""
    from timm.optim import create_optimizer_v2

    fused = device.type == "cuda" if fused is None else fused
    return create_optimizer_v2(model, opt="adamw", lr=lr, weight_decay=cfg.weight_decay,
                               **({"fused": True} if fused else {}))


def make_scheduler(optimizer, cfg: TrainConfig, lr: float, steps_per_epoch: int):
    """timm's cosine schedule per step: warm-up over ``warmup_epochs`` from ``warmup_lr``, down to ``min_lr``
    (each ``lr * 0.01`` unless given: the schedule every fine-tune had before they were settable)."""
    from timm.scheduler import CosineLRScheduler

    total = max(1, cfg.epochs * steps_per_epoch)
    warmup_lr = lr * 0.01 if cfg.warmup_lr is None else cfg.warmup_lr
    min_lr = lr * 0.01 if cfg.min_lr is None else cfg.min_lr
    return CosineLRScheduler(optimizer, t_initial=total, warmup_t=cfg.warmup_epochs * steps_per_epoch,
                             warmup_lr_init=warmup_lr, lr_min=min_lr, t_in_epochs=False)


def set_drop_path(model: nn.Module, rate: float) -> Callable[[], None]:
    """Stochastic depth on ``model``'s residual branches while it trains, at timm's rule (``rate * i / (depth
    - 1)`` for block ``i``), through the drop-path slots its adapter names; returns what puts the model's own
    modules back (a pruned model is saved as it was built)."""
    from timm.layers import DropPath

    from ..model.adapters import adapter_for

    check_training_modes(model, TrainConfig(drop_path=rate))
    slots = adapter_for(model).drop_path_slots(model)
    saved = []
    depth = len(slots)
    for i, block_slots in enumerate(slots):
        p = rate * i / max(1, depth - 1)
        for owner, name in block_slots:
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, DropPath(p) if p > 0 else nn.Identity())

    def restore():
        for owner, name, module in saved:
            setattr(owner, name, module)

    return restore


def distilled_training(model: nn.Module, on: bool) -> bool:
    """Switch a distilled model (timm's ``VisionTransformerDistilled``) to return ``(class head,
    distillation head)`` while it trains; returns the setting it had. One error for any other model."""
    check_training_modes(model, TrainConfig(kd_token=True))
    before = bool(getattr(model, "distilled_training", False))
    model.set_distilled_training(on)
    return before


def check_source(source, cfg: TrainConfig) -> None:
    """Refuse the schedule options a training source cannot honour (its own ``check``; ``accum_steps`` on
    batches hetprune cannot cut). A run checks every schedule this way before anything trains."""
    if getattr(source, "check", None):
        source.check(cfg)
    if cfg.accum_steps > 1 and not getattr(source, "splits", False):
        raise HetpruneError("accum_steps > 1 cuts hetprune's own (images, labels) batches; a Task's own loader "
                            "sets its own batch size: give it smaller batches instead")


def check_training_modes(model: nn.Module, cfg: TrainConfig, section: str = "") -> None:
    """Refuse what `training_modes` cannot do to ``model``: ``kd_token`` without a distillation token,
    ``drop_path`` where its adapter names no slot. A run checks every schedule (``section``) this way before
    anything trains."""
    key = f"{section}." if section else ""
    if cfg.kd_token and not hasattr(model, "set_distilled_training"):
        raise HetpruneError(f"{key}kd_token distils into a distillation token, and {type(model).__name__} has none: "
                            f"use a distilled model (e.g. deit_base_distilled_patch16_224) or leave {key}kd_token off")
    if cfg.drop_path is not None:
        from ..model.adapters import adapter_for

        adapter = adapter_for(model)
        if not any(adapter.drop_path_slots(model)):
            raise HetpruneError(f"{key}drop_path: the {adapter.name} adapter names no drop-path slot in "
                                f"{type(model).__name__}; leave {key}drop_path null for this model")


def split_batch(batch, parts: int) -> list[tuple[tuple, int]]:
    """``(images, targets)`` cut into at most ``parts`` micro-batches, each with its item count."""
    x, y = batch
    n = min(parts, len(x))
    return [((xi, yi), len(xi)) for xi, yi in zip(torch.tensor_split(x, n), torch.tensor_split(y, n))]


class FiniteWatch:
    """Non-finite losses, flagged on the device step by step and read every ``check_every`` steps: one host
    sync per check, not one per step. A check finds the first bad step of every rank (all ranks check
    together, so all stop together) and `check` raises `NonFiniteLoss` for it."""

    NONE = 2 ** 62

    def __init__(self, device: torch.device, distributed: bool):
        self.device, self.distributed = device, distributed
        self.first = torch.full((), self.NONE, dtype=torch.long, device=device)
        self.nan = torch.zeros((), dtype=torch.bool, device=device)
        self.lrs: dict[int, float] = {}

    def note(self, flags: torch.Tensor, step: int, lr: float) -> None:
        """``flags`` ``[NaNs, infs]`` of global step ``step`` (counted from the run's first step)."""
        fresh = (flags.sum() > 0) & (self.first == self.NONE)
        self.first = torch.where(fresh, torch.full_like(self.first, step), self.first)
        self.nan = torch.where(fresh, flags[0] > 0, self.nan)
        self.lrs[step] = lr

    def check(self) -> None:
        first = self.first.clone()
        if self.distributed:
            first = dist.min_tensor(first)
        step = int(first.item())
        if step == self.NONE:
            self.lrs.clear()
            return
        nan = (self.nan & (self.first == step)).double()
        if self.distributed:
            nan = dist.sum_tensor(nan)
        exc = NonFiniteLoss(float("nan") if nan.item() > 0 else float("inf"))
        exc.step, exc.lr = step, self.lrs.get(step)
        raise exc


def loss_flags(loss: torch.Tensor) -> torch.Tensor:
    """``[is NaN, is inf]`` of a loss, on its device."""
    loss = loss.detach()
    return torch.stack([torch.isnan(loss), torch.isinf(loss)]).double()


def train(
    model: nn.Module,
    data,
    cfg: TrainConfig,
    teacher: nn.Module | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    desc: str = "fine-tune",
    on_epoch_end: Callable[[int, dict], None] | None = None,
    eval_each_epoch: bool = False,
    distributed: bool | None = None,
    resume_key: dict | None = None,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Train ``model`` in place on ``data`` (a `DataBundle`, or a training source such as
    `ClassificationSource` or a Task's); returns the per-epoch history.

    With ``checkpoint_dir``, a checkpoint is written after every epoch (and
    every ``save_every_steps`` steps inside one) and ``resume=True``
    continues from it. Each epoch's data order and augmentation are seeded
    by ``(seed, epoch)`` (and each item's by its index), so a resumed run
    repeats the uninterrupted one, also from the middle of an epoch (the
    steps done are skipped, and torch's generator is put back as it was).
    A NaN loss (or an inf one without fp16) stops training with an error
    and leaves the last good checkpoint in place; the loss is checked on
    the device and read every ``check_every`` steps and before every
    checkpoint, so no step waits for the host. An inf loss under fp16 is an
    overflow: the GradScaler skips that step (checked every step).

    The checkpoint carries ``resume_key`` (what the run started from: the
    model's weights, the teacher, the data) and the training settings; a
    checkpoint whose key or settings differ is not reused: the log says what
    changed and training starts afresh.

    Under torchrun (``distributed`` defaults to whether a process group is
    active) the model is wrapped in DistributedDataParallel and every global
    batch of ``cfg.batch_size`` items is split across ranks (any batch size:
    shares may differ by one item, two when batches are mixed). Every rank
    takes every step, and each rank's loss is weighted by its share of the
    global batch (`share_weighted`; a rank with no item takes part with
    weight 0), so the run follows the single-process one up to rounding;
    ``accum_steps`` cuts each rank's share into micro-batches whose
    gradients add up to the same step. ``distributed=False`` trains this
    rank's model alone (e.g. one MAP point per rank).

    ``cfg.amp`` runs the forward passes under autocast (bf16, or fp16 with a
    GradScaler); the loss, KD term included, is computed in fp32 (or wider).
    The recipe options of a long fine-tune (mixup, cutmix, label smoothing,
    drop path, EMA, token distillation, clipping, evaluation every N epochs
    with the best kept): see `hetprune.core.config.TrainConfig` and the settings
    reference. Each epoch's history has its loss, learning rate, seconds
    and, where evaluated, the metric (and the EMA's); ``on_epoch_end`` gets
    the images per second too (a timing, like ``seconds``, that a rerun does
    not repeat). The epoch whose weights are returned when they are not the
    last has ``reported``.
    """
    distributed = dist.active() if distributed is None else (distributed and dist.active())
    rank, world = (dist.rank(), dist.world()) if distributed else (0, 1)
    cfg = cfg.global_batch(world)   # batch_per_gpu: from here on batch_size is the global batch
    device = devices.resolve(cfg.device)
    amp = devices.resolve_amp(cfg.amp, device)
    devices.place(model, device)
    plan = step_plan(cfg, device, amp)
    teacher = frozen_teacher(teacher, device, amp, plan)
    scaler = grad_scaler(device, amp)
    source = data if hasattr(data, "epoch") else ClassificationSource(data)
    check_source(source, cfg)
    steps_per_epoch = source.steps_per_epoch(cfg)
    lr = scaled_lr(cfg)
    optimizer = make_optimizer(model, cfg, lr, device, fused=plan.fused)
    scheduler = make_scheduler(optimizer, cfg, lr, steps_per_epoch)
    ema = None
    if cfg.ema_decay:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(model, decay=cfg.ema_decay, foreach=True)   # one _foreach_lerp_ over every tensor
    folder = Path(checkpoint_dir) if checkpoint_dir else None
    start_epoch, start_step, history, best, carried = 0, 0, [], None, None
    if folder is not None and resume:
        ckpt = resume_checkpoint(folder, {**(resume_key or {}), "training settings": cfg.to_dict()}, desc, log,
                                 distributed)
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            if ckpt.get("scaler"):
                scaler.load_state_dict(ckpt["scaler"])
            if ema is not None and ckpt.get("ema"):
                ema.module.load_state_dict(ckpt["ema"])
            best = ckpt.get("best")
            start_epoch, history = ckpt["epoch"], list(ckpt["history"])
            start_step = int(ckpt.get("step", 0))
            carried = ckpt.get("within") if start_step else None
            where = f" and {start_step} of its {steps_per_epoch} steps" if start_step else ""
            log(f"resume: {desc} continues after epoch {start_epoch} of {cfg.epochs}{where}, from the checkpoint "
                f"in {folder} saved {made_when([ckpt], 'saved_at')}")
    with training_modes(model, cfg):
        history = _train_epochs(model, source, cfg, teacher, device, amp, scaler, optimizer, scheduler, ema, folder,
                                start_epoch, start_step, history, best, carried, steps_per_epoch, distributed, rank,
                                world, progress, desc, on_epoch_end, eval_each_epoch, resume_key, plan)
    model.eval()
    return history


@contextlib.contextmanager
def training_modes(model: nn.Module, cfg: TrainConfig):
    """``model`` as a schedule trains it: stochastic depth at ``drop_path`` and a distilled model's two heads
    for ``kd_token``; put back as it was afterwards. Every loop that trains on a schedule (a fine-tune,
    gate-taylor's gate phase) trains in it."""
    restore_drop_path = set_drop_path(model, cfg.drop_path) if cfg.drop_path is not None else None
    was_distilled = distilled_training(model, True) if cfg.kd_token else None
    try:
        yield model
    finally:
        if restore_drop_path is not None:
            restore_drop_path()
        if was_distilled is not None:
            model.set_distilled_training(was_distilled)


def _train_epochs(model, source, cfg, teacher, device, amp, scaler, optimizer, scheduler, ema, folder, start_epoch,
                  start_step, history, best, carried, steps_per_epoch, distributed, rank, world, progress, desc,
                  on_epoch_end, eval_each_epoch, resume_key, plan: StepPlan) -> list[dict]:
    """The epochs of `train`, from ``start_epoch`` (and ``start_step`` within it); returns the history."""
    net = ddp = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        dist.broadcast_module(model)
        net = ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if plan.compile:   # the forward compiled, and through AOTAutograd its backward
        net = torch.compile(net)
    eval_every = cfg.eval_every or (1 if eval_each_epoch else 0)
    higher = getattr(source, "higher_is_better", True)
    watch = FiniteWatch(device, distributed)
    fp16 = scaler.is_enabled()
    saved = [folder is not None and (start_epoch > 0 or start_step > 0)]   # a good checkpoint exists

    def save(epoch_done: int, extra: dict | None = None) -> None:
        if folder is None:
            return
        if not fp16:
            stop_if_nonfinite()   # nothing non-finite reaches a checkpoint
        state = {**({"ema": ema.module.state_dict()} if ema is not None else {}),
                 **({"best": best} if best is not None else {}), **(extra or {})}
        _save_checkpoint(folder, model, optimizer, scheduler, epoch_done, history, cfg, scaler, resume_key, state)
        saved[0] = True
        if distributed:
            dist.barrier()

    def stop_if_nonfinite() -> None:
        try:
            watch.check()
        except NonFiniteLoss as exc:
            raise _stopped(desc, exc, exc.step // steps_per_epoch, exc.step % steps_per_epoch, exc.lr,
                           folder if saved[0] else None) from None

    # disable=None: tqdm shows itself on a terminal only, so logs stay readable
    bar = tqdm(range(start_epoch, cfg.epochs), desc=desc, disable=None if progress and rank == 0 else True, leave=False,
               dynamic_ncols=True, initial=start_epoch, total=cfg.epochs)
    for epoch in bar:
        model.train()
        seed = cfg.seed * 100_003 + epoch
        first = start_step if epoch == start_epoch else 0
        if first and carried:   # the middle of an epoch: torch's generator as the uninterrupted run had it
            torch.set_rng_state(carried["rng"])
            if device.type == "cuda" and carried.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(carried["cuda_rng"], device)
            epoch_loss = carried["loss"].to(device)
            images, seconds = int(carried["images"]), float(carried["seconds"])
        else:
            torch.manual_seed(seed)
            epoch_loss, images, seconds = torch.zeros(2, dtype=torch.float64, device=device), 0, 0.0
        t0, last_lr = time.time(), optimizer.param_groups[0]["lr"]
        batches = source.epoch(cfg, seed, rank, world, device, distributed, **({"start": first} if first else {}))
        for step, (batch, share, whole) in enumerate(batches, first):
            done = epoch * steps_per_epoch + step
            optimizer.zero_grad(set_to_none=True)   # a model may come with gradients (a gate phase's)
            step_loss, flags = _accumulate(net, ddp, source, batch, share, whole, world, cfg, teacher, device, amp,
                                           scaler, distributed)
            stepped, last_lr = True, optimizer.param_groups[0]["lr"]
            if fp16:   # the GradScaler's skip is decided now: one host sync per step, as it always was
                try:
                    stepped = _fp16_decision(flags, scaler, distributed)
                except NonFiniteLoss as exc:
                    raise _stopped(desc, exc, epoch, step, optimizer.param_groups[0]["lr"],
                                   folder if saved[0] else None) from None
            else:
                watch.note(flags, done, optimizer.param_groups[0]["lr"])
            if stepped:
                _optimizer_step(model, optimizer, scaler, cfg)
                if ema is not None:
                    ema.update(model, step=done + 1)
                epoch_loss += step_loss
            scheduler.step_update(done + 1)
            images += whole
            if not fp16 and (done + 1) % cfg.check_every == 0:
                stop_if_nonfinite()
            if cfg.save_every_steps and (step + 1) % cfg.save_every_steps == 0 and step + 1 < steps_per_epoch:
                loss_now = epoch_loss.detach().cpu()
                within = {"rng": torch.get_rng_state(), "loss": loss_now, "images": images,
                          "seconds": seconds + time.time() - t0,
                          **({"cuda_rng": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}
                save(epoch, {"step": step + 1, "within": within})
        if not fp16:
            stop_if_nonfinite()
        if distributed:
            epoch_loss = dist.sum_tensor(epoch_loss)
        totals = epoch_loss.cpu()   # the epoch's one wait for the device
        seconds += time.time() - t0
        metrics = {"epoch": epoch + 1, "loss": float(totals[0] / max(1.0, float(totals[1]))),
                   "seconds": round(seconds, 2), "lr": last_lr}
        if eval_every and ((epoch + 1) % eval_every == 0 or epoch + 1 == cfg.epochs):
            best = _evaluate_epoch(model, ema, source, cfg, device, amp, distributed, metrics, best, higher)
        history.append(metrics)
        bar.set_postfix({k: round(v, 4) for k, v in metrics.items() if k in ("loss", "accuracy", "metric")})
        save(epoch + 1)
        if on_epoch_end is not None:   # the history keeps what a rerun repeats; the event has the speed too
            on_epoch_end(epoch + 1, {**metrics, "images_per_s": round(images / max(seconds, 1e-9), 1)})
    return _kept(model, ema, cfg, history, best)


def _accumulate(net, ddp, source, batch, share, whole, world, cfg, teacher, device, amp, scaler, distributed):
    """One global batch's gradients (this rank's share, in ``accum_steps`` micro-batches, DDP synchronising
    the last only): ``(sum of item losses, [NaNs, infs] among them)``, both on the device."""
    parts = split_batch(batch, cfg.accum_steps) if cfg.accum_steps > 1 else [(batch, share)]
    if cfg.accum_steps > 1 and not share:
        parts = parts[:1]
    total = torch.zeros(2, dtype=torch.float64, device=device)
    flags = torch.zeros(2, dtype=torch.float64, device=device)
    for i, (micro, items) in enumerate(parts):
        items = items if share else 0
        quiet = ddp.no_sync() if distributed and i < len(parts) - 1 else contextlib.nullcontext()
        with quiet:
            loss = source.loss(net, micro, teacher, cfg, device, amp)
            if items:   # python numbers into device tensors: no copy from the host, no wait for the device
                flags += loss_flags(loss)
                total[0] += loss.detach().double() * items
                total[1] += items
            scaler.scale(share_weighted(loss, items, whole, world)).backward()
    return total, flags


def batch_split(cfg: TrainConfig, world: int) -> str:
    """How a schedule's global batch splits over ``world`` ranks, for a log line: ``global batch 1024 = 8 x
    128`` (``8 x 125-126`` where it does not divide evenly; micro-batches where ``accum_steps`` > 1)."""
    low, high = cfg.batch_size // world, -(-cfg.batch_size // world)
    per = f"{low}" if low == high else f"{low}-{high}"
    micro = f", each in {cfg.accum_steps} micro-batches" if cfg.accum_steps > 1 else ""
    return f"global batch {cfg.batch_size} = {world} x {per}{micro}"


def _fp16_decision(flags, scaler, distributed: bool) -> bool:
    """Under fp16: a NaN loss stops the run (`NonFiniteLoss`); an inf one is an overflow the GradScaler skips
    (the step dropped, the scale backed off); the ranks' flags are summed so all decide alike."""
    if distributed:
        flags = dist.sum_tensor(flags)
    nan, inf = (bool(v) for v in flags.tolist())
    if nan:
        raise NonFiniteLoss(float("nan"))
    if inf:
        scaler.update(scaler.get_scale() * scaler.get_backoff_factor())
        return False
    return True


def _optimizer_step(model, optimizer, scaler, cfg: TrainConfig) -> None:
    """Clip and step."""
    clip_gradients(optimizer, scaler, cfg)
    scaler.step(optimizer)
    scaler.update()


def clip_gradients(optimizer, scaler, cfg: TrainConfig) -> None:
    """``cfg.clip_grad`` (timm's ``dispatch_clip_grad``, on unscaled gradients) on ``optimizer``'s parameters;
    nothing where it is null."""
    if cfg.clip_grad is None:
        return
    from timm.utils import dispatch_clip_grad

    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    dispatch_clip_grad(params, cfg.clip_grad, cfg.clip_mode)


def _stopped(desc: str, exc: NonFiniteLoss, epoch: int, step: int, lr: float | None, folder):
    """The error that stops a run whose loss is no longer finite, naming where, and the last good checkpoint
    (``folder``: None when there is none yet)."""
    where = f"; the last good checkpoint is {_checkpoint_path(folder)}" if folder else ""
    rate = f" (lr {lr:.2e})" if lr is not None else ""
    return HetpruneError(f"{desc}: loss became {exc.value} at epoch {epoch + 1}, step {step + 1}{rate}; "
                         f"stopped{where}. Lower the learning rate or check the data.")


def _evaluate_epoch(model, ema, source, cfg, device, amp, distributed, metrics: dict, best, higher: bool):
    """The metric of this epoch's weights (and of the EMA's) into ``metrics``; returns the best so far (its
    epoch, metric and, when ``keep: best``, its weights)."""
    value = source.evaluate(model, cfg, device, amp, distributed)
    metrics["metric"] = value
    if getattr(source, "eval_split", "val") != "val":
        metrics["split"] = source.eval_split   # a best epoch is chosen on it, never on the val set reported
    if getattr(source, "metric_name", None) == "top1":
        metrics["accuracy"] = value   # the key an evaluated epoch always had
    if ema is not None:
        metrics["ema_metric"] = source.evaluate(ema.module, cfg, device, amp, distributed)
    better = best is None or (value > best["metric"] if higher else value < best["metric"])
    if not better:
        return best
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} if cfg.keep == "best" else None
    return {"epoch": metrics["epoch"], "metric": value, **({"model": weights} if weights is not None else {})}


def _kept(model, ema, cfg: TrainConfig, history: list[dict], best) -> list[dict]:
    """Put the weights ``keep`` asks for into ``model`` and mark their epoch ``reported`` in the history."""
    if cfg.keep == "best" and best is not None and best.get("model") is not None:
        model.load_state_dict(best["model"])
        for h in history:
            if h["epoch"] == best["epoch"]:
                h["reported"] = "best"
    elif cfg.keep == "ema" and ema is not None:
        model.load_state_dict(ema.module.state_dict())
        if history:
            history[-1]["reported"] = "ema"
    return history
