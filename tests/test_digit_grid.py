"""The third embedded benchmark, digit grid: determinism, split hygiene, a label no single patch carries, shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetprune.core.errors import HetpruneError
from hetprune.training.embedded_data import _digits_split
from hetprune.training.digit_grid import (
    DIGIT_GRID,
    DIGIT_GRID_SPEC,
    DIGIT_GRID_TRAINING,
    digit_grid,
)

SMALL = dict(train_items=200, val_items=100, selection=100)


def cells_of(x: torch.Tensor, grid: int = 4) -> torch.Tensor:
    """Images (N, 1, 8g, 8g) as their cells (N, g*g, 64), in reading order."""
    n = x.shape[0]
    return x.reshape(n, grid, 8, grid, 8).permute(0, 1, 3, 2, 4).reshape(n, grid * grid, 64)


def digit_lookup(val_size: int = 450, seed: int = 0):
    """Each scikit-learn digit's normalised pixels (as the bundle makes them) -> (label, in train pool, in val pool)."""
    images, labels, train_idx, _ = _digits_split(val_size, seed)
    norm = ((torch.tensor(images, dtype=torch.float32) - 0.5) / 0.5).reshape(-1, 64)
    train_set, lookup = set(train_idx.tolist()), {}
    for i, row in enumerate(norm):
        label, in_train, in_val = lookup.get(row.numpy().tobytes(), (int(labels[i]), False, False))
        assert label == int(labels[i]), "two digits with the same pixels and different labels"
        lookup[row.numpy().tobytes()] = (label, in_train or i in train_set, in_val or i not in train_set)
    return lookup


def decode(x: torch.Tensor, lookup: dict, pool: str, grid: int = 4):
    """Per image, the digit of each cell (-1: blank), checking each digit comes from ``pool`` ("train"/"val")."""
    out = np.full((x.shape[0], grid * grid), -1)
    for n, cells in enumerate(cells_of(x, grid)):
        for c, cell in enumerate(cells):
            if bool((cell == -1).all()):
                continue
            found = lookup.get(cell.numpy().tobytes())
            assert found is not None, "a cell is neither blank nor an (unshifted) scikit-learn digit"
            assert found[1 if pool == "train" else 2], f"a cell of a {pool} image is a digit of the other pool"
            out[n, c] = found[0]
    return out


def test_deterministic_for_a_seed_and_fingerprinted():
    a, b = digit_grid(**SMALL), digit_grid(**SMALL)
    for left, right in ((a.train.images, b.train.images), (a.train.labels, b.train.labels),
                        (a.val.tensors[0], b.val.tensors[0]), (a.val.tensors[1], b.val.tensors[1]),
                        (a.selection.tensors[0], b.selection.tensors[0]),
                        (a.selection.tensors[1], b.selection.tensors[1])):
        assert torch.equal(left, right)
    assert a.fingerprint == b.fingerprint
    other = digit_grid(**SMALL, seed=1)
    assert other.fingerprint != a.fingerprint
    for left, right in ((a.train.images, other.train.images), (a.val.tensors[0], other.val.tensors[0]),
                        (a.selection.tensors[0], other.selection.tensors[0])):
        assert not torch.equal(left, right)
    fingerprints = {a.fingerprint}
    for change in (dict(train_items=201), dict(val_items=101), dict(selection=101), dict(singles=0.5),
                   dict(per_image=3), dict(shift=1)):
        fingerprints.add(digit_grid(**{**SMALL, **change}).fingerprint)
    assert len(fingerprints) == 7
    # the selection's size changes neither train nor val; 0 means none, None the default 1000
    bigger = digit_grid(**{**SMALL, "selection": 150})
    assert torch.equal(bigger.train.images, a.train.images) and torch.equal(bigger.val.tensors[0], a.val.tensors[0])
    assert torch.equal(bigger.selection.tensors[0][:100], a.selection.tensors[0])
    assert digit_grid(train_items=20, val_items=10, selection=0).selection is None
    assert len(digit_grid(train_items=20, val_items=10).selection) == 1000


def test_splits_are_apart_and_labels_are_the_sum_mod_10():
    data = digit_grid(train_items=600, val_items=300, selection=300)
    lookup = digit_lookup()
    train_x, val_x, sel_x = data.train.images, data.val.tensors[0], data.selection.tensors[0]
    # exact pixels: no selection image is a training or val image, nor twice in the selection
    train_keys = {x.numpy().tobytes() for x in train_x}
    val_keys = {x.numpy().tobytes() for x in val_x}
    sel_keys = [x.numpy().tobytes() for x in sel_x]
    assert len(set(sel_keys)) == len(sel_keys) and not set(sel_keys) & (train_keys | val_keys)
    # the selection's digits are held out of every training image (cells compared on their exact pixels)
    def digit_cells(x):
        return {c.numpy().tobytes() for c in cells_of(x).reshape(-1, 64) if not bool((c == -1).all())}

    assert not digit_cells(sel_x) & digit_cells(train_x)
    assert not digit_cells(sel_x) & digit_cells(digit_grid(train_items=600, val_items=300, selection=0).train.images)
    for x, y, pool, singles_allowed in ((train_x, data.train.labels, "train", True),
                                        (val_x, data.val.tensors[1], "val", False),
                                        (sel_x, data.selection.tensors[1], "train", False)):
        digits = decode(x, lookup, pool)   # val digits only in val; train digits only in train and selection
        shown = (digits >= 0).sum(axis=1)
        assert set(shown.tolist()) <= ({1, 2} if singles_allowed else {2})
        assert np.array_equal(np.where(digits >= 0, digits, 0).sum(axis=1) % 10, y.numpy())
    singles = (decode(train_x, lookup, "train") >= 0).sum(axis=1) == 1
    assert 0.15 < singles.mean() < 0.35   # about a quarter of the training images shows one digit


def test_selection_is_redrawn_where_it_would_repeat_itself():
    """A tiny composition space (2x2 grid, one digit, 20 held-out digits: 80 images) where a plain draw
    repeats images: the selection still holds each once, and too large a selection is an error."""
    kw = dict(train_items=300, val_items=50, val_size=1700, grid=2, per_image=1, singles=0.0, selection_digits=20)
    data = digit_grid(**kw, selection=60)
    train_keys = {x.numpy().tobytes() for x in data.train.images}
    sel_keys = [x.numpy().tobytes() for x in data.selection.tensors[0]]
    assert len(set(sel_keys)) == 60 and not set(sel_keys) & train_keys
    with pytest.raises(HetpruneError, match="cannot draw 100 distinct selection images from 20 held-out digits"):
        digit_grid(**kw, selection=100)
    with pytest.raises(HetpruneError, match="selection_digits must be"):
        digit_grid(**{**kw, "selection_digits": 0})


def _fit_score(train_features, train_labels, val_features, val_labels) -> float:
    """Val top-1 of a linear classifier fitted on the training features (a ridge classifier, one vs rest: a
    logistic regression's lbfgs needs seconds per fit on mostly blank cells, this milliseconds)."""
    from sklearn.linear_model import RidgeClassifier

    clf = RidgeClassifier(alpha=1.0)
    clf.fit(train_features, train_labels)
    return 100.0 * float((clf.predict(val_features) == val_labels).mean())


def test_one_patch_is_at_chance_while_all_patches_determine_the_label():
    """Linear learners that see pixels: one cell (at each position; or a digit's cell wherever it is, with its
    position) is at the best constant guess on val, while reading all cells gets the label; the same
    one-patch learner is far above chance on a label one patch does carry (the first digit)."""
    from sklearn.linear_model import LogisticRegression

    data = digit_grid(train_items=4000, val_items=2000, selection=0)
    lookup = digit_lookup()
    tx, ty = cells_of(data.train.images).numpy(), data.train.labels.numpy()
    vx, vy = cells_of(data.val.tensors[0]).numpy(), data.val.tensors[1].numpy()
    constant = 100.0 * np.bincount(vy, minlength=10).max() / len(vy)
    assert constant < 13

    # (a) each cell position alone: its 64 pixels
    for c in range(16):
        assert _fit_score(tx[:, c], ty, vx[:, c], vy) < constant + 3, f"cell {c} alone is above chance"

    # (b) the most informative single patch: one cell holding a digit (the first one in reading order, or
    # a random one of them), its pixels and its position
    rng = np.random.default_rng(0)

    def one_patch(cells, pick_first):
        occupied = (cells != -1).any(axis=2)
        picks = [np.flatnonzero(row)[0] if pick_first else rng.choice(np.flatnonzero(row)) for row in occupied]
        return np.concatenate([cells[np.arange(len(cells)), picks], np.eye(16)[picks]], axis=1)

    for pick_first in (True, False):
        assert _fit_score(one_patch(tx, pick_first), ty, one_patch(vx, pick_first), vy) < constant + 3

    # the test can fail: were the label the first digit in reading order, one patch would carry it
    t_first = np.array([d[d >= 0][0] for d in decode(data.train.images, lookup, "train")])
    v_first = np.array([d[d >= 0][0] for d in decode(data.val.tensors[0], lookup, "val")])
    assert _fit_score(one_patch(tx, True), t_first, one_patch(vx, True), v_first) > constant + 50

    # (c) all cells: a pixel reader (logistic regression on the training digits' pixels) reads every cell;
    # a logistic regression on the products of the readings of every two cells (digit a here, b there)
    # learns the label from them
    images, labels, train_idx, _ = _digits_split(450, 0)
    pixels = ((images.reshape(-1, 64) - 0.5) / 0.5).astype(np.float32)
    reader = LogisticRegression(max_iter=500).fit(pixels[train_idx], labels[train_idx])

    def all_cells(cells):
        n = len(cells)
        probs = reader.predict_proba(cells.reshape(-1, 64)).reshape(n, 16, 10)
        probs *= (cells != -1).any(axis=2)[..., None]     # a blank cell reads as nothing
        total, squares = probs.sum(axis=1), np.einsum("nci,ncj->nij", probs, probs)
        pairs = np.einsum("ni,nj->nij", total, total) - squares   # sum over ordered pairs of distinct cells
        return np.concatenate([pairs.reshape(n, 100), total], axis=1)

    assert _fit_score(all_cells(tx), ty, all_cells(vx), vy) > 85


def test_shapes_classes_values_and_the_base_model():
    data = digit_grid(**SMALL)
    assert (data.name, data.num_classes, data.in_chans, data.img_size) == (DIGIT_GRID, 10, 1, 32)
    assert (len(data.train), len(data.val), len(data.selection)) == (200, 100, 100)
    x, y = data.train[0]
    assert x.shape == (1, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.long
    for images, labels in ((data.train.images, data.train.labels), data.val.tensors, data.selection.tensors):
        assert images.shape[1:] == (1, 32, 32)
        assert float(images.min()) == -1.0 and float(images.max()) <= 1.0   # background -1, ink up to 1
        assert int(labels.min()) >= 0 and int(labels.max()) <= 9
    assert len(torch.cat([data.val.tensors[1], data.train.labels]).unique()) == 10
    assert data.describe()["selection"] == 100
    # 2 or 3 digits per image, no more non-blank cells than that
    three = digit_grid(train_items=50, val_items=50, selection=0, per_image=3, singles=0.0)
    assert set((cells_of(three.val.tensors[0]) != -1).any(dim=2).sum(dim=1).tolist()) == {3}
    with pytest.raises(HetpruneError):
        digit_grid(per_image=17)

    from hetprune.model.spec import build

    torch.manual_seed(0)
    model = build(DIGIT_GRID_SPEC).eval()
    assert len(model.blocks) == 12 and model.blocks[0].attn.num_heads >= 3
    assert model.patch_embed.num_patches == 16
    with torch.no_grad():
        assert model(data.val.tensors[0][:2]).shape == (2, 10)
    assert set(DIGIT_GRID_TRAINING) >= {"epochs", "lr", "batch_size", "weight_decay", "seed", "warmup_epochs"}
