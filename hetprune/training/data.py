"""Loading data: an embedded data set by name or an ImageFolder root, as a `hetprune.training.bundle.DataBundle`
(`load_data`), and a bundle's training images as the model sees them at inference (`without_augmentation`).

The data's concerns are modules of their own under hetprune/training/: the bundle (`bundle`), the embedded
data sets (`embedded_data`), ImageFolder trees (`image_folders`), the samplers (`samplers`) and the loaders
with their cache (`loaders`). Keys name their classes and functions as they were named here, ``hetprune.data.X``
(`hetprune.core.keys.SPLIT_FROM`).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from ..core.errors import HetpruneError
from .bundle import DataBundle
from .embedded_data import EMBEDDED_BUILDERS, ShiftedImages
from .image_folders import SeededItems, image_folder, plain_copy


def load_data(spec: str, model: torch.nn.Module | None = None, seed: int = 0, augment="light",
              workers: int | None = None, fingerprint_by: str = "sizes", selection: int | None = None,
              reader: str = "hetprune") -> DataBundle:
    """An embedded data set by name (its own fixed augmentation: shifts of a pixel or two), or an ImageFolder
    root (``augment``: see `train_transform`; ``workers``, ``fingerprint_by`` and ``reader``: see `image_folder`).
    ``selection``: the size of the selection split held out of the training data (None: the data set's
    default; 0: none)."""
    if spec in EMBEDDED_BUILDERS:
        return EMBEDDED_BUILDERS[spec](seed=seed, selection=selection)
    if model is None:
        raise HetpruneError("an ImageFolder data set needs the model to resolve its transforms")
    return image_folder(spec, model, augment=augment, workers=workers, fingerprint_by=fingerprint_by,
                        selection=selection, reader=reader)


def without_augmentation(data: DataBundle) -> Dataset:
    """The training images as the model sees them at inference: no random shift (the embedded data sets), the
    validation transform instead of the training one (an ImageFolder). What INT8 calibration reads: ranges
    measured on augmented images would not be those of deployed inputs."""
    train = data.train
    if isinstance(train, ShiftedImages):
        return TensorDataset(train.images, train.labels)
    transform = getattr(data.val, "transform", None)
    inner = train.dataset if isinstance(train, SeededItems) else train
    if transform is None:
        return train
    if isinstance(inner, Subset) and hasattr(inner.dataset, "transform"):   # a folder's selection held out
        return Subset(plain_copy(inner.dataset, transform), inner.indices)
    return plain_copy(inner, transform) if hasattr(inner, "transform") else train
