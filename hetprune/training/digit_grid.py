"""The third embedded benchmark, digit grid: scikit-learn digits on a 4x4 grid, labelled by their sum mod 10.

Each image is a 4x4 grid of 8x8 cells (32x32, one channel); the base model
(`DIGIT_GRID_SPEC`) reads it as 16 patches of 8x8, one per cell, plus the class
token: 17 tokens, the token count of the `digits` model, but a label that no
single token carries. See `digit_grid` for the label and the splits, and
benchmarks/results/digit-grid-training.md for how the schedule was chosen.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..core.errors import HetpruneError
from ..core.keys import fingerprint
from ..model.spec import DIGIT_GRID_SPEC  # noqa: F401  (the benchmark's base model, importable beside its data)
from .bundle import DataBundle, _selection_size
from .embedded_data import ShiftedImages, _digits_split, register_embedded

DIGIT_GRID = "digit-grid"
CELL = 8                 # one scikit-learn digit per cell, at its own 8x8 resolution
DEFAULT_SELECTION = 1000
SELECTION_DIGITS = 300   # training digits held out of every training image: the selection split's own
SELECTION_CHUNK = 1024   # selection candidates drawn at a time

# 24000 images x 12 epochs: about 11 minutes on one CPU thread (benchmarks/results/digit-grid-training.md)
DIGIT_GRID_TRAINING = dict(epochs=12, lr=2e-3, batch_size=64, weight_decay=0.05, seed=0, warmup_epochs=1)


def digit_grid(seed: int = 0, selection: int | None = None, train_items: int = 24000, val_items: int = 1000,
               val_size: int = 450, grid: int = 4, per_image: int = 2, singles: float = 0.25,
               shift: int = 0, selection_digits: int = SELECTION_DIGITS) -> DataBundle:
    """``per_image`` scikit-learn digits at distinct random cells of a ``grid`` x ``grid`` grid of 8x8 cells,
    labelled by the sum of the digits mod 10 (10 classes); every other cell is blank (background 0, -1 after
    normalising: value/16 in [0, 1], then (x - 0.5) / 0.5, as the other embedded sets).

    One patch is at chance: a patch is one cell, and a cell shows one digit or a blank. For ``per_image`` = 2
    (the default) the label is ``(a + b) mod 10``; with the other digit ``b`` drawn independently of ``a``
    and uniform over 0..9 (stratified pools), ``(a + b) mod 10`` is uniform whatever ``a`` is, so seeing one
    digit (or a blank, or knowing where the digits are) says nothing about the label; the model has to find
    the non-blank cells, read each, and combine them. The same holds for any ``per_image`` >= 2.

    A share ``singles`` of the training images shows one digit only (the same rule: its label is that digit),
    as `digit_pairs` does: it teaches the digits themselves and makes the sum learnable within an embedded
    model's training budget. Val and selection images are all ``per_image`` digits.

    Splits (the stratified digit split of `digits` and `digit_pairs`): ``selection_digits`` of the training
    digits (a stratified draw) are held out of every training image, whatever ``selection`` is: ``train``
    (``train_items`` images, a `ShiftedImages`; its ``shift`` is 0 by default: the base model's schedule
    was chosen without one, see benchmarks/results/digit-grid-training.md) is composed from the other
    training digits, ``selection`` (``selection`` images, default 1000; 0: none) from the held-out digits
    only, and ``val`` (``val_items``) from the val digits only. So neither the base model nor any
    fine-tune ever sees a selection or val digit, and a choice measured on the selection sees the damage
    val would (a selection of new pairs of training digits read 99.7 % on a base model trained on them:
    memorised digits). No selection image appears twice (exact pixels; identical draws are redrawn). Each
    split draws from a generator of its own seeded by ``seed``, so the train and val images do not depend
    on the selection's size, and every call with the same arguments gives the same tensors.
    """
    cells = grid * grid
    if not 1 <= per_image <= cells:
        raise HetpruneError(f"digit-grid: per_image must be 1..{cells} (the grid's cells), got {per_image}")
    if not 0.0 <= singles < 1.0:
        raise HetpruneError(f"digit-grid: singles must be in [0, 1), got {singles}")
    if train_items < 1 or val_items < 1:
        raise HetpruneError(f"digit-grid: train_items and val_items must be at least 1, got {train_items}, "
                            f"{val_items}")
    n_selection = DEFAULT_SELECTION if selection is None else _selection_size(selection)
    images, labels, train_idx, val_idx = _digits_split(val_size, seed)
    if not 0 < selection_digits < len(train_idx):
        raise HetpruneError(f"digit-grid: selection_digits must be 1..{len(train_idx) - 1} (of the "
                            f"{len(train_idx)} training digits), got {selection_digits}")
    from sklearn.model_selection import train_test_split

    train_idx, held_idx = train_test_split(train_idx, test_size=selection_digits, stratify=labels[train_idx],
                                           random_state=seed + 1)
    train_idx, held_idx = np.sort(train_idx), np.sort(held_idx)

    def compose(rng: np.random.Generator, pool: np.ndarray, n: int, share_single: float):
        """``n`` grids from the digits of ``pool``: images (n, 32, 32) in [0, 1] and labels (n,)."""
        where = np.argsort(rng.random((n, cells)), axis=1)[:, :per_image]   # distinct cells per image
        which = rng.choice(pool, (n, per_image))
        shown = np.full(n, per_image)
        shown[rng.random(n) < share_single] = 1
        canvas = np.zeros((n, grid, CELL, grid, CELL))
        for j in range(per_image):
            on = np.nonzero(j < shown)[0]
            canvas[on, where[on, j] // grid, :, where[on, j] % grid, :] = images[which[on, j]]
        used = np.arange(per_image)[None, :] < shown[:, None]
        y = (labels[which] * used).sum(axis=1) % 10
        return canvas.reshape(n, grid * CELL, grid * CELL), y

    def tensors(x: np.ndarray, y: np.ndarray):
        x = torch.tensor(x, dtype=torch.float32).unsqueeze(1)
        return (x - 0.5) / 0.5, torch.tensor(y, dtype=torch.long)

    train_x, train_y = compose(np.random.default_rng([seed, 0]), train_idx, train_items, singles)
    val_x, val_y = compose(np.random.default_rng([seed, 1]), val_idx, val_items, 0.0)
    select = None
    if n_selection:
        seen = {_key(x) for x in train_x} | {_key(x) for x in val_x}
        rng, keep_x, keep_y = np.random.default_rng([seed, 2]), [], []
        for _ in range(100 + 4 * n_selection // SELECTION_CHUNK):
            x, y = compose(rng, held_idx, SELECTION_CHUNK, 0.0)   # fixed chunks: a larger selection extends a smaller
            for xi, yi in zip(x, y):
                k = _key(xi)
                if k not in seen and len(keep_y) < n_selection:
                    seen.add(k)
                    keep_x.append(xi)
                    keep_y.append(yi)
            if len(keep_y) == n_selection:
                break
        else:
            raise HetpruneError(f"digit-grid: cannot draw {n_selection} distinct selection images from "
                                f"{selection_digits} held-out digits (too few distinct compositions)")
        select = TensorDataset(*tensors(np.stack(keep_x), np.array(keep_y)))
    fp = fingerprint({"data": DIGIT_GRID, "train_items": train_items, "val_items": val_items,
                      "selection": n_selection, "val_size": val_size, "seed": seed, "grid": grid,
                      "per_image": per_image, "singles": singles, "shift": shift, "label": "sum-mod-10",
                      "selection_digits": selection_digits, "v": 2})
    train = ShiftedImages(*tensors(train_x, train_y), shift)
    return DataBundle(DIGIT_GRID, train, TensorDataset(*tensors(val_x, val_y)), 10, 1, grid * CELL, fp,
                      selection=select)


def _key(x: np.ndarray) -> bytes:
    """An image's exact pixels, as a short digest (identical images, identical keys)."""
    return hashlib.blake2b(np.ascontiguousarray(x, dtype=np.float64).tobytes(), digest_size=16).digest()


register_embedded(DIGIT_GRID, digit_grid)
