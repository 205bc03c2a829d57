"""The data modules' names in keys (issue 59, item 5: hetprune/training/data.py is split by concern): a key
that names one of their classes or functions must not move when it moves."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from hetprune.core import aliases
from hetprune.training import data
from hetprune.training.task import Task

# what a user Task whose code closes over hetprune's data objects was keyed as before the split (at aec6af4)
KEY_BEFORE_THE_SPLIT = "c585c7c9b30021c9"


def user_task() -> Task:
    """A Task whose loss and metric close over a bundle, a sampler, augmenting data sets and hetprune's
    loader and data set functions: their names (and the functions' source) are in its key."""
    images, labels = torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)
    bundle = data.DataBundle("mine", TensorDataset(images, labels), TensorDataset(images, labels), 2, 1, 8, "f")
    sampler = data.GlobalBatchSampler(4, 2, seed=0)
    shifted = data.ShiftedImages(images, labels, 1)
    seeded = data.SeededItems(TensorDataset(images, labels))
    items = data.EpochItems(shifted)
    read = (data.loader, data.subset, data.digits, data.image_folder)

    def loss(model, batch):
        assert bundle is not None and sampler is not None and shifted is not None and read
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    def metric(model, batches):
        assert seeded is not None and items is not None
        return 1.0

    batches = [(images, labels)]
    return Task(batches, batches, loss=loss, metric=metric, metric_name="top1", fingerprint="data")


def test_a_user_task_that_closes_over_data_objects_keeps_its_key():
    assert user_task().key == KEY_BEFORE_THE_SPLIT
