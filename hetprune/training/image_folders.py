"""The ImageFolder data sets: ``PATH/train/<class>/*`` and ``PATH/val/<class>/*`` read with timm's transforms
for the model (`image_folder`), their training augmentation and reader (`train_transform`, `train_reading`),
the per-item seeding of their random transforms (`SeededItems`), their selection split, and their fingerprint
(`folder_fingerprint`)."""

from __future__ import annotations

import os
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ..core import distributed as dist
from ..core.config import AUGMENTATIONS, augmentation
from ..core.errors import HetpruneError
from ..core.keys import fingerprint
from ..core.io import file_sha256
from . import images
from .bundle import DataBundle, _selection_size
from .loaders import default_workers, seed_cpu

FOLDER_SELECTION = 10_000     # an ImageFolder's selection split: at most this many training images ...
FOLDER_SELECTION_SHARE = 10   # ... and at most a tenth of them


def read_image(path: str, mode: str = "RGB"):
    """An image file decoded in ``mode`` (``RGB``, or ``L`` for a one-channel model, as timm reads one), with an
    unreadable file named in one clear error."""
    from PIL import Image

    try:
        with open(path, "rb") as fh:
            img = Image.open(fh)
            return img.convert(mode)
    except OSError as exc:  # PIL's UnidentifiedImageError included
        raise HetpruneError(f"cannot read image {path}: {exc}") from None


def read_gray(path: str):
    """`read_image` in ``L`` mode: the reader of a one-channel model's images (a module-level function, so loader
    workers can pickle it)."""
    return read_image(path, "L")


# the image modes an ImageFolder is read in, by the model's input channels: timm reads a one-channel model's
# images as L (its ``input_img_mode``), everything else as RGB; image files hold no other channel counts
MODES = {1: "L", 3: "RGB"}


def image_mode(channels: int) -> str:
    """The mode an ImageFolder's files are decoded in for a model of ``channels`` input channels: L for 1, RGB
    for 3; any other count is refused, naming both sides, before anything trains."""
    if channels not in MODES:
        raise HetpruneError(f"the model takes {channels} input channels (in_chans={channels}), and an ImageFolder's "
                            "images are read as 1 channel (grayscale, L) or 3 (RGB): build the model with in_chans=1 "
                            "or in_chans=3, or bring your own data loaders in a Task (hetprune.Task)")
    return MODES[channels]


def for_channels(cfg: dict) -> dict:
    """timm's data config for a model of ``cfg["input_size"][0]`` channels: a one-channel model's mean and std
    are one value each, the mean of the three its config gives (timm's configs are written for RGB)."""
    channels = cfg["input_size"][0]
    image_mode(channels)
    out = dict(cfg)
    for name in ("mean", "std"):
        values = tuple(cfg[name])
        if len(values) != channels:
            if channels != 1:
                raise HetpruneError(f"the model's data config gives {len(values)} {name} values for {channels} "
                                    f"input channels")
            out[name] = (round(sum(values) / len(values), 6),)
    return out


def files_mode(root: Path) -> str | None:
    """The mode of the first image file in ``root/train`` (``L``, ``RGB``, ``P``, ...), None where there is none:
    what a log line compares with the mode the model reads."""
    from PIL import Image
    from torchvision.datasets.folder import IMG_EXTENSIONS

    for folder in sorted((root / "train").iterdir()) if (root / "train").is_dir() else []:
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                if entry.name.lower().endswith(IMG_EXTENSIONS):
                    try:
                        with Image.open(entry) as img:
                            return img.mode
                    except OSError:
                        return None
    return None


def channels_note(root: Path, mode: str) -> str | None:
    """One line where the folder's images are converted to the mode the model reads (grayscale files for an RGB
    model, colour files for a one-channel one), None where they already are in it."""
    found = files_mode(Path(root))
    if found is None or found == mode or (mode == "RGB" and found in ("RGBA", "P", "CMYK", "YCbCr")):
        return None
    if mode == "L":
        return (f"the model takes 1 input channel (in_chans=1): the {found} images in {root} are read as grayscale "
                "(L), as timm reads them")
    return (f"the model takes 3 input channels: the grayscale ({found}) images in {root} are read as RGB, each "
            "channel the same; a model built with in_chans=1 reads them as they are")


AUGMENTS = tuple(AUGMENTATIONS)   # training augmentations of an ImageFolder (--augment); light: the default
# how an ImageFolder's training files become tensors: hetprune's (`hetprune.training.images`: the crop drawn
# before decoding, a JPEG decoded no larger than the crop needs, the same draws as timm's), or timm's own
# transform on a decoded image (bit for bit timm's pixels, at about twice the cost per core)
READERS = ("hetprune", "timm")


def train_transform(cfg: dict, augment) -> object:
    """The training transform of an ImageFolder, from timm's ``create_transform``: ``light`` (the default: a
    random crop of 60-100 % of the image, flips; what a fine-tune that recovers a pruned model from its teacher
    needs), ``imagenet`` (timm's full training recipe: crops down to 8 %, flips, colour jitter, as for training
    from scratch), ``paper`` (the DeiT recipe of the paper's long fine-tune: RandAugment rand-m9-mstd0.5,
    random erasing 0.25, bicubic), ``none`` (the validation transform: resize and centre crop), or an
    `hetprune.core.config.Augmentation` of one's own."""
    from timm.data import create_transform

    aug = augmentation(augment)
    if aug.plain:
        return create_transform(**cfg, is_training=False)
    if aug.name == "imagenet":   # timm's defaults, as this choice always was
        return create_transform(**cfg, is_training=True)
    return create_transform(**{**cfg, **aug.transform_args()}, is_training=True)


def train_reading(cfg: dict, augment, reader: str = "hetprune") -> tuple:
    """``(transform, file reader)`` of an ImageFolder's training images: `train_transform`, made faster by
    `hetprune.training.images.faster` with its reader `open_image` (which leaves decoding to the crop), or
    timm's as it is with `read_image` (``reader="timm"``, a transform that does not start with a crop, or a
    one-channel model, whose images are decoded as L: `file_reader`)."""
    if reader not in READERS:
        raise HetpruneError(f"an ImageFolder's reader is one of {', '.join(READERS)}, not {reader!r}")
    transform = train_transform(cfg, augment)
    rgb = image_mode(cfg["input_size"][0]) == "RGB"
    fast = images.faster(transform) if reader == "hetprune" and rgb else None
    return (fast, images.open_image) if fast is not None else (transform, file_reader(cfg))


def file_reader(cfg: dict):
    """The reader that decodes a file for timm's transforms in the mode of the model's channels."""
    return read_image if image_mode(cfg["input_size"][0]) == "RGB" else read_gray


class SeededItems(Dataset):
    """A data set whose random transforms are seeded per item by ``(epoch seed, index)``.

    timm's and torchvision's transforms draw from Python's ``random`` and
    torch's generator, which nothing seeds per item: the same run gave other
    crops, other sites and another top-1. Here every draw an item's transform
    makes comes from generators seeded for that item (their states are put
    back afterwards, except in a loader worker, where nothing else draws:
    saving numpy's state costs 0.1 ms an item), so a run is the same in one
    process, with DataLoader workers, or split over ranks, as `ShiftedImages` is.
    """

    def __init__(self, dataset: Dataset):
        self.dataset, self.seed = dataset, 0

    def set_epoch(self, seed: int) -> None:
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        item_seed = (self.seed * 1_000_003 + i) % (2 ** 31)
        if torch.utils.data.get_worker_info() is not None:   # a loader worker: nothing else draws here
            seed_cpu(item_seed)
            return self.dataset[i]
        state = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                seed_cpu(item_seed)
                return self.dataset[i]
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])

    def __getattr__(self, name):   # classes, samples, targets: the ImageFolder's own
        if name in ("dataset", "seed"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


FINGERPRINTS = ("sizes", "content")   # what an ImageFolder's fingerprint reads of each file


def image_folder(path: str | Path, model: torch.nn.Module, augment="light", workers: int | None = None,
                 fingerprint_by: str = "sizes", selection: int | None = None, reader: str = "hetprune") -> DataBundle:
    """``PATH/train/<class>/*`` and ``PATH/val/<class>/*`` with timm's transforms for ``model``; the training
    images augmented as ``augment`` says (a name or an `Augmentation`: `train_transform`), seeded per item.
    ``workers``: loader processes when a schedule says 0 (None: `default_workers`). ``fingerprint_by``:
    what keys the data (`folder_fingerprint`): every image's name and size (``sizes``, the default) or
    its bytes too (``content``: reads the whole data set once). Under torchrun every rank must call it
    together: rank 0 alone computes the fingerprint and every rank receives it.

    ``selection`` training images (None: a tenth, at most `FOLDER_SELECTION`; 0: none), a draw seeded
    apart from the run's seed, are held out of ``train`` and read with the validation transform: the
    selection split every choice of a run is measured on (ImageNet: 10,000 of 1,281,167 images).
    ``reader``: how training files become tensors (`READERS`, `train_reading`)."""
    aug = augmentation(augment)
    if fingerprint_by not in FINGERPRINTS:
        raise HetpruneError(f"the data fingerprint reads {' or '.join(FINGERPRINTS)} of each file, not "
                            f"{fingerprint_by!r}")
    from timm.data import resolve_data_config

    from ..model.spec import input_shape_of

    root = Path(path)

    cfg = resolve_data_config({}, model=model)
    # the model's actual input size wins over its pretrained config (models built with img_size=...), and its
    # channels say how files are decoded (a one-channel model reads L, as timm does)
    cfg["input_size"] = input_shape_of(model)
    cfg = for_channels(cfg)
    train, val, problem = None, None, None
    try:
        train, val = _image_folders(root, cfg, aug, reader)
    except HetpruneError as exc:
        if not dist.active():
            raise
        problem = str(exc)
    # every rank must see the images rank 0 sees (a node whose copy is missing or partial stops every rank)
    counts = dist.broadcast(None if train is None else (len(train), len(val)))
    if problem is None and counts != (len(train), len(val)):
        problem = (f"it sees {len(train)} training and {len(val)} validation images in {root}, rank 0 "
                   f"{'none' if counts is None else f'{counts[0]} and {counts[1]}'}")
    dist.agree(problem, f"data folder {root}")
    named = AUGMENTATIONS.get(aug.name) == aug   # a named one keys as its name, as it always did

    # hetprune's reader gives pixels within a level of timm's: keyed apart, so no state measured on one resumes
    # on the other
    read = {"read": "hetprune-1"} if train.loader is images.open_image else {}

    def key() -> str:
        return fingerprint({"data": str(root.resolve()), "files": folder_fingerprint(root, train.classes,
                                                                                     fingerprint_by),
                            "cfg": cfg, "augment": aug.name if named else asdict(aug), "seeded": 1, **read})

    fp = dist.on_main(key)   # computed once, by rank 0 (each file stat'ed once), and broadcast
    size = (min(FOLDER_SELECTION, len(train) // FOLDER_SELECTION_SHARE) if selection is None
            else _selection_size(selection))
    if size >= len(train):
        raise HetpruneError(f"data folder {root}: a selection split of {size} images leaves no training image "
                            f"({len(train)} in train/)")
    held, kept = None, train
    if size:
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(SELECTION_SEED)).tolist()
        held = FolderPart(plain_copy(train, val.transform), sorted(order[:size]))
        kept = FolderPart(train, sorted(order[size:]))
        fp = fingerprint({"data": fp, "selection": size, "seed": SELECTION_SEED})
    return DataBundle(str(root), SeededItems(kept), val, len(train.classes), cfg["input_size"][0],
                      cfg["input_size"][1], fp, augment=aug.name, workers=default_workers() if workers is None else workers,
                      selection=held, data_config=dict(cfg))


SELECTION_SEED = 20_260_701   # an ImageFolder's selection split is the same whatever the run's seed


class FolderPart(Subset):
    """Some of an ImageFolder's items (the training images a selection split leaves, or the split itself), with
    the folder's transforms and classes still reachable as attributes (what reads ``data.train.transform``)."""

    SHARED = ("transform", "transforms", "target_transform", "classes", "class_to_idx", "root", "loader")

    def __getattr__(self, name):
        if name in FolderPart.SHARED:
            return getattr(self.dataset, name)
        raise AttributeError(name)


def _image_folders(root: Path, cfg: dict, aug, reader: str = "hetprune"):
    """torchvision's ImageFolder of ``root/train`` and ``root/val``, checked: one error for a missing split,
    an empty class folder, or splits with different classes."""
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise HetpruneError(
                f"data folder {root}: no {split}/ folder; expected {root}/train/<class>/*.jpg and {root}/val/<class>/*"
            )
    try:
        transform, read = train_reading(cfg, aug, reader)
        train = ImageFolder(str(root / "train"), transform=transform, loader=read)
        val = ImageFolder(str(root / "val"), transform=create_transform(**cfg, is_training=False),
                          loader=file_reader(cfg))
    except (FileNotFoundError, OSError) as exc:  # e.g. a class folder with no image in it
        raise HetpruneError(f"data folder {root}: {exc}") from None
    if train.classes != val.classes:
        raise HetpruneError(f"data folder {root}: train/ and val/ have different class folders")
    return train, val


def folder_fingerprint(root: Path, classes: list[str], by: str = "sizes") -> str:
    """What keys an ImageFolder's images: each image file's path (relative to ``root``) and size, read in one
    ``os.scandir`` pass over ``train/<class>`` and ``val/<class>``, so each file is stat'ed once (ImageNet:
    1.3 million calls, on rank 0 alone); ``by="content"`` hashes every file's bytes as well. A rewritten
    image of another size, a renamed, added or removed one changes it; an image rewritten to the very same
    size changes it only with ``content``."""
    import hashlib

    from torchvision.datasets.folder import IMG_EXTENSIONS

    digest = hashlib.sha256()
    prefix = len(str(root)) + 1
    files: list[tuple[str, int, str]] = []

    def walk(folder: str) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir():   # links followed, as ImageFolder follows them
                    walk(entry.path)
                elif entry.name.lower().endswith(IMG_EXTENSIONS):
                    content = file_sha256(entry.path) if by == "content" else ""
                    files.append((entry.path[prefix:], entry.stat().st_size, content))

    for split in ("train", "val"):
        for name in classes:
            if (root / split / name).is_dir():
                walk(str(root / split / name))
    for item in sorted(files):
        digest.update(repr(item).encode())
    return f"{by}:{len(files)}:{digest.hexdigest()}"


def plain_copy(dataset: Dataset, transform) -> Dataset:
    """A shallow copy of a torchvision data set that applies ``transform`` (the validation one) instead of its
    own: the same files, read as at inference."""
    import copy

    plain = copy.copy(dataset)
    plain.transform = transform
    if getattr(plain, "loader", None) is images.open_image:   # the training reader leaves decoding to the crop
        plain.loader = read_image
    if hasattr(plain, "transforms"):   # torchvision's VisionDataset applies ``transforms``
        from torchvision.datasets.vision import StandardTransform

        plain.transforms = StandardTransform(transform, getattr(dataset, "target_transform", None))
    return plain
