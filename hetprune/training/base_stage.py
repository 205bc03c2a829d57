"""The dense base hetprune makes before pruning (``--base scratch | finetune``): a model trained on the user's
own folder, with the very transforms, split and augmentation the pruning run uses, so nobody writes a training
script whose preprocessing has to match hetprune's.

A base is stored like the embedded ones: in the cache (``~/.cache/hetprune/base/NAME-KEY``), under a key made
from everything that shapes it (the architecture, the weights training starts from, the data's fingerprint, the
``base_scratch`` or ``base_finetune`` schedule). A second run with the same inputs reads it instead of training it; a run whose inputs differ
trains another; an interrupted one continues from its checkpoint (it is keyed, so continuing is always right).
Training runs on every rank under torchrun, as a fine-tune does; rank 0 writes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..core import distributed as dist
from ..core.config import BASE_SCHEDULES, TrainConfig
from ..core.errors import HetpruneError
from ..core.io import cache_dir, load_weights, read_json, save_weights, write_json_atomic
from ..core.keys import fingerprint
from ..model.spec import ModelSpec, load_state_into, model_hash
from .bundle import DataBundle
from .loaders import seed_everything
from .resume import now
from .train import evaluate_dataset, train

MODES = tuple(BASE_SCHEDULES)   # --base: trained from random weights, or a pretrained model fine-tuned
SEED = 0   # a base is the same whatever the run's seed: seeds vary the pruning, not the model it starts from
# schedule fields that shape no base: how many loader processes, how often the loss is checked or a checkpoint saved
UNSHAPING = ("workers", "check_every", "save_every_steps")


@dataclass(frozen=True)
class BaseRequest:
    """What shapes a base hetprune makes: how (``mode``), the architecture, the weights training starts from
    (their hash, and where they came from in words), the data (its fingerprint: files, transforms, augmentation,
    selection split) and the schedule (sized, seeded `SEED`, on the run's device and precision)."""

    mode: str
    spec: ModelSpec
    weights: str
    source: str
    data: str
    schedule: TrainConfig

    def __post_init__(self):
        if self.mode not in MODES:
            raise HetpruneError(f"--base is one of {', '.join(MODES)} (scratch: train the model from random "
                                f"weights; finetune: fine-tune pretrained weights with a new head), not {self.mode!r}")

    def inputs(self) -> dict:
        """Every input that shapes the base, by name: what its key hashes and what a changed base is told by."""
        section = BASE_SCHEDULES[self.mode]
        schedule = {f"{section}.{k}": v for k, v in self.schedule.as_settings().items() if k not in UNSHAPING}
        return {"mode": self.mode, "model": self.spec.to_dict(), "starts from": self.weights, "data": self.data,
                "precision": self.schedule.amp, **schedule}

    def key(self) -> str:
        return fingerprint({"base": self.inputs(), "v": 1})

    def folder(self) -> Path:
        """Where this base lives in the cache: named by the model and the key."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.spec.name).strip("-") or "model"
        return cache_dir() / "base" / f"{name}-{self.key()}"


def request_for(mode: str, spec: ModelSpec, model: nn.Module, source: str, data: DataBundle,
                schedule: TrainConfig) -> BaseRequest:
    """The request for a base of ``model`` (the weights it starts from, made where ``source`` says) on ``data``:
    ``schedule`` (the run's ``base_scratch`` or ``base_finetune``, by ``mode``) sized by the training split's size
    (``image_passes``) and seeded `SEED`."""
    if mode not in MODES:
        raise HetpruneError(f"--base is one of {', '.join(MODES)}, not {mode!r}")
    if mode == "finetune" and source.startswith("random"):
        raise HetpruneError("--base finetune fine-tunes pretrained weights: give --pretrained (timm's hub, or a "
                            "local weights file: --pretrained FILE), or train from random weights with --base "
                            "scratch")
    if mode == "scratch" and not source.startswith("random"):
        raise HetpruneError(f"--base scratch trains the model from random weights, but it was given weights "
                            f"({source}): drop them, or fine-tune them with --base finetune")
    sized = replace(schedule.sized(len(data.train), BASE_SCHEDULES[mode]), seed=SEED)
    return BaseRequest(mode, spec, model_hash(model), source, data.fingerprint, sized)


@dataclass
class BasePlan:
    """What making a base costs, for ``--plan``: nothing where it is stored already."""

    cached: bool
    what: str
    train_images: int
    eval_images: int


def plan_base(request: BaseRequest, data: DataBundle) -> BasePlan:
    cfg, folder = request.schedule, request.folder()
    if (folder / "model.safetensors").is_file():
        return BasePlan(True, f"stored: {folder}", 0, 0)
    per = cfg.epoch_images(len(data.train))
    held = len(data.selection) if data.selection is not None else len(data.val)
    evals = (cfg.epochs // cfg.eval_every + (1 if cfg.epochs % cfg.eval_every else 0)) if cfg.eval_every else 0
    return BasePlan(False, f"{cfg.epochs} epochs x {per:,} images, batch {cfg.batch_size}, lr {cfg.lr:g}",
                    cfg.epochs * per, evals * held + len(data.val) + (held if data.selection is not None else 0))


def make_base(model: nn.Module, data: DataBundle, request: BaseRequest, log: Callable[[str], None] = print,
              progress: bool = True) -> dict:
    """Train ``model`` in place into the base ``request`` describes, or read it from the cache where it was made
    before; returns its record (how it was made, its top-1 on val and on the selection split, its folder)."""
    folder = request.folder()
    weights, meta = folder / "model.safetensors", folder / "meta.json"
    trained = dist.on_main(lambda: not weights.is_file())   # rank 0 decides; every rank follows
    if trained:
        _train(model, data, request, folder, log, progress)
    dist.agree(None if weights.is_file() else f"it finds no {weights}, which rank 0 has", "the base model")
    load_state_into(model, load_weights(weights), f"the stored base model {weights}")
    record = read_json(meta, "base model record")
    if record.get("key") != request.key():
        raise HetpruneError(f"the base model record {meta} is for another key ({record.get('key')}): delete {folder} "
                            "to make the base again")
    if not trained and dist.is_main():
        log(f"base model: the one made {record.get('made_at', '?')} from the same model, weights, data and base "
            f"schedule (val top-1 {record['val_top1']:.2f}%), read from {folder}")
    return record


def _train(model: nn.Module, data: DataBundle, request: BaseRequest, folder: Path, log, progress: bool) -> None:
    cfg = request.schedule
    how = "training it from random weights" if request.mode == "scratch" else "fine-tuning the pretrained weights"
    if dist.is_main():
        log(f"base model: {how} on {len(data.train):,} images, {cfg.epochs} epochs (stored in {folder}; an "
            "interrupted run continues where it stopped)")
    started = time.time()
    seed_everything(SEED)
    train(model, data, cfg, checkpoint_dir=folder / "work", resume=True, resume_key={"base": request.key()},
          progress=progress and dist.is_main(), desc="base model", log=log if dist.is_main() else lambda m: None)
    val = evaluate_dataset(model, data.val, cfg.device, amp=cfg.amp)
    selection = evaluate_dataset(model, data.selection, cfg.device, amp=cfg.amp) if data.selection is not None \
        else None
    if dist.is_main():
        import timm

        model_cpu = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        save_weights(folder / "model.safetensors", model_cpu)
        write_json_atomic(folder / "meta.json", {
            "key": request.key(), "mode": request.mode, "model": request.spec.to_dict(), "source": request.source,
            "inputs": request.inputs(), "data": {"name": data.name, "train": len(data.train), "val": len(data.val),
                                                 "selection": len(data.selection) if data.selection is not None else 0,
                                                 "fingerprint": data.fingerprint},
            "val_top1": val, "selection_top1": selection, "seconds": round(time.time() - started, 1),
            "device": str(cfg.device), "world": dist.world(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "timm": timm.__version__, "made_at": now()})
        checkpoint = folder / "work" / "finetune-checkpoint.pt"   # hetprune's own, needed no more
        checkpoint.unlink(missing_ok=True)
        if (folder / "work").is_dir() and not any((folder / "work").iterdir()):
            (folder / "work").rmdir()
        sel = "" if selection is None else f", selection top-1 {selection:.2f}%"
        log(f"base model: val top-1 {val:.2f}%{sel} after {time.time() - started:.0f}s")
    dist.barrier()


def base_info(record: dict, folder: Path) -> dict:
    """The dense model's provenance in a run's report and results: where the base came from and how it did."""
    how = "trained from random weights" if record["mode"] == "scratch" else f"fine-tuned from {record['source']}"
    return {"source": f"base made by hetprune ({how})", "top1": record["val_top1"],
            "weights": f"made by hetprune, stored in {folder}",
            "base": {k: record[k] for k in ("key", "mode", "source", "inputs", "val_top1", "selection_top1",
                                             "made_at") if k in record}}
