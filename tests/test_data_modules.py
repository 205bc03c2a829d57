"""hetprune/training/data.py split by concern (issue 59, item 5): the bundle, the embedded data sets, the
ImageFolder data sets, the samplers and the loaders with their cache are modules of their own, and no key moved
with them: key version 1 names their classes and functions as before, ``hetprune.data.<name>``
(`keys.SPLIT_FROM`), so results stored then are found; version 2 names them ``hetprune:<name>``, by no module."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from torch.utils.data import TensorDataset

from hetprune.core import keys
from hetprune.training import bundle as bundles, data, embedded_data, image_folders, loaders, samplers
from hetprune.training.task import Task

SPLIT = [bundles, data, embedded_data, image_folders, loaders, samplers]

# what a user Task whose code closes over hetprune's data objects was keyed as before the split (at aec6af4:
# c585c7c9b30021c9), and under key version 2 (330b818b870e5720); issue 69 changed the source of two functions it
# closes over (image_folder, and default_workers, which loader calls), and a key holds the source of what a user's
# code calls, so it moved then, as it must: these are the keys since, under both versions' naming
KEY_BEFORE_THE_SPLIT = "068aaad399dc7645"
KEY_VERSION_2 = "8c304ea8bff529bc"   # the same task's key under key version 2


def user_task() -> Task:
    """A Task whose loss and metric close over a bundle, a sampler, augmenting data sets and hetprune's
    loader and data set functions: their names (and the functions' source) are in its key."""
    images, labels = torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)
    bundle = bundles.DataBundle("mine", TensorDataset(images, labels), TensorDataset(images, labels), 2, 1, 8, "f")
    sampler = samplers.GlobalBatchSampler(4, 2, seed=0)
    shifted = embedded_data.ShiftedImages(images, labels, 1)
    seeded = image_folders.SeededItems(TensorDataset(images, labels))
    items = samplers.EpochItems(shifted)
    read = (loaders.loader, loaders.subset, embedded_data.digits, image_folders.image_folder)

    def loss(model, batch):
        assert bundle is not None and sampler is not None and shifted is not None and read
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    def metric(model, batches):
        assert seeded is not None and items is not None
        return 1.0

    batches = [(images, labels)]
    return Task(batches, batches, loss=loss, metric=metric, metric_name="top1", fingerprint="data")


def test_a_user_task_that_closes_over_data_objects_keeps_its_key():
    key = user_task().key
    assert key.before == KEY_BEFORE_THE_SPLIT and key == KEY_VERSION_2


def defined_in(module) -> list:
    return [obj for _, obj in inspect.getmembers(module) if (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__]


@pytest.mark.parametrize("module", SPLIT, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_keys_name_what_the_split_moved_as_it_was_named_before(module):
    named = defined_in(module)
    assert named
    for obj in named:
        assert keys.qualified_name(obj).before == f"hetprune.data.{obj.__qualname__}"
        assert keys.qualified_name(obj) == f"hetprune:{obj.__qualname__}"


def test_every_module_split_out_of_data_is_in_the_table():
    """A module added to the split without its entry would key its classes by its own new name."""
    assert sorted(keys.SPLIT_FROM) == sorted(m.__name__ for m in SPLIT if m is not data)
    for module in keys.SPLIT_FROM:
        assert keys.stable_name(module) == "hetprune.data"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_old_path_is_still_the_data_module():
    assert importlib.import_module("hetprune.data") is data
