"""Data: the embedded digits set (ships with scikit-learn) and ImageFolder trees.

Every data set comes as a :class:`DataBundle` with a train and a val split and
a fingerprint, so resumable state (MAP points, compare rows) is keyed by the
data it was measured on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from .cache import fingerprint
from .errors import HetpruneError

DIGITS = "digits"


@dataclass
class DataBundle:
    name: str
    train: Dataset
    val: Dataset
    num_classes: int
    in_chans: int
    img_size: int
    fingerprint: str
    # batch-level augmentation applied to training batches (tensor in, tensor out)
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = field(default=None, repr=False)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "train": len(self.train),
            "val": len(self.val),
            "num_classes": self.num_classes,
            "fingerprint": self.fingerprint,
        }


def random_shift(pixels: int):
    """Batch augmentation: shift every image by up to ``pixels`` in x and y (zero fill)."""

    def shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if pixels <= 0:
            return x
        b, _, h, w = x.shape
        padded = F.pad(x, (pixels, pixels, pixels, pixels))
        dx = torch.randint(0, 2 * pixels + 1, (b,), generator=gen)
        dy = torch.randint(0, 2 * pixels + 1, (b,), generator=gen)
        out = torch.empty_like(x)
        for i in range(b):
            out[i] = padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
        return out

    return shift


def digits(img_size: int = 16, val_size: int = 450, seed: int = 0, shift: int = 2) -> DataBundle:
    """scikit-learn's 8x8 digits, upscaled to ``img_size``, stratified train/val split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    images = torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(img_size, img_size), mode="bilinear", align_corners=False)
    images = (images - 0.5) / 0.5
    labels = torch.tensor(raw.target, dtype=torch.long)
    idx = np.arange(len(labels))
    train_idx, val_idx = train_test_split(idx, test_size=val_size, stratify=raw.target, random_state=seed)
    train = TensorDataset(images[train_idx], labels[train_idx])
    val = TensorDataset(images[val_idx], labels[val_idx])
    fp = fingerprint({"data": DIGITS, "img_size": img_size, "val_size": val_size, "seed": seed, "shift": shift})
    return DataBundle(DIGITS, train, val, 10, 1, img_size, fp, augment=random_shift(shift))


def image_folder(path: str | Path, model: torch.nn.Module) -> DataBundle:
    """``PATH/train/<class>/*`` and ``PATH/val/<class>/*`` with timm's transforms for ``model``."""
    from timm.data import create_transform, resolve_data_config
    from torchvision.datasets import ImageFolder

    root = Path(path)
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise HetpruneError(
                f"--data {root}: no {split}/ folder; expected {root}/train/<class>/*.jpg and {root}/val/<class>/*"
            )
    cfg = resolve_data_config({}, model=model)
    train = ImageFolder(str(root / "train"), transform=create_transform(**cfg, is_training=True))
    val = ImageFolder(str(root / "val"), transform=create_transform(**cfg, is_training=False))
    if train.classes != val.classes:
        raise HetpruneError(f"--data {root}: train/ and val/ have different class folders")
    files = sorted(str(Path(p).relative_to(root)) for p, _ in train.samples + val.samples)
    fp = fingerprint({"data": str(root.resolve()), "files": files, "cfg": cfg})
    return DataBundle(str(root), train, val, len(train.classes), cfg["input_size"][0], cfg["input_size"][1], fp)


def load_data(spec: str, model: torch.nn.Module | None = None, seed: int = 0) -> DataBundle:
    if spec == DIGITS:
        return digits(seed=seed)
    if model is None:
        raise HetpruneError("an ImageFolder data set needs the model to resolve its transforms")
    return image_folder(spec, model)


def subset(dataset: Dataset, n: int | None, seed: int) -> Dataset:
    """A seeded random subset of ``n`` items (all of them when ``n`` is None or too large)."""
    if n is None or n >= len(dataset):
        return dataset
    if n <= 0:
        raise HetpruneError(f"a subset needs at least one item, got {n}")
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(dataset), generator=gen)[:n].tolist()
    return Subset(dataset, sorted(idx))


def loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int = 0, workers: int = 0) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=gen, num_workers=workers,
                      drop_last=False)


def example_batch(data: DataBundle, n: int = 8) -> torch.Tensor:
    """A few validation images, for exactness checks and cost counting."""
    items = [data.val[i][0] for i in range(min(n, len(data.val)))]
    return torch.stack(items)
