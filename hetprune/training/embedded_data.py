"""The embedded data sets: built from scikit-learn's digits, no download (``--data digits``, ``--data
digit-pairs``; `hetprune.training.digit_grid` adds ``digit-grid``), each with its own fixed augmentation
(`ShiftedImages`: shifts of a pixel or two)."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from ..core.errors import HetpruneError
from ..core.keys import fingerprint
from .bundle import DataBundle, _selection_size

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


DIGITS_SELECTION = 300        # training images of `digits` held out as its selection split
DIGIT_PAIRS_SELECTION = 1000  # pairs of training digits, never a training pair, as `digit_pairs`' selection split


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
