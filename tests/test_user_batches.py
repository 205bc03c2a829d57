"""A user's own batches (issue 34, items 5-7 and 16): dicts and namedtuples reach the loss and metric as the
user built them, the data's fingerprint sees nested batches, ``subset`` counts items for a list of batches,
and the seed orders a list's batches."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F

import hetprune
from hetprune import Task
from hetprune.core.config import TrainConfig
from hetprune.harness.testing import TINY_SETTINGS

Pair = collections.namedtuple("Pair", "images labels")


def _digits(digits_data, n: int, start: int = 0):
    items = [digits_data.train[i] for i in range(start, start + n)]
    return torch.stack([x for x, _ in items]), torch.tensor([int(y) for _, y in items])


def _dict_task(digits_data, start: int = 0, **kw) -> Task:
    x, y = _digits(digits_data, 64, start)
    batches = [{"pixel_values": x[i:i + 16], "labels": y[i:i + 16]} for i in range(0, 64, 16)]

    def loss(model, batch):
        return F.cross_entropy(model(batch["pixel_values"]), batch["labels"])

    def metric(model, val):
        return float(sum(int((model(b["pixel_values"]).argmax(-1) == b["labels"]).sum()) for b in val))

    return Task(train=batches, val=batches[:1], loss=loss, metric=metric, example=x[:2], **kw)


def test_dict_batches_of_different_data_have_different_fingerprints(digits_data):
    a, a_again, b = _dict_task(digits_data), _dict_task(digits_data), _dict_task(digits_data, start=64)
    assert a.fingerprint == a_again.fingerprint != b.fingerprint
    assert a.fingerprinted


def test_batches_without_a_tensor_are_never_reused_silently(digits_data):
    batches = [{"text": ["a cat", "a dog"]}]
    tasks = [Task(train=batches, val=batches, loss=lambda m, b: torch.zeros(()), metric=lambda m, v: 0.0)
             for _ in range(2)]
    assert not tasks[0].fingerprinted and tasks[0].fingerprint != tasks[1].fingerprint
    assert tasks[0].fingerprint == tasks[0].fingerprint   # one Task keeps one value within its run
    assert Task(train=batches, val=batches, loss=lambda m, b: torch.zeros(()), metric=lambda m, v: 0.0,
                fingerprint="my-data-v1").fingerprinted


def _counting_task(digits_data, seen: list, batch: int = 8, n: int = 22):
    x, y = _digits(digits_data, batch * n)
    batches = [(x[i:i + batch], y[i:i + batch]) for i in range(0, batch * n, batch)]

    def loss(model, b):
        seen.append(int(b[1][0]) * 1000 + int(b[1].sum()))   # which batch this is
        return F.cross_entropy(model(b[0]), b[1])

    return Task(train=batches, val=batches[:1], loss=loss, metric=lambda m, v: 1.0), batches


def test_subset_counts_items_for_a_list_of_batches(tiny_model, digits_data):
    seen = []
    task, _ = _counting_task(digits_data, seen)
    hetprune.training.train.train(tiny_model, task.source(), TrainConfig(epochs=1, subset=20, kd="none"), progress=False)
    assert len(seen) == 3            # 20 items are 3 batches of 8, not 20 of the 22 batches
    seen.clear()
    hetprune.training.train.train(tiny_model, task.source(), TrainConfig(epochs=1, subset=None, kd="none"), progress=False)
    assert len(seen) == 22


def test_the_seed_orders_a_list_of_batches_and_changes_the_pruned_model(tiny_model, digits_data, tmp_path):
    orders = {}
    for seed in (0, 0, 1):
        seen = []
        task, _ = _counting_task(digits_data, seen)
        hetprune.training.train.train(tiny_model, task.source(), TrainConfig(epochs=1, kd="none", seed=seed), progress=False)
        orders.setdefault(seed, []).append(seen)
    assert orders[0][0] == orders[0][1] != orders[1][0] and sorted(orders[0][0]) == sorted(orders[1][0])
    weights = []
    for seed in (0, 1):
        task, _ = _counting_task(digits_data, [])
        result = hetprune.prune(tiny_model, task, strategy="act-only", budget=1, seed=seed, progress=False,
                                settings={**TINY_SETTINGS, "scorer": "magnitude"}, log=lambda m: None)
        weights.append(hetprune.model.spec.model_hash(result.model))
    assert weights[0] != weights[1]


def test_namedtuple_and_dict_batches_reach_the_loss_and_the_metric_as_the_user_built_them(tiny_model, digits_data):
    x, y = _digits(digits_data, 32)
    batches = [Pair(x[:16], y[:16]), Pair(x[16:], y[16:])]
    got = {"loss": set(), "metric": set()}

    def loss(model, batch):
        got["loss"].add(type(batch).__name__)
        return F.cross_entropy(model(batch.images), batch.labels)

    def metric(model, val):
        got["metric"].update(type(b).__name__ for b in val)
        return 100.0 * sum(int((model(b.images).argmax(-1) == b.labels).sum()) for b in val) / 32

    task = Task(train=batches, val=batches, loss=loss, metric=metric, example=x[:2])
    result = hetprune.prune(tiny_model, task, strategy="act-only", budget=1, progress=False, log=lambda m: None,
                            settings={**TINY_SETTINGS, "scorer": "taylor"})
    assert got == {"loss": {"Pair"}, "metric": {"Pair"}} and 0 <= result.report["metric"] <= 100
    dict_task = _dict_task(digits_data)
    for scorer in ("block-influence", "taylor"):   # every scorer reads the batch through the task's loss
        hetprune.prune(tiny_model, dict_task, strategy="act-only", budget=1, progress=False, log=lambda m: None,
                       settings={**TINY_SETTINGS, "scorer": scorer})


def test_a_dict_batch_without_an_example_says_what_to_pass():
    batches = [{"pixel_values": torch.zeros(2, 1, 16, 16)}]
    task = Task(train=batches, val=batches, loss=lambda m, b: torch.zeros(()), metric=lambda m, v: 0.0)
    with pytest.raises(hetprune.HetpruneError, match=r"pass Task\(example=INPUT\)"):
        task.example()
