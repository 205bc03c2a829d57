"""The embedded base models: a small timm ViT per embedded data set (scikit-learn's
digits, and digit pairs built from them), trained once, then read from the cache
(no download anywhere)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from . import distributed as dist
from .cache import cache_dir, fingerprint
from .data import DIGIT_PAIRS, DIGITS, DataBundle, digit_pairs, digits, loader
from .errors import HetpruneError
from .io import load_weights, read_json, save_weights, write_json_atomic
from .models import DIGIT_PAIRS_SPEC, DIGITS_SPEC, ModelSpec, build, load_state_into
from .train import TrainConfig, evaluate, train

DIGITS_TRAINING = dict(epochs=30, lr=1e-3, batch_size=32, weight_decay=0.05, seed=0)
DIGIT_PAIRS_TRAINING = dict(epochs=30, lr=2e-3, batch_size=64, weight_decay=0.05, seed=0, warmup_epochs=2)


@dataclass(frozen=True)
class EmbeddedBenchmark:
    """An embedded data set with the spec and training schedule of its base model."""

    name: str
    spec: ModelSpec
    training: dict = field(hash=False)
    data: Callable[[], DataBundle] = field(hash=False)
    key_extra: dict = field(default_factory=dict, hash=False)  # what else keys its cache folder

    def settings(self, training: dict | None) -> dict:
        return {**self.training, **(training or {})}


BENCHMARKS = {
    DIGITS: EmbeddedBenchmark(DIGITS, DIGITS_SPEC, DIGITS_TRAINING, digits),
    DIGIT_PAIRS: EmbeddedBenchmark(DIGIT_PAIRS, DIGIT_PAIRS_SPEC, DIGIT_PAIRS_TRAINING, digit_pairs,
                                   {"data": DIGIT_PAIRS}),
}


def benchmark(name: str) -> EmbeddedBenchmark:
    if name not in BENCHMARKS:
        raise HetpruneError(f"no embedded data set named {name!r}; allowed: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def embedded_model(name: str = DIGITS, spec: ModelSpec | None = None, training: dict | None = None,
                   progress: bool = True, log=print, device: str = "cpu") -> nn.Module:
    """The embedded base model of data set ``name``: trained once (on ``device``), then read from the cache."""
    bench = benchmark(name)
    spec = spec or bench.spec
    folder = embedded_model_folder(name, spec, training)
    training = bench.settings(training)
    weights = folder / "model.safetensors"
    if dist.active() and not weights.is_file():
        # rank 0 trains the base model alone; the others wait, then read the cache
        if dist.is_main():
            embedded_model(name, spec, training, progress, log, device)
        dist.barrier()
    model = build(spec)
    if weights.is_file():
        load_state_into(model, load_weights(weights), f"cached base model {weights}")
        return model.eval()
    log(f"training the embedded base model ({name}, {training['epochs']} epochs; cached in {folder}) ...")
    torch.manual_seed(training["seed"])
    model = build(spec)
    data = bench.data()
    cfg = TrainConfig(epochs=training["epochs"], lr=training["lr"], batch_size=training["batch_size"],
                      weight_decay=training["weight_decay"], seed=training["seed"], kd="none",
                      warmup_epochs=training.get("warmup_epochs", 2), device=device)
    start = time.time()
    train(model, data, cfg, progress=progress, desc="base model", distributed=False)
    acc = evaluate(model, loader(data.val, 256, shuffle=False), device)
    model.cpu()  # the cached weights, and the model returned, are the same wherever it was trained
    save_weights(weights, model)
    write_json_atomic(folder / "meta.json", {"data": name, "spec": spec.to_dict(), "training": training,
                                             "val_top1": acc, "seconds": round(time.time() - start, 1),
                                             "device": str(device)})
    log(f"base model: val top-1 {acc:.2f}% after {time.time() - start:.0f}s")
    return model.eval()


def embedded_model_folder(name: str = DIGITS, spec: ModelSpec | None = None, training: dict | None = None) -> Path:
    """The cache folder of an embedded base model, keyed by its settings and data pipeline."""
    bench = benchmark(name)
    spec = spec or bench.spec
    key = fingerprint({"spec": spec.to_dict(), "training": bench.settings(training), "v": 2, **bench.key_extra})
    return cache_dir() / "base" / f"{name}-{key}"


def embedded_model_info(name: str = DIGITS, spec: ModelSpec | None = None, training: dict | None = None) -> dict | None:
    meta = embedded_model_folder(name, spec, training) / "meta.json"
    return read_json(meta) if meta.is_file() else None


def digits_model(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None, progress: bool = True,
                 log=print, device: str = "cpu") -> nn.Module:
    """The embedded default base model (digits); see :func:`embedded_model`."""
    return embedded_model(DIGITS, spec, training, progress, log, device)


def digits_model_folder(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None) -> Path:
    return embedded_model_folder(DIGITS, spec, training)


def digits_model_info(spec: ModelSpec = DIGITS_SPEC, training: dict | None = None) -> dict | None:
    return embedded_model_info(DIGITS, spec, training)
