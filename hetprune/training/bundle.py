"""The bundle: a data set as hetprune carries it (`DataBundle`), with a train, a val and a selection split and
a fingerprint, so resumable state (MAP points, compare rows) is keyed by the data it was measured on.

The data sets themselves: `hetprune.training.embedded_data` (built from scikit-learn's digits, ``--data
NAME``) and `hetprune.training.image_folders` (ImageFolder trees); `hetprune.training.data.load_data` loads
either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from ..core.errors import HetpruneError


@dataclass
class DataBundle:
    name: str
    train: Dataset
    val: Dataset
    num_classes: int
    in_chans: int
    img_size: int
    fingerprint: str
    augment: str | None = None   # an ImageFolder's training augmentation (the embedded sets have their own)
    workers: int | None = None   # loader workers when a schedule says 0 (ImageFolder: a share of the CPUs)
    selection: Dataset | None = None   # held out of ``train``: every choice a strategy makes is measured on it
    data_config: dict | None = None    # an ImageFolder's timm data config: how its files become the model's input

    def describe(self) -> dict:
        return {
            "name": self.name,
            "train": len(self.train),
            "val": len(self.val),
            **({"selection": len(self.selection)} if self.selection is not None else {}),
            "num_classes": self.num_classes,
            "fingerprint": self.fingerprint,
            **({"augment": self.augment} if self.augment else {}),
            **({"data_config": self.data_config} if self.data_config else {}),
        }

    def reading(self) -> str | None:
        """How an ImageFolder's files become the model's input, in one line (what a checkpoint trained elsewhere
        must have been trained on): mode, size, interpolation, crop and normalisation."""
        cfg = self.data_config
        if not cfg:
            return None
        c, h, w = cfg["input_size"]
        mean, std = ", ".join(f"{v:g}" for v in cfg["mean"]), ", ".join(f"{v:g}" for v in cfg["std"])
        return (f"images read as {'L (grayscale)' if c == 1 else 'RGB'} at {h} x {w} (the model's own input size), "
                f"{cfg['interpolation']}, validation images resized to {math.floor(h / cfg['crop_pct'])} px (crop_pct "
                f"{cfg['crop_pct']:g}) then centre-cropped, normalised with mean ({mean}) and std ({std}): timm's data "
                "config of the model")


def _selection_size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HetpruneError(f"the selection split's size must be a whole number of items >= 0 (0: none), "
                            f"got {value!r}")
    return value



def example_batch(data: DataBundle, n: int = 8) -> torch.Tensor:
    """A few validation images, for exactness checks and cost counting."""
    items = [data.val[i][0] for i in range(min(n, len(data.val)))]
    return torch.stack(items)
