"""Where INT8 calibration and check images come from: the task's own training and validation data.

* A classification task (the embedded benchmarks, ``--data PATH``) gives a seeded subset of its training
  images without augmentation (`hetprune.training.data.without_augmentation`), so the same seed gives the same
  images and the same INT8 file.
* A user's `hetprune.Task` gives the first images its ``train`` batches yield (its loader's order;
  shuffle it with a seed to vary them); a batch is an image tensor or a tuple whose first item is one.
* Images given directly (``images=``: a tensor, or batches of them) replace the task's, for calibration and
  for the check batch: a task whose batches are dicts (``{"pixel_values": ..., "labels": ...}``) needs them,
  or its ``Task(example=...)`` for the check batch alone (``int8-dynamic`` does not calibrate).

The task's metric is always measured on its own validation data, with its own metric function.
Anything else is one clear error that says what to pass.
"""

from __future__ import annotations

import torch

from ...core.errors import HetpruneError, option


def _image_tensor(batch):
    """The image tensor a batch holds (the batch itself, or its first item), or None."""
    x = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    return x if isinstance(x, torch.Tensor) else None


def _as_images(batch, where: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The image tensor of one batch, checked to be float ``(N, *shape)``."""
    x = _image_tensor(batch)
    if x is None:
        held = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        raise HetpruneError(f"{where} are not images: a batch holds {type(held).__name__}, not an image tensor; "
                            "INT8 calibration needs batches of images (a tensor, or a tuple whose first item is "
                            "one), or pass images=TENSOR")
    if not x.is_floating_point() or x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape):
        raise HetpruneError(f"{where} are not images this model takes: a batch is a {str(x.dtype)[6:]} tensor "
                            f"of shape {tuple(x.shape)}, the model takes float (N, {', '.join(map(str, shape))}); "
                            "pass images=TENSOR of that shape")
    return x.detach().float().cpu()


def _take(batches, n: int, where: str, shape) -> torch.Tensor | None:
    """Up to ``n`` images from ``batches`` (None when they yield none)."""
    got, count = [], 0
    for batch in batches:
        x = _as_images(batch, where, shape)
        got.append(x[:n - count])
        count += len(got[-1])
        if count >= n:
            break
    return torch.cat(got) if count else None


def _first(batches, n: int, where: str, shape) -> torch.Tensor:
    """The first ``n`` images of ``batches``; fewer than ``n`` is an error naming how many there are."""
    got = _take(batches, n, where, shape)
    if got is None:
        raise HetpruneError(f"{where} yield no images; INT8 needs images to calibrate on: give the Task "
                            "train=batches of images, or pass images=TENSOR")
    if len(got) < n:
        raise HetpruneError(f"{option('calibration', str(n))} is more than the {len(got)} images {where} hold; "
                            f"allowed: 1 to {len(got)}")
    return got


def _given(images) -> list:
    """``images=`` as batches: one tensor is one batch."""
    return [images] if isinstance(images, torch.Tensor) else images


def _dataset_images(dataset, n: int, seed: int, what: str, name: str) -> torch.Tensor:
    from ...training.loaders import loader, subset

    if n > len(dataset):
        raise HetpruneError(f"{option('calibration', str(n))} is more than the {len(dataset)} {what} images of "
                            f"{name}; allowed: 1 to {len(dataset)}")
    batches = loader(subset(dataset, n, seed), 64, shuffle=False)
    return torch.cat([torch.as_tensor(x).float() for x, _ in batches])


def check_count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HetpruneError(f"{option('calibration')} must be a whole number of images >= 1, got {n!r}")
    return n


def calibration_images(task, n: int, seed: int, shape: tuple[int, ...], images=None) -> torch.Tensor:
    """``n`` calibration images (a float tensor ``(n, *shape)``): from ``images`` when given, else the task's
    training data (see the module docstring)."""
    check_count(n)
    if images is not None:
        return _first(_given(images), n, "the images given", shape)
    data = getattr(task, "data", None)
    if data is not None and hasattr(data, "train"):   # a classification task: a seeded subset, unaugmented
        from ...training.data import without_augmentation

        return _dataset_images(without_augmentation(data), n, seed, "training", data.name)
    train = getattr(task, "train", None)
    if train is None:
        raise HetpruneError("the task has no training data to calibrate INT8 on: give the Task train=batches of "
                            "images, or pass images=TENSOR")
    return _first(train, n, "the task's training batches", shape)


def check_images(task, n: int, seed: int, shape: tuple[int, ...], images=None) -> tuple[torch.Tensor, str]:
    """Up to ``n`` images the INT8 file is compared with the fp32 model on, and where they come from: the
    ``images`` given; else a seeded subset of a classification task's validation data; else the first images
    of a user task's validation batches, or its ``example`` where those batches are not images (dicts)."""
    if images is not None:
        got = _take(_given(images), n, "the images given", shape)
        if got is None:
            raise HetpruneError("the images given hold no image; pass images=TENSOR of at least one image")
        return got, "images given"
    data = getattr(task, "data", None)
    if data is not None and hasattr(data, "val"):
        return _dataset_images(data.val, min(n, len(data.val)), seed, "validation", data.name), \
            f"validation data of {data.name}"
    first = next(iter(task.val), None)
    if first is None:
        raise HetpruneError(f"the task's val data ({task.name}) yields no batch")
    if _image_tensor(first) is None:   # dict batches, say: the input the task says the model takes
        return _as_images(task.example(n), "the task's example inputs", shape), "the task's example"
    return _take(task.val, n, "the task's validation batches", shape), f"validation data of {task.name}"
