"""Fine-tuning with knowledge distillation, per-epoch checkpoints, resume, and
a NaN guard; and top-1 evaluation.

One loop serves the embedded base model, the short fine-tunes of MAP points
and the long fine-tune after pruning, so every strategy is trained alike.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from . import devices
from . import distributed as dist
from .config import KD_MODES, TrainConfig  # noqa: F401 - TrainConfig's public home stays hetprune.train too
from .data import DataBundle, loader, subset
from .errors import HetpruneError
from .io import note_saved
from .resume import made_when, now, reusable


def resolve_device(name: str | torch.device) -> torch.device:
    """Kept for callers of the old name: `hetprune.devices.resolve`."""
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


def training_loss(student_logits, labels, teacher_logits, cfg: TrainConfig) -> torch.Tensor:
    ce = F.cross_entropy(student_logits, labels)
    if cfg.kd == "none" or teacher_logits is None:
        return ce
    return (1 - cfg.kd_alpha) * ce + cfg.kd_alpha * kd_loss(student_logits, teacher_logits, cfg.kd,
                                                            cfg.kd_temperature)


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
    return training_loss(_at_least_fp32(logits), y, teacher_logits, cfg)


def grad_scaler(device: torch.device, amp: str) -> torch.amp.GradScaler:
    """The GradScaler of a training loop: on for fp16 only (off, its step is a plain ``optimizer.step()``)."""
    return torch.amp.GradScaler(device.type, enabled=amp == "fp16")


def optimisation_step(loss: torch.Tensor, optimizers: list, scaler, device: torch.device | None = None,
                      distributed: bool = False) -> bool:
    """Backward, then one step of every optimizer through ``scaler``; False when the step was skipped.

    The one step every training loop takes, so AMP is handled alike everywhere.
    An inf loss under fp16 is the overflow a GradScaler exists for: the step
    is skipped and the scale backed off. A NaN loss (or an inf one without
    fp16) raises `NonFiniteLoss`. Under DDP the ranks' flags are summed,
    so all skip or stop together (or the others would wait forever).
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
                     scaler=None, key: dict | None = None):
    import os
    import tempfile

    if not dist.is_main():
        return

    folder.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "epoch": epoch, "history": history, "config": cfg.to_dict(),
             "scaler": scaler.state_dict() if scaler is not None else {}, "key": key or {}, "saved_at": now()}
    fd, tmp = tempfile.mkstemp(prefix=".ckpt.", dir=folder)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, _checkpoint_path(folder))
        note_saved(f"a checkpoint in {folder}")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_checkpoint(folder: Path) -> dict | None:
    path = _checkpoint_path(folder)
    if not path.is_file():
        return None
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise HetpruneError(f"fine-tune checkpoint {path} is corrupt or truncated ({exc}); "
                            "delete it to start this fine-tune over") from exc


class ClassificationSource:
    """What `train` iterates for a classification `DataBundle` (the default Task).

    A training source says how many steps an epoch has, yields each step's
    ``(batch, share, whole)`` (this rank's items of a global batch of
    ``whole``), and computes a batch's loss; [`hetprune.task.Task`][hetprune.task.Task]
    gives one for a user's own loader and loss. This one takes a seeded
    subset, splits every global batch across ranks (a rank with no item gets
    a zero-weight stand-in, so every rank takes every step), and trains on
    cross-entropy + KD from the teacher.
    """

    def __init__(self, data: DataBundle):
        self.data = data

    def steps_per_epoch(self, cfg: TrainConfig) -> int:
        return max(1, math.ceil(len(subset(self.data.train, cfg.subset, cfg.seed)) / cfg.batch_size))

    def epoch(self, cfg: TrainConfig, seed: int, rank: int, world: int, device: torch.device, distributed: bool):
        train_set = subset(self.data.train, cfg.subset, cfg.seed)
        batches = loader(train_set, cfg.batch_size, shuffle=True, seed=seed, workers=cfg.workers, rank=rank,
                         world=world, pin_memory=device.type == "cuda", pad_empty=distributed)
        for batch, (share, whole) in zip(batches, batches.batch_sampler.shares()):
            yield devices.place(tuple(batch), device), share, whole

    def loss(self, net: nn.Module, batch, teacher: nn.Module | None, cfg: TrainConfig, device: torch.device,
             amp: str) -> torch.Tensor:
        x, y = batch
        return forward_loss(net, x, y, cfg, device, amp, teacher)

    def evaluate(self, model: nn.Module, cfg: TrainConfig, device: torch.device, amp: str, distributed: bool) -> float:
        if distributed:
            return evaluate_dataset(model, self.data.val, device, workers=cfg.workers, amp=amp)
        return evaluate(model, loader(self.data.val, 256, shuffle=False, workers=cfg.workers,
                                      pin_memory=device.type == "cuda"), device, amp=amp)


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

    With ``checkpoint_dir``, a checkpoint is written after every epoch and
    ``resume=True`` continues from it. Each epoch's data order and
    augmentation are seeded by ``(seed, epoch)``, so a resumed run repeats
    the uninterrupted one. A NaN loss (or an inf one without fp16) stops
    training with an error and leaves the last good checkpoint in place; an
    inf loss under fp16 is an overflow: the GradScaler skips that step.

    The checkpoint carries ``resume_key`` (what the run started from: the
    model's weights, the teacher, the data) and the training settings; a
    checkpoint whose key or settings differ is not reused: the log says what
    changed and training starts afresh.

    Under torchrun (``distributed`` defaults to whether a process group is
    active) the model is wrapped in DistributedDataParallel and every global
    batch of ``cfg.batch_size`` items is split across ranks (any batch size:
    shares may differ by one item). Every rank takes every step, and each
    rank's loss is weighted by its share of the global batch
    (`share_weighted`; a rank with no item takes part with weight 0), so
    the run follows the single-process one up to rounding;
    ``distributed=False`` trains this rank's model alone (e.g. one MAP point
    per rank).

    ``cfg.amp`` runs the forward passes under autocast (bf16, or fp16 with a
    GradScaler); the loss, KD term included, is computed in fp32 (or wider).
    Each step is `forward_loss` and `optimisation_step`, which
    other training loops (gate-taylor's gate phase) share.
    """
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler

    distributed = dist.active() if distributed is None else (distributed and dist.active())
    rank, world = (dist.rank(), dist.world()) if distributed else (0, 1)
    device = devices.resolve(cfg.device)
    amp = devices.resolve_amp(cfg.amp, device)
    devices.place(model, device)
    if teacher is not None:
        devices.place(teacher, device).eval()
    scaler = grad_scaler(device, amp)
    source = data if hasattr(data, "epoch") else ClassificationSource(data)
    steps_per_epoch = source.steps_per_epoch(cfg)
    total = max(1, cfg.epochs * steps_per_epoch)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = CosineLRScheduler(optimizer, t_initial=total, warmup_t=cfg.warmup_epochs * steps_per_epoch,
                                  warmup_lr_init=cfg.lr * 0.01, lr_min=cfg.lr * 0.01, t_in_epochs=False)
    folder = Path(checkpoint_dir) if checkpoint_dir else None
    start_epoch, history = 0, []
    if folder is not None and resume:
        ckpt = _load_checkpoint(folder)
        current = {**(resume_key or {}), "training settings": cfg.to_dict()}
        stored = {**(ckpt or {}).get("key", {}), "training settings": (ckpt or {}).get("config")}
        if ckpt is not None and reusable(stored, current, f"the fine-tune checkpoint in {folder}", log):
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            if ckpt.get("scaler"):
                scaler.load_state_dict(ckpt["scaler"])
            start_epoch, history = ckpt["epoch"], list(ckpt["history"])
            log(f"resume: {desc} continues after epoch {start_epoch} of {cfg.epochs}, from the checkpoint in "
                f"{folder} saved {made_when([ckpt], 'saved_at')}")
    net = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        dist.broadcast_module(model)
        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    # disable=None: tqdm shows itself on a terminal only, so logs stay readable
    bar = tqdm(range(start_epoch, cfg.epochs), desc=desc, disable=None if progress and rank == 0 else True, leave=False,
               dynamic_ncols=True, initial=start_epoch, total=cfg.epochs)
    for epoch in bar:
        model.train()
        seed = cfg.seed * 100_003 + epoch
        torch.manual_seed(seed)
        epoch_loss, t0 = torch.zeros(2, dtype=torch.float64), time.time()
        for step, (batch, share, whole) in enumerate(source.epoch(cfg, seed, rank, world, device, distributed)):
            loss = source.loss(net, batch, teacher, cfg, device, amp)
            try:
                stepped = optimisation_step(share_weighted(loss, share, whole, world), [optimizer], scaler, device,
                                            distributed)
            except NonFiniteLoss as exc:
                where = f"; the last good checkpoint is {_checkpoint_path(folder)}" if folder and epoch else ""
                raise HetpruneError(f"{desc}: loss became {exc.value} at epoch {epoch + 1}, step {step + 1} "
                                    f"(lr {optimizer.param_groups[0]['lr']:.2e}); stopped{where}. "
                                    "Lower the learning rate or check the data.") from None
            scheduler.step_update(epoch * steps_per_epoch + step + 1)
            if stepped and share:   # an fp16 overflow the GradScaler skipped adds no inf to the epoch's loss
                epoch_loss[0] += loss.item() * share
                epoch_loss[1] += share
        if distributed:
            epoch_loss = dist.sum_tensor(epoch_loss.to(device)).cpu()
        metrics = {"epoch": epoch + 1, "loss": float(epoch_loss[0] / max(1.0, float(epoch_loss[1]))),
                   "seconds": round(time.time() - t0, 2)}
        if eval_each_epoch:
            metrics["accuracy"] = source.evaluate(model, cfg, device, amp, distributed)
        history.append(metrics)
        bar.set_postfix({k: round(v, 4) for k, v in metrics.items() if k in ("loss", "accuracy")})
        if folder is not None:
            _save_checkpoint(folder, model, optimizer, scheduler, epoch + 1, history, cfg, scaler, resume_key)
            if distributed:
                dist.barrier()
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, metrics)
    model.eval()
    return history
