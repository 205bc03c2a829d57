"""The selection split (issue 43, item 1): every choice a strategy makes is measured on a held-out part of the
training data, never on the val set the result reports."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

import hetprune
from hetprune.core import contract
from hetprune.core.config import RunSettings
from hetprune.core.errors import HetpruneError, ValReadWhileChoosing
from hetprune.harness.testing import ConformanceError, check_strategy
from hetprune.pruning.depth import DepthStrategy
from hetprune.training.data import without_augmentation
from hetprune.training.embedded_data import digit_pairs, digits
from hetprune.training.image_folders import image_folder
from hetprune.training.task import Task, classification


def _rows(images: torch.Tensor) -> set[bytes]:
    return {img.numpy().tobytes() for img in images}


def test_digits_selection_is_held_out_of_training_and_apart_from_val():
    data = digits()
    pool = digits(selection=0)
    sel = data.selection.tensors[0]
    assert len(data.selection) == 300 and len(data.train) == len(pool.train) - 300 and len(data.val) == 450
    train, val, held = _rows(data.train.images), _rows(data.val.tensors[0]), _rows(sel)
    assert not held & train and not held & val
    # together they are the old training pool (what the base model was trained on), val unchanged
    assert held | train == _rows(pool.train.images)
    assert torch.equal(data.val.tensors[0], pool.val.tensors[0])
    # stratified: every class is there in about its share
    counts = np.bincount(data.selection.tensors[1].numpy(), minlength=10)
    assert counts.min() >= 25
    # deterministic, and the split size keys the data
    assert torch.equal(digits().selection.tensors[0], sel)
    assert data.fingerprint != pool.fingerprint and digits(selection=200).fingerprint != data.fingerprint
    assert pool.selection is None and "selection" not in pool.describe() and data.describe()["selection"] == 300


def test_digit_pairs_selection_holds_no_training_pair_and_leaves_train_and_val_as_they_were():
    data, pool = digit_pairs(), digit_pairs(selection=0)
    assert len(data.selection) == 1000
    assert torch.equal(data.train.images, pool.train.images) and torch.equal(data.val.tensors[0], pool.val.tensors[0])
    held = _rows(data.selection.tensors[0])
    assert len(held) > 990   # new pairs (a few may repeat among themselves)
    assert not held & _rows(data.train.images) and not held & _rows(data.val.tensors[0])
    # labels are the sum of the two digits, as everywhere else in the set
    assert data.selection.tensors[1].max() <= 18


def test_bad_selection_sizes_are_refused_with_what_is_allowed():
    with pytest.raises(HetpruneError, match="whole number of items >= 0"):
        digits(selection=-1)
    with pytest.raises(HetpruneError, match="leaves no training image"):
        digits(selection=5000)
    with pytest.raises(HetpruneError, match="selection .*whole number of items >= 0"):
        RunSettings.from_dict({"selection": 2.5})
    assert RunSettings.from_dict({"selection": 0}).selection == 0


def _folder(root, per_class: int = 12):
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", 3)):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")
    return root


def test_an_image_folder_holds_a_tenth_of_train_out_read_as_at_inference(tmp_path):
    root = _folder(tmp_path / "imgs")
    model = hetprune.model.spec.build(hetprune.ModelSpec("vit_tiny_patch16_224", dict(
        img_size=16, patch_size=8, num_classes=2, embed_dim=16, depth=1, num_heads=1)))
    data = image_folder(root, model, augment="imagenet", workers=0)
    assert len(data.selection) == 2 and len(data.train) == 22   # a tenth of 24
    held, kept = set(data.selection.indices), set(data.train.dataset.indices)
    assert not held & kept and held | kept == set(range(24))
    # the validation transform: the same item twice is the same tensor (no random crop or flip)
    assert torch.equal(data.selection[0][0], data.selection[0][0])
    assert data.selection.dataset.transform is data.val.transform
    # the same split whatever the run (a fixed seed), none with 0, and the INT8 calibration view still works
    assert set(image_folder(root, model, workers=0).selection.indices) == held
    none = image_folder(root, model, workers=0, selection=0)
    assert none.selection is None and len(none.train) == 24 and none.fingerprint != data.fingerprint
    assert len(without_augmentation(data)) == 22
    # the report counts the split's own images, not the folder it was cut from
    from hetprune.core.plugins import get_registry
    from hetprune.harness.testing import tiny_settings
    from hetprune.pruning.job import PruneJob

    job = PruneJob(dense=model, spec=None, data=data, budget=hetprune.Budget(sites=1), settings=tiny_settings(),
                   registry=get_registry(), workdir=tmp_path / "work", progress=False, log=lambda msg: None)
    assert job.splits() == {"metric": "val", "choices": "selection", "val_items": 6, "selection_items": 2}


def test_reading_val_while_choosing_is_refused_where_a_selection_split_exists(tiny_model):
    task = classification(digits())
    with contract.choosing("the split"):
        with pytest.raises(ValReadWhileChoosing, match="val set of task 'digits' was read while choosing the split"):
            task.evaluate(tiny_model)
        on_selection = task.evaluate(tiny_model, split="selection")
    assert on_selection != task.evaluate(tiny_model)   # outside a choice val is read, and it is another split
    # a task without a selection split has nothing else to measure on: val is read (and the job says so)
    plain = classification(digits(selection=0))
    with contract.choosing("the split"):
        plain.evaluate(tiny_model)
        with pytest.raises(HetpruneError, match="has no selection split"):
            plain.evaluate(tiny_model, split="selection")
    with pytest.raises(HetpruneError, match="split val or selection, not 'test'"):
        task.evaluate(tiny_model, split="test")


def _batches(data, n):
    x, y = data.tensors if isinstance(data, TensorDataset) else (data.images, data.labels)
    return DataLoader(TensorDataset(x[:n], y[:n]), batch_size=32)


def test_a_user_task_takes_a_selection_split_and_its_key_follows_it(tiny_model):
    d = digits()
    loss = lambda model, batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1])  # noqa: E731

    def metric(model, batches):
        right = total = 0
        for x, y in batches:
            right += (model(x).argmax(1) == y).sum().item()
            total += len(y)
        return 100.0 * right / total

    with_sel = Task(_batches(d.train, 64), _batches(d.val, 64), loss, metric, selection=_batches(d.selection, 64))
    without = Task(_batches(d.train, 64), _batches(d.val, 64), loss, metric)
    assert with_sel.choice_split == "selection" and without.choice_split == "val"
    assert with_sel.fingerprint != without.fingerprint
    with contract.choosing("a best epoch"):
        got = with_sel.evaluate(tiny_model, split="selection")
    assert got == pytest.approx(metric(tiny_model.eval(), _batches(d.selection, 64)))
    with pytest.raises(HetpruneError, match="Task selection is an iterator"):
        Task(_batches(d.train, 8), _batches(d.val, 8), loss, metric, selection=iter([1]))


class ValPeeker(DepthStrategy):
    """A strategy that picks its split by trying two on the val set: what the kit must catch."""

    name = "val-peeker"
    description = "tries splits on val"

    def allocate(self, job):
        scores = {}
        for split in ((1, 1), (2, 0)):
            model = copy.deepcopy(job.dense)
            scores[split] = job.evaluate(model)   # the reported set: not allowed while choosing
        return max(scores, key=scores.get), {}


class SelectionPicker(ValPeeker):
    name = "selection-picker"

    def allocate(self, job):
        scores = {split: job.choice_metric(copy.deepcopy(job.dense)) for split in ((1, 1), (2, 0))}
        return max(scores, key=scores.get), {}


def test_the_conformance_kit_fails_a_strategy_that_reads_val_while_choosing():
    with pytest.raises(ConformanceError, match="val set of task 'digits' was read while choosing the split"):
        check_strategy(ValPeeker)
    check_strategy(SelectionPicker)   # the same choice made on the selection split keeps the contract


def test_a_report_says_which_split_each_number_came_from(tmp_path):
    from hetprune.harness.testing import tiny_job

    result = SelectionPicker().run(tiny_job(hetprune.Budget(sites=2), tmp_path))
    assert result.report["splits"] == {"metric": "val", "choices": "selection", "val_items": 450,
                                       "selection_items": 300}
    from hetprune.harness.api import plan_title   # --plan's first line names the three sizes

    assert "(1,047 train / 300 selection / 450 val images)" in plan_title(
        tiny_job(hetprune.Budget(sites=2), tmp_path / "plan"), "hetdpt", "2 sites")


class Unreadable(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        raise AssertionError("the val set was read during a fine-tune")


def test_a_best_epoch_is_chosen_on_the_selection_split(tiny_model):
    from dataclasses import replace

    from hetprune.core.config import TrainConfig
    from hetprune.training.train import ClassificationSource, train

    data = replace(digits(), val=Unreadable())
    cfg = TrainConfig(epochs=2, lr=1e-3, batch_size=32, subset=64, warmup_epochs=0, eval_every=1, keep="best",
                      kd="none")
    history = train(copy.deepcopy(tiny_model), ClassificationSource(data), cfg, progress=False)
    assert [h["split"] for h in history] == ["selection", "selection"]
    assert sum(h.get("reported") == "best" for h in history) == 1
    # without a selection split an epoch is evaluated on val, as before (and says no split)
    plain = train(copy.deepcopy(tiny_model), ClassificationSource(digits(selection=0)), cfg, progress=False)
    assert all("split" not in h for h in plain)
