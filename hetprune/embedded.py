"""The embedded default base model: a small timm ViT trained on scikit-learn's
digits once, then read from the cache (no download anywhere)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from . import distributed as dist
from .cache import cache_dir, fingerprint
from .data import digits, loader
from .io import load_weights, read_json, save_weights, write_json_atomic
from .models import DIGITS_SPEC, ModelSpec, build, load_state_into
from .train import TrainConfig, evaluate, train

DIGITS_TRAINING = dict(epochs=30, lr=1e-3, batch_size=32, weight_decay=0.05, seed=0)


def digits_model(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None, progress: bool = True,
                 log=print, device: str = "cpu") -> nn.Module:
    """The embedded default base model: trained on digits once (on ``device``), then read from the cache."""
    folder = digits_model_folder(spec, training)
    training = {**DIGITS_TRAINING, **(training or {})}
    weights = folder / "model.safetensors"
    if dist.active() and not weights.is_file():
        # rank 0 trains the base model alone; the others wait, then read the cache
        if dist.is_main():
            digits_model(spec, training, progress, log, device)
        dist.barrier()
    model = build(spec)
    if weights.is_file():
        load_state_into(model, load_weights(weights), f"cached base model {weights}")
        return model.eval()
    log(f"training the embedded base model (digits, {training['epochs']} epochs; cached in {folder}) ...")
    torch.manual_seed(training["seed"])
    model = build(spec)
    data = digits()
    cfg = TrainConfig(epochs=training["epochs"], lr=training["lr"], batch_size=training["batch_size"],
                      weight_decay=training["weight_decay"], seed=training["seed"], kd="none", warmup_epochs=2,
                      device=device)
    start = time.time()
    train(model, data, cfg, progress=progress, desc="base model", distributed=False)
    acc = evaluate(model, loader(data.val, 256, shuffle=False), device)
    model.cpu()  # the cached weights, and the model returned, are the same wherever it was trained
    save_weights(weights, model)
    write_json_atomic(folder / "meta.json", {"spec": spec.to_dict(), "training": training, "val_top1": acc,
                                             "seconds": round(time.time() - start, 1), "device": str(device)})
    log(f"base model: val top-1 {acc:.2f}% after {time.time() - start:.0f}s")
    return model.eval()


def digits_model_folder(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None) -> Path:
    """The cache folder of the embedded base model, keyed by its settings and data pipeline."""
    training = {**DIGITS_TRAINING, **(training or {})}
    key = fingerprint({"spec": spec.to_dict(), "training": training, "v": 2})
    return cache_dir() / "base" / f"digits-{key}"


def digits_model_info(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None) -> dict | None:
    meta = digits_model_folder(spec, training) / "meta.json"
    return read_json(meta) if meta.is_file() else None
