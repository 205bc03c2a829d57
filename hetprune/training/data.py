"""Data: the embedded data sets (built from scikit-learn's digits) and ImageFolder trees.

Every data set comes as a `DataBundle` with a train and a val split and
a fingerprint, so resumable state (MAP points, compare rows) is keyed by the
data it was measured on.
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, TensorDataset

from ..core import distributed as dist
from ..core.fingerprint import fingerprint
from ..core.io import file_sha256
from ..core.config import AUGMENTATIONS, augmentation
from ..core.errors import HetpruneError
from . import images

DIGITS = "digits"
DIGIT_PAIRS = "digit-pairs"
# the data sets that need no download (--data takes these names or a folder): each name's builder, called
# with ``seed`` and ``selection``; a module that builds another (digit_grid.py) adds itself with `register_embedded`
EMBEDDED_BUILDERS: dict = {}
EMBEDDED: list[str] = []


def register_embedded(name: str, builder) -> None:
    """Make ``builder(seed=..., selection=...) -> DataBundle`` the embedded data set ``name`` (``--data NAME``)."""
    EMBEDDED_BUILDERS[name] = builder
    if name not in EMBEDDED:
        EMBEDDED.append(name)


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


class ShiftedImages(Dataset):
    """Images shifted by up to ``pixels`` in x and y (zero fill) as training augmentation.

    The shift of item ``i`` depends only on ``(epoch seed, i)``, not on batch
    position or process, so a run split over ranks sees the very same images
    as a single-process run (see `GlobalBatchSampler`).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, pixels: int):
        self.images, self.labels, self.pixels = images, labels, pixels
        self.seed = 0

    def set_epoch(self, seed: int) -> None:
        self.seed = seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x, p = self.images[i], self.pixels
        if p > 0:
            rng = random.Random(self.seed * 1_000_003 + i)
            dx, dy = rng.randint(-p, p), rng.randint(-p, p)
            x = torch.roll(F.pad(x, (p, p, p, p)), shifts=(dy, dx), dims=(1, 2))[:, p:-p, p:-p]
        return x, self.labels[i]


def set_epoch(dataset: Dataset, seed: int) -> None:
    """Tell an augmenting data set (possibly inside a Subset) which epoch this is."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(seed)


class GlobalBatchSampler(Sampler):
    """Seeded global batches, each split across ranks.

    Global batch ``t`` is the same set of items whatever the number of ranks;
    rank ``r`` of ``w`` takes every ``w``-th item of it, so shares may differ
    by one item (``batch_size`` need not be a multiple of ``w``).

    ``pad_empty`` (training under DDP): every rank yields one batch per global
    batch, so the ranks' collectives line up. A rank whose share is empty (a
    short last batch, or fewer items than ranks) gets the global batch's first
    item as a stand-in, which `shares` gives zero weight. Without it
    (evaluation, which counts items) a rank yields its real shares only.

    ``pairs`` (mixup and cutmix): item ``i`` of a global batch of ``B`` is
    mixed with item ``B-1-i`` (timm's batch mode: the batch flipped), so rank
    ``r`` takes every ``w``-th such pair, firsts then seconds reversed: its
    own batch flipped pairs the same items, and no rank needs another's.
    ``repeats`` (repeated augmentation, timm's ``RepeatAugSampler``): the
    epoch's order holds each item ``repeats`` times in a row, cut to the data
    set's length; an occurrence is ``item + repeat * n``. ``start`` skips the
    first global batches (a resumed epoch).
    """

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1,
                 pad_empty: bool = False, pairs: bool = False, repeats: int = 1, start: int = 0):
        if batch_size < 1:
            raise HetpruneError(f"batch_size must be at least 1, got {batch_size}")
        self.n, self.batch_size, self.seed, self.shuffle, self.rank, self.world = n, batch_size, seed, shuffle, rank, world
        self.pad_empty, self.pairs, self.repeats, self.start = pad_empty, pairs, repeats, start

    def set_epoch(self, seed: int, start: int = 0) -> None:
        """The next epoch's seed, and how many of its global batches to skip."""
        self.seed, self.start = seed, start

    def global_batches(self) -> list[list[int]]:
        order = (torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed)).tolist()
                 if self.shuffle else list(range(self.n)))
        if self.repeats > 1:
            order = [i + r * self.n for i in order for r in range(self.repeats)][:self.n]
        return [order[i:i + self.batch_size] for i in range(0, self.n, self.batch_size)]

    def share_of(self, batch: list[int]) -> list[int]:
        """This rank's items of one global batch, in the order its own mixing pairs them."""
        if not self.pairs:
            return batch[self.rank::self.world]
        size = len(batch)
        groups = list(range((size + 1) // 2))[self.rank::self.world]   # pair k: items k and size-1-k
        firsts = [batch[k] for k in groups]
        seconds = [batch[size - 1 - k] for k in groups if size - 1 - k != k]
        return firsts + seconds[::-1]

    def shares(self) -> list[tuple[int, int]]:
        """Per yielded batch, ``(this rank's real items, the global batch's items)``: the weight of this
        rank's mean loss in the global batch's mean (0 for a stand-in)."""
        return [(len(self.share_of(b)), len(b)) for b in self.global_batches()[self.start:]
                if self.pad_empty or self.share_of(b)]

    def __iter__(self):
        out = []
        for batch in self.global_batches()[self.start:]:
            mine = self.share_of(batch)
            if mine:
                out.append(mine)
            elif self.pad_empty:
                out.append(batch[:1])
        return iter(out)   # made now: a later set_epoch does not change an epoch under way

    def __len__(self) -> int:
        return len(self.shares())


class EpochKeys(Sampler):
    """A `GlobalBatchSampler`'s batches as keys ``(item, epoch seed, repeat)`` for `EpochItems`: the epoch
    travels with each item, so loader workers that live across epochs draw as a fresh loader would."""

    def __init__(self, sampler: GlobalBatchSampler):
        self.sampler = sampler

    def __iter__(self):
        n, seed = self.sampler.n, self.sampler.seed
        return iter([[(o % n, seed, o // n) for o in batch] for batch in self.sampler])

    def __len__(self) -> int:
        return len(self.sampler)

    def shares(self) -> list[tuple[int, int]]:
        return self.sampler.shares()


class EpochItems(Dataset):
    """``dataset[i]`` drawn for a key ``(i, epoch seed, repeat)``: its augmentation seeded by that epoch, or,
    for a repeat ``r > 0`` (repeated augmentation), by a seed of its own, so each showing differs."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            return self.dataset[key]
        i, seed, repeat = key
        set_epoch(self.dataset, seed if not repeat else (seed * 1_000_033 + repeat) % (2 ** 31))
        return self.dataset[i]


DIGITS_SELECTION = 300        # training images of `digits` held out as its selection split
DIGIT_PAIRS_SELECTION = 1000  # pairs of training digits, never a training pair, as `digit_pairs`' selection split
FOLDER_SELECTION = 10_000     # an ImageFolder's selection split: at most this many training images ...
FOLDER_SELECTION_SHARE = 10   # ... and at most a tenth of them


def digits(img_size: int = 16, val_size: int = 450, seed: int = 0, shift: int = 2,
           selection: int | None = None) -> DataBundle:
    """scikit-learn's 8x8 digits, upscaled to ``img_size``, stratified train/val split; ``selection``
    training images (None: `DIGITS_SELECTION`; 0: none) are held out of ``train`` as the selection split, a
    seeded stratified draw. The base model was trained on the whole training pool (``selection=0``); the
    fine-tunes of a run never see the selection images."""
    selection = DIGITS_SELECTION if selection is None else _selection_size(selection)
    raw_images, raw_labels, train_idx, val_idx = _digits_split(val_size, seed)
    images = torch.tensor(raw_images, dtype=torch.float32).unsqueeze(1)
    images = F.interpolate(images, size=(img_size, img_size), mode="bilinear", align_corners=False)
    images = (images - 0.5) / 0.5
    labels = torch.tensor(raw_labels, dtype=torch.long)
    held = None
    if selection:
        from sklearn.model_selection import train_test_split

        if selection >= len(train_idx):
            raise HetpruneError(f"a selection split of {selection} digits leaves no training image "
                                f"({len(train_idx)} in the training pool)")
        train_idx, sel_idx = train_test_split(train_idx, test_size=selection, stratify=raw_labels[train_idx],
                                              random_state=seed + 1)
        train_idx, sel_idx = np.sort(train_idx), np.sort(sel_idx)
        held = TensorDataset(images[sel_idx], labels[sel_idx])
    train = ShiftedImages(images[train_idx], labels[train_idx], shift)
    val = TensorDataset(images[val_idx], labels[val_idx])
    fp = fingerprint({"data": DIGITS, "img_size": img_size, "val_size": val_size, "seed": seed, "shift": shift,
                      "augment": "per-item-v2", **({"selection": selection} if selection else {})})
    return DataBundle(DIGITS, train, val, 10, 1, img_size, fp, selection=held)


def _selection_size(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HetpruneError(f"the selection split's size must be a whole number of items >= 0 (0: none), "
                            f"got {value!r}")
    return value


def _digits_split(val_size: int, seed: int):
    """scikit-learn's digits as ``(images N x 8 x 8 in [0, 1], labels, train_idx, val_idx)``, stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    idx = np.arange(len(raw.target))
    train_idx, val_idx = train_test_split(idx, test_size=val_size, stratify=raw.target, random_state=seed)
    return raw.images / 16.0, raw.target, train_idx, val_idx


def digit_pairs(train_pairs: int = 4000, val_pairs: int = 1000, val_size: int = 450, seed: int = 0,
                shift: int = 1, singles: float = 0.25, selection: int | None = None) -> DataBundle:
    """Two scikit-learn digits side by side, labelled by their sum (19 classes, 0..18).

    Each 8x8 digit is stretched to 16 rows x 8 columns, so a pair fills one 16x16
    image, the input size of `digits` (the embedded model reads it as two
    16x8 patches, one per digit). Train pairs are drawn (seeded, with
    replacement) from the training images of the same stratified split as
    `digits`, val pairs from its val images only, so no val digit is ever
    seen in training. A share ``singles`` of the training images shows one digit
    with the other half blank (a blank adds 0 to the sum): it teaches the digits
    themselves and makes the sum learnable in a few minutes; val images are all
    pairs. The label needs both halves and is not linear in the pixels: a
    logistic regression on raw pixels reaches about 20 % on it
    (benchmarks/results/digit-pairs-linear.md).

    The selection split (``selection`` pairs; None: `DIGIT_PAIRS_SELECTION`; 0: none) is drawn after the
    train and val pairs (which stay what they were), from the training digits, and holds no pair of digit
    images that is a training pair: new combinations of digits the training pairs show, as an ImageFolder's
    selection images are training images the base model saw and the run's fine-tunes do not.
    """
    selection = DIGIT_PAIRS_SELECTION if selection is None else _selection_size(selection)
    images, labels, train_idx, val_idx = _digits_split(val_size, seed)
    rng = np.random.default_rng(seed)

    drawn = []   # per call of pairs: (left, right) digit indices, -1 for a blank half

    def pairs(pool: np.ndarray, n: int, singles: float):
        left, right = rng.choice(pool, n), rng.choice(pool, n)
        lx, rx, ly, ry = images[left], images[right], labels[left], labels[right]
        # a share of the training images shows one digit only (the other half blank, adding 0 to the sum)
        blank = rng.random(n) < singles
        blank_left = blank & (rng.random(n) < 0.5)
        blank_right = blank & ~blank_left
        drawn.append((np.where(blank_left, -1, left), np.where(blank_right, -1, right)))
        lx, ly = np.where(blank_left[:, None, None], 0.0, lx), np.where(blank_left, 0, ly)
        rx, ry = np.where(blank_right[:, None, None], 0.0, rx), np.where(blank_right, 0, ry)
        x = torch.tensor(np.concatenate([lx, rx], axis=2), dtype=torch.float32).unsqueeze(1)
        x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)  # 8x16 -> 16x16: rows doubled
        return (x - 0.5) / 0.5, torch.tensor(ly + ry, dtype=torch.long)

    train_x, train_y = pairs(train_idx, train_pairs, singles)
    val_x, val_y = pairs(val_idx, val_pairs, 0.0)
    held = None
    if selection:
        seen = {(int(a), int(b)) for a, b in zip(*drawn[0])}   # the training pairs (a blank half: not a pair)
        sel_x, sel_y = pairs(train_idx, 2 * selection + 64, 0.0)
        fresh = [i for i, (a, b) in enumerate(zip(*drawn[-1])) if (int(a), int(b)) not in seen][:selection]
        if len(fresh) < selection:
            raise HetpruneError(f"digit pairs: cannot draw {selection} selection pairs that are not training pairs")
        held = TensorDataset(sel_x[fresh], sel_y[fresh])
    fp = fingerprint({"data": DIGIT_PAIRS, "train_pairs": train_pairs, "val_pairs": val_pairs, "val_size": val_size,
                      "seed": seed, "shift": shift, "singles": singles, "label": "sum", "v": 1,
                      **({"selection": selection} if selection else {})})
    return DataBundle(DIGIT_PAIRS, ShiftedImages(train_x, train_y, shift), TensorDataset(val_x, val_y), 19, 1, 16, fp,
                      selection=held)


register_embedded(DIGITS, digits)
register_embedded(DIGIT_PAIRS, digit_pairs)


def read_image(path: str):
    """torchvision's image loader, with an unreadable file named in one clear error."""
    from torchvision.datasets.folder import default_loader

    try:
        return default_loader(path)
    except OSError as exc:  # PIL's UnidentifiedImageError included
        raise HetpruneError(f"cannot read image {path}: {exc}") from None


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
    timm's as it is with `read_image` (``reader="timm"``, or a transform that does not start with a crop)."""
    if reader not in READERS:
        raise HetpruneError(f"an ImageFolder's reader is one of {', '.join(READERS)}, not {reader!r}")
    transform = train_transform(cfg, augment)
    fast = images.faster(transform) if reader == "hetprune" else None
    return (fast, images.open_image) if fast is not None else (transform, read_image)


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
    # the model's actual input size wins over its pretrained config (models built with img_size=...)
    cfg["input_size"] = input_shape_of(model)
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
                      selection=held)


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
        val = ImageFolder(str(root / "val"), transform=create_transform(**cfg, is_training=False), loader=read_image)
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


def default_workers() -> int:
    """Loader processes for image files: the CPUs this process may use, shared among the local processes
    (one per GPU), less one for the process itself; at least one. No fixed cap: with the paper's augmentations
    one core reads a few hundred images a second, and a GPU trains DeiT-B at thousands
    (benchmarks/results/loader-throughput.md)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, local) - 1)


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


def subset(dataset: Dataset, n: int | None, seed: int) -> Dataset:
    """A seeded random subset of ``n`` items (all of them when ``n`` is None or too large)."""
    if n is None or n >= len(dataset):
        return dataset
    if n <= 0:
        raise HetpruneError(f"a subset needs at least one item, got {n}")
    key = (id(dataset), n, seed)
    if key in _SUBSETS and _SUBSETS[key].dataset is dataset:   # the same object: its loader is reused
        return _SUBSETS[key]
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(dataset), generator=gen)[:n].tolist()
    _SUBSETS[key] = Subset(dataset, sorted(idx))
    while len(_SUBSETS) > 16:
        _SUBSETS.pop(next(iter(_SUBSETS)))
    return _SUBSETS[key]


_SUBSETS: dict = {}   # recent subsets, so each epoch of a fine-tune reads the same object (and loader)


PREFETCH = 4          # batches each loader worker keeps ready
_LOADERS: dict = {}   # reused loaders (workers that live across epochs), most recently used last
_MAX_LOADERS = 4


def loader(dataset: Dataset, batch_size: int, shuffle: bool, seed: int = 0, workers: int = 0,
           rank: int = 0, world: int = 1, pin_memory: bool = False, pad_empty: bool = False, pairs: bool = False,
           repeats: int = 1, start: int = 0) -> DataLoader:
    """Batches of ``dataset`` for one epoch seeded by ``seed`` (this rank's share under torchrun).

    ``pin_memory`` (for a CUDA run) puts batches in page-locked memory, so the
    copy to the GPU can be non-blocking. ``pad_empty``: every rank gets a batch
    at every step (see `GlobalBatchSampler`; the weights are
    ``loader.batch_sampler.shares()``); ``pairs``, ``repeats`` and ``start``:
    see `GlobalBatchSampler`.

    With ``workers``, one loader per data set and shape is kept and reused for
    every epoch: its worker processes stay up (``persistent_workers``), each
    keeping ``PREFETCH`` batches ready. Each item's key carries the epoch
    (`EpochKeys`), so its draws are those a fresh loader would make. Loaders
    draw nothing from torch's global generator (their own ``generator``), so
    what a model draws while it trains does not depend on the workers.
    """
    shape = (id(dataset), batch_size, shuffle, workers, rank, world, pin_memory, pad_empty, pairs, repeats)
    cached = _LOADERS.pop(shape, None) if workers else None
    if cached is None:
        sampler = GlobalBatchSampler(len(dataset), batch_size, seed, shuffle=shuffle, rank=rank, world=world,
                                     pad_empty=pad_empty, pairs=pairs, repeats=repeats, start=start)
        cached = DataLoader(EpochItems(dataset), batch_sampler=EpochKeys(sampler), num_workers=workers,
                            persistent_workers=workers > 0, prefetch_factor=PREFETCH if workers else None,
                            pin_memory=pin_memory, worker_init_fn=seed_worker if workers else None,
                            generator=torch.Generator())
        cached.source = dataset   # held, so the id in the shape is not reused while the loader lives
    cached.batch_sampler.sampler.set_epoch(seed, start)
    if workers:
        _LOADERS[shape] = cached
        while len(_LOADERS) > _MAX_LOADERS:
            close_loader(_LOADERS.pop(next(iter(_LOADERS))))
    return cached


def close_loader(data_loader: DataLoader) -> None:
    """Stop a reused loader's worker processes now (rather than when it is collected)."""
    it = getattr(data_loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    data_loader._iterator = None


def close_loaders() -> None:
    """Stop every reused loader's workers (the end of a run, or a test)."""
    while _LOADERS:
        close_loader(_LOADERS.pop(next(iter(_LOADERS))))


@contextlib.contextmanager
def closing_loaders():
    """On leaving (error or not), stop the workers of every reused loader opened inside: a command or library
    call leaves no worker process behind. Persistent workers with pinned memory (a CUDA run) otherwise made
    the interpreter's exit wait on each of them (``--plan`` on an H200 never exited). Loaders opened before
    are left to whoever opened them. Also a decorator."""
    before = {id(cached) for cached in _LOADERS.values()}
    try:
        yield
    finally:
        for shape, cached in list(_LOADERS.items()):
            if id(cached) not in before:
                close_loader(_LOADERS.pop(shape))


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator and torch's (what a run starts with): whatever a
    user's transform or code draws from is the same from one run to the next."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def seed_cpu(seed: int) -> None:
    """`seed_everything` for the CPU generators alone (what an item's transforms draw from). ``torch.manual_seed``
    also queues a seed for every CUDA device, formatting a stack trace each time (0.5-1 ms an item), and
    in the main process it reseeded the GPU's generator, which `SeededItems` does not put back."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.default_generator.manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """A DataLoader worker's ``random`` and numpy seeded from the torch seed the loader gave it (torch seeds
    only its own generator per worker)."""
    seed = torch.initial_seed() % (2 ** 32)
    random.seed(seed)
    np.random.seed(seed)


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


def example_batch(data: DataBundle, n: int = 8) -> torch.Tensor:
    """A few validation images, for exactness checks and cost counting."""
    items = [data.val[i][0] for i in range(min(n, len(data.val)))]
    return torch.stack(items)
