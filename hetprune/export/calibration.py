"""Where INT8 calibration and check images come from: the task's own training and validation data.

* A classification task (the embedded benchmarks, ``--data PATH``) gives a seeded subset of its training
  images without augmentation (`hetprune.data.without_augmentation`), so the same seed gives the same
  images and the same INT8 file.
* A user's `hetprune.Task` gives the first images its ``train`` batches yield (its loader's order;
  shuffle it with a seed to vary them); a batch is an image tensor or a tuple whose first item is one.
* Images given directly (``images=``: a tensor, or batches of them) replace the task's.

Anything else is one clear error that says what to pass.
"""

from __future__ import annotations

import torch

from ..errors import HetpruneError


def _as_images(batch, where: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The image tensor of one batch, checked to be float ``(N, *shape)``."""
    x = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if not isinstance(x, torch.Tensor):
        raise HetpruneError(f"{where} are not images: a batch holds {type(x).__name__}, not an image tensor; "
                            "INT8 calibration needs batches of images (a tensor, or a tuple whose first item is "
                            "one), or pass images=TENSOR")
    if not x.is_floating_point() or x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape):
        raise HetpruneError(f"{where} are not images this model takes: a batch is a {str(x.dtype)[6:]} tensor "
                            f"of shape {tuple(x.shape)}, the model takes float (N, {', '.join(map(str, shape))}); "
                            "pass images=TENSOR of that shape")
    return x.detach().float().cpu()


def _first(batches, n: int, where: str, shape) -> torch.Tensor:
    """The first ``n`` images of ``batches``; fewer than ``n`` is an error naming how many there are."""
    got, count = [], 0
    for batch in batches:
        x = _as_images(batch, where, shape)
        got.append(x[:n - count])
        count += len(got[-1])
        if count >= n:
            break
    if count == 0:
        raise HetpruneError(f"{where} yield no images; INT8 needs images to calibrate on: give the Task "
                            "train=batches of images, or pass images=TENSOR")
    if count < n:
        raise HetpruneError(f"--calibration {n} is more than the {count} images {where} hold; "
                            f"allowed: 1 to {count}")
    return torch.cat(got)


def _dataset_images(dataset, n: int, seed: int, what: str, name: str) -> torch.Tensor:
    from ..data import loader, subset

    if n > len(dataset):
        raise HetpruneError(f"--calibration {n} is more than the {len(dataset)} {what} images of {name}; "
                            f"allowed: 1 to {len(dataset)}")
    batches = loader(subset(dataset, n, seed), 64, shuffle=False)
    return torch.cat([torch.as_tensor(x).float() for x, _ in batches])


def check_count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise HetpruneError(f"--calibration must be a whole number of images >= 1, got {n!r}")
    return n


def calibration_images(task, n: int, seed: int, shape: tuple[int, ...], images=None) -> torch.Tensor:
    """``n`` calibration images (a float tensor ``(n, *shape)``): from ``images`` when given, else the task's
    training data (see the module docstring)."""
    check_count(n)
    if images is not None:
        if isinstance(images, torch.Tensor):
            images = [images]
        return _first(images, n, "the images given", shape)
    data = getattr(task, "data", None)
    if data is not None and hasattr(data, "train"):   # a classification task: a seeded subset, unaugmented
        from ..data import without_augmentation

        return _dataset_images(without_augmentation(data), n, seed, "training", data.name)
    train = getattr(task, "train", None)
    if train is None:
        raise HetpruneError("the task has no training data to calibrate INT8 on: give the Task train=batches of "
                            "images, or pass images=TENSOR")
    return _first(train, n, "the task's training batches", shape)


def check_images(task, n: int, seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Up to ``n`` validation images of the task (a seeded subset for a classification task): the batch an
    INT8 file is compared with the fp32 model on."""
    data = getattr(task, "data", None)
    if data is not None and hasattr(data, "val"):
        return _dataset_images(data.val, min(n, len(data.val)), seed, "validation", data.name)
    got = []
    for batch in task.val:
        got.append(_as_images(batch, "the task's validation batches", shape))
        if sum(map(len, got)) >= n:
            break
    if not got:
        raise HetpruneError(f"the task's val data ({task.name}) yields no batch")
    return torch.cat(got)[:n]
