"""The embedded base models: a small timm ViT per embedded data set (scikit-learn's
digits, and digit pairs and the digit grid built from them).

Their weights ship inside the package (``hetprune/weights/``, made by
``scripts/train_embedded.py``) and are read after their SHA-256 is checked
against ``weights/embedded.json``, which also says how they were made: a first
run trains nothing. A different spec or schedule, or ``retrain=True``, trains
a model here once and keeps it in the cache; training is deterministic for a
given thread count, so a retrain with the shipped settings on the thread count
the index records gives the shipped weights (no download anywhere).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..core import distributed as dist
from ..core.keys import fingerprint, found
from .bundle import DataBundle
from .embedded_data import DIGIT_PAIRS, DIGITS, digit_pairs, digits
from .loaders import loader
from .digit_grid import DIGIT_GRID, DIGIT_GRID_TRAINING, digit_grid
from ..core.errors import HetpruneError
from ..core.io import cache_dir, file_sha256, load_weights, read_json, save_weights, write_json_atomic
from ..model.spec import DIGIT_GRID_SPEC, DIGIT_PAIRS_SPEC, DIGITS_SPEC, ModelSpec, build, load_state_into
from .train import TrainConfig, evaluate, train

DIGITS_TRAINING = dict(epochs=30, lr=1e-3, batch_size=32, weight_decay=0.05, seed=0)
DIGIT_PAIRS_TRAINING = dict(epochs=30, lr=2e-3, batch_size=64, weight_decay=0.05, seed=0, warmup_epochs=2)
SHIPPED = Path(__file__).resolve().parent.parent / "weights"
SHIPPED_INDEX = SHIPPED / "embedded.json"


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
    DIGIT_GRID: EmbeddedBenchmark(DIGIT_GRID, DIGIT_GRID_SPEC, DIGIT_GRID_TRAINING, digit_grid, {"data": DIGIT_GRID}),
}


def benchmark(name: str) -> EmbeddedBenchmark:
    if name not in BENCHMARKS:
        raise HetpruneError(f"no embedded data set named {name!r}; allowed: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def shipped_entry(name: str, spec: ModelSpec | None = None, training: dict | None = None) -> dict | None:
    """The index entry of the shipped weights for this request, or None when the package ships none for
    it (another spec or schedule than the shipped model's)."""
    bench = benchmark(name)
    entry = (read_json(SHIPPED_INDEX) if SHIPPED_INDEX.is_file() else {}).get(name)
    if entry is None or (spec or bench.spec).to_dict() != entry["spec"]:
        return None
    if bench.settings(training) != entry["training"]:
        return None
    return entry


def shipped_weights(entry: dict) -> Path:
    """The shipped weights file of an index entry, after checking its SHA-256 (a changed or truncated file
    is an error, never a silently different base model)."""
    path = SHIPPED / entry["file"]
    if not path.is_file():
        raise HetpruneError(f"the package's weights file {path} is missing (a broken install?); reinstall "
                            "hetprune, or pass retrain=True (CLI: --retrain-base) to train the model here")
    digest = file_sha256(path)
    if digest != entry["sha256"]:
        raise HetpruneError(f"the package's weights file {path} has SHA-256 {digest[:16]}…, not the "
                            f"{entry['sha256'][:16]}… that {SHIPPED_INDEX.name} records; reinstall hetprune, or "
                            "pass retrain=True (CLI: --retrain-base) to train the model here")
    return path


def embedded_model(name: str = DIGITS, spec: ModelSpec | None = None, training: dict | None = None,
                   progress: bool = True, log=print, device: str = "cpu", retrain: bool = False) -> nn.Module:
    """The embedded base model of data set ``name``: the shipped weights when the package has them for this
    spec and schedule (and not ``retrain``), else trained once (on ``device``) and read from the cache."""
    bench = benchmark(name)
    spec = spec or bench.spec
    entry = None if retrain else shipped_entry(name, spec, training)
    if entry is not None:
        model = build(spec)
        path = shipped_weights(entry)
        load_state_into(model, load_weights(path), f"shipped base model {path}")
        return model.eval()
    folder = embedded_model_folder(name, spec, training)
    weights = folder / "model.safetensors"
    if not dist.active() and not weights.is_file():
        return train_embedded(bench, spec, training, folder, progress, log, device)
    if dist.on_main(lambda: not weights.is_file()):   # rank 0 decides, trains alone; the others wait, then read
        if dist.is_main():
            train_embedded(bench, spec, training, folder, progress, log, device)
        dist.barrier()
    dist.agree(None if weights.is_file() else f"it finds no {weights}, which rank 0 has", "the embedded base model")
    model = build(spec)
    load_state_into(model, load_weights(weights), f"cached base model {weights}")
    return model.eval()


def train_embedded(bench: EmbeddedBenchmark, spec: ModelSpec, training: dict | None, folder: Path,
                   progress: bool = True, log=print, device: str = "cpu") -> nn.Module:
    """Train an embedded base model in this process and keep it in ``folder`` (the cache)."""
    training = bench.settings(training)
    weights = folder / "model.safetensors"
    log(f"training the embedded base model ({bench.name}, {training['epochs']} epochs; cached in {folder}) ...")
    torch.manual_seed(training["seed"])
    model = build(spec)
    data = bench.data(selection=0)   # the whole training pool, as the shipped models were trained
    cfg = TrainConfig(epochs=training["epochs"], lr=training["lr"], batch_size=training["batch_size"],
                      weight_decay=training["weight_decay"], seed=training["seed"], kd="none",
                      warmup_epochs=training.get("warmup_epochs", 2), device=device)
    start = time.time()
    train(model, data, cfg, progress=progress, desc="base model", distributed=False)
    acc = evaluate(model, loader(data.val, 256, shuffle=False), device)
    model.cpu()  # the cached weights, and the model returned, are the same wherever it was trained
    save_weights(weights, model)
    write_json_atomic(folder / "meta.json", {"data": bench.name, "spec": spec.to_dict(), "training": training,
                                             "val_top1": acc, "seconds": round(time.time() - start, 1),
                                             "device": str(device), "threads": torch.get_num_threads(),
                                             "torch": torch.__version__})
    log(f"base model: val top-1 {acc:.2f}% after {time.time() - start:.0f}s")
    return model.eval()


def embedded_model_folder(name: str = DIGITS, spec: ModelSpec | None = None, training: dict | None = None) -> Path:
    """The cache folder of a retrained embedded base model, keyed by its settings and data pipeline."""
    bench = benchmark(name)
    spec = spec or bench.spec
    key = fingerprint({"spec": spec.to_dict(), "training": bench.settings(training), "v": 2, **bench.key_extra})
    return found(cache_dir() / "base" / f"{name}-{key}", cache_dir() / "base" / f"{name}-{key.before}")


def embedded_model_info(name: str = DIGITS, spec: ModelSpec | None = None, training: dict | None = None,
                        retrain: bool = False) -> dict | None:
    """What `embedded_model` returns was made from: the shipped index entry (with ``"shipped": True``)
    or the cached model's meta.json; None before a retrained model exists."""
    entry = None if retrain else shipped_entry(name, spec, training)
    if entry is not None:
        return {**entry, "shipped": True}
    meta = embedded_model_folder(name, spec, training) / "meta.json"
    return read_json(meta) if meta.is_file() else None

