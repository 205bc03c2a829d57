"""The bundle: a data set as hetprune carries it (`DataBundle`), with a train, a val and a selection split and
a fingerprint, so resumable state (MAP points, compare rows) is keyed by the data it was measured on.

The data sets themselves: `hetprune.training.embedded_data` (built from scikit-learn's digits, ``--data
NAME``) and `hetprune.training.image_folders` (ImageFolder trees); `hetprune.training.data.load_data` loads
either.
"""

from __future__ import annotations

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

    def describe(self) -> dict:
        return {
            "name": self.name,
            "train": len(self.train),
            "val": len(self.val),
            **({"selection": len(self.selection)} if self.selection is not None else {}),
            "num_classes": self.num_classes,
            "fingerprint": self.fingerprint,
            **({"augment": self.augment} if self.augment else {}),
        }


def _selection_size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HetpruneError(f"the selection split's size must be a whole number of items >= 0 (0: none), "
                            f"got {value!r}")
    return value



def example_batch(data: DataBundle, n: int = 8) -> torch.Tensor:
    """A few validation images, for exactness checks and cost counting."""
    items = [data.val[i][0] for i in range(min(n, len(data.val)))]
    return torch.stack(items)
