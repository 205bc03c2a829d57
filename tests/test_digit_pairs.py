"""The second embedded benchmark, digit pairs: data, label rule, its base model's cache, and --data on the CLI."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_KWARGS
from hetprune.cli import main
from hetprune.training.data import load_data
from hetprune.training.embedded_data import DIGIT_PAIRS, DIGITS, digit_pairs
from hetprune.core.io import read_json, save_weights
from hetprune.model.spec import ModelSpec, build

SMALL = dict(train_pairs=64, val_pairs=48)
TINY19 = {**TINY_KWARGS, "num_classes": 19}


def test_digit_pairs_shapes_labels_determinism_and_fingerprint():
    a, b = digit_pairs(**SMALL), digit_pairs(**SMALL)
    assert (a.name, a.num_classes, a.in_chans, a.img_size) == (DIGIT_PAIRS, 19, 1, 16)
    assert (len(a.train), len(a.val)) == (64, 48)
    x, y = a.train[0]
    assert x.shape == (1, 16, 16) and x.dtype == torch.float32 and 0 <= int(y) <= 18
    assert torch.equal(a.val.tensors[0], b.val.tensors[0]) and torch.equal(a.train.images, b.train.images)
    assert a.fingerprint == b.fingerprint
    other = digit_pairs(**SMALL, seed=1)
    assert other.fingerprint != a.fingerprint and not torch.equal(other.val.tensors[0], a.val.tensors[0])
    assert digit_pairs(train_pairs=65, val_pairs=48).fingerprint != a.fingerprint
    assert load_data(DIGITS).fingerprint != a.fingerprint


def test_each_pair_is_two_digits_of_its_own_split_labelled_by_their_sum():
    """Every half is one scikit-learn digit, stretched to 16x8; val halves come only from val digits."""
    from hetprune.training.embedded_data import _digits_split

    images, labels, train_idx, val_idx = _digits_split(450, 0)
    stretched = F.interpolate(torch.tensor(images, dtype=torch.float32).unsqueeze(1), size=(16, 8),
                              mode="bilinear", align_corners=False)
    stretched = ((stretched - 0.5) / 0.5).flatten(1)
    data = digit_pairs(**SMALL)

    def digit_of(half, pool, blank_allowed):
        """The label of the digit this half shows (0 for a blank half), checking it comes from ``pool``."""
        if blank_allowed and bool((half == -1).all()):
            return 0, True
        dist = torch.cdist(half, stretched).squeeze(0)
        assert float(dist.min()) < 1e-4, "a half is neither an unshifted digit nor blank"
        i = int(dist.argmin())
        # identical images may exist in both splits; one of this split must match
        assert float(torch.cdist(half, stretched[pool]).min()) < 1e-4, "a half comes from the other split"
        return int(labels[i]), False

    def check(x, y, pool, blank_allowed):
        (a, blank_a), (b, blank_b) = (digit_of(h.flatten(1), pool, blank_allowed) for h in (x[..., :8], x[..., 8:]))
        assert not (blank_a and blank_b)
        assert int(y) == a + b
        return blank_a or blank_b

    for i in range(len(data.val)):  # every val image is a pair of val digits
        assert not check(*data.val[i], val_idx, False)
    blanks = sum(check(data.train.images[i], data.train.labels[i], train_idx, True) for i in range(64))
    assert 0 < blanks < 40  # about a quarter shows one digit
    sums = torch.cat([data.val.tensors[1], data.train.labels])
    assert int(sums.min()) >= 0 and int(sums.max()) <= 18 and len(sums.unique()) > 10


def test_embedded_pairs_model_is_trained_once_cached_apart_from_digits(tmp_path):
    from hetprune.training.embedded import embedded_model, embedded_model_folder, embedded_model_info

    spec = ModelSpec("vit_tiny_patch16_224", TINY19)
    training = {"epochs": 1, "warmup_epochs": 0}
    assert embedded_model_folder(DIGIT_PAIRS, spec, training) != embedded_model_folder(DIGITS, spec, training)
    assert embedded_model_folder(DIGIT_PAIRS).name.startswith("digit-pairs-")
    lines = []
    first = embedded_model(DIGIT_PAIRS, spec, training, progress=False, log=lines.append)
    assert any("training the embedded base model (digit-pairs" in line for line in lines)
    info = embedded_model_info(DIGIT_PAIRS, spec, training)
    assert info["data"] == DIGIT_PAIRS and 0 <= info["val_top1"] <= 100
    lines.clear()
    again = embedded_model(DIGIT_PAIRS, spec, training, progress=False, log=lines.append)
    assert not lines  # read from the cache
    for p, q in zip(first.state_dict().values(), again.state_dict().values()):
        assert torch.equal(p, q)


def test_data_option_picks_the_embedded_spec_and_refuses_unknown_names():
    import argparse

    from hetprune.cli.commands.common import model_spec
    from hetprune.core.errors import HetpruneError
    from hetprune.model.spec import DIGIT_PAIRS_SPEC, DIGITS_SPEC

    def args(data):
        return argparse.Namespace(model=None, model_kwargs=None, pretrained=False, checkpoint=None, data=data)

    assert model_spec(args(None)) == DIGITS_SPEC and model_spec(args(DIGITS)) == DIGITS_SPEC
    assert model_spec(args(DIGIT_PAIRS)) == DIGIT_PAIRS_SPEC
    with pytest.raises(HetpruneError, match=r"'digit-triples' is neither an embedded data set \(digits, digit-pairs, digit-grid\)"):
        model_spec(args("digit-triples"))


def test_prune_runs_end_to_end_on_digit_pairs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    save_weights(tmp_path / "tiny19.safetensors", build(ModelSpec("vit_tiny_patch16_224", TINY19)))
    out = tmp_path / "out"
    rc = main(["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY19), "--checkpoint",
               str(tmp_path / "tiny19.safetensors"), "--data", DIGIT_PAIRS, "--budget", "1", "--strategy",
               "act-only", "--scorer", "magnitude", "--set", "finetune.epochs=0", "--out", str(out)])
    assert rc == 0
    data = read_json(out / "recipe.json")["provenance"]["data"]
    assert data["name"] == DIGIT_PAIRS and data["num_classes"] == 19
    assert data["fingerprint"] == digit_pairs().fingerprint
    assert 0 <= read_json(out / "report.json")["top1"] <= 100
