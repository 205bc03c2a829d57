"""The embedded base models ship with the package: read by hash, never trained on a first run; a retrain
goes to the cache and, on the same thread count, gives the same weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hetprune import HetpruneError
from hetprune.training import embedded
from hetprune.cli import main
from hetprune.training.embedded_data import DIGIT_PAIRS, DIGITS
from hetprune.core.io import save_weights
from hetprune.model.spec import ModelSpec

TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=16, depth=2, num_heads=2)
TINY_TRAINING = {"epochs": 1, "warmup_epochs": 0, "batch_size": 128}


@pytest.mark.parametrize("name", [DIGITS, DIGIT_PAIRS])
def test_the_default_base_models_ship_and_load_without_training(name):
    lines = []
    model = embedded.embedded_model(name, progress=False, log=lines.append)
    assert lines == []                                          # nothing trained, nothing cached
    assert not (embedded.embedded_model_folder(name) / "model.safetensors").exists()
    info = embedded.embedded_model_info(name)
    assert info["shipped"] and info["spec"] == embedded.benchmark(name).spec.to_dict()
    assert embedded.file_sha256(embedded.SHIPPED / info["file"]) == info["sha256"]
    assert info["made_by"].startswith("python scripts/train_embedded.py --data " + name)
    assert 50 < info["val_top1"] <= 100
    assert sum(p.numel() for p in model.parameters()) > 1e6 and not model.training


def fake_shipping(tmp_path, monkeypatch, weights: dict, spec: ModelSpec, training: dict) -> None:
    """Point the package's weights folder at ``tmp_path`` shipping ``weights`` for digits' ``spec``."""
    save_weights(tmp_path / "digits.safetensors", weights)
    index = {DIGITS: {"file": "digits.safetensors", "sha256": embedded.file_sha256(tmp_path / "digits.safetensors"),
                      "spec": spec.to_dict(), "training": embedded.benchmark(DIGITS).settings(training),
                      "val_top1": 0.0, "made_by": "test"}}
    (tmp_path / "embedded.json").write_text(json.dumps(index))
    monkeypatch.setattr(embedded, "SHIPPED", tmp_path)
    monkeypatch.setattr(embedded, "SHIPPED_INDEX", tmp_path / "embedded.json")


def test_a_retrain_is_cached_apart_and_reproduces_the_shipped_weights(tmp_path, monkeypatch):
    spec = ModelSpec("vit_tiny_patch16_224", TINY)
    lines = []
    trained = embedded.embedded_model(DIGITS, spec, TINY_TRAINING, progress=False, log=lines.append)
    assert any("training the embedded base model" in x for x in lines)
    fake_shipping(tmp_path / "pkg", monkeypatch, trained.state_dict(), spec, TINY_TRAINING)
    shutil.rmtree(embedded.embedded_model_folder(DIGITS, spec, TINY_TRAINING))   # an empty cache

    lines.clear()
    shipped = embedded.embedded_model(DIGITS, spec, TINY_TRAINING, progress=False, log=lines.append)
    assert lines == [] and embedded.embedded_model_info(DIGITS, spec, TINY_TRAINING)["shipped"]
    retrained = embedded.embedded_model(DIGITS, spec, TINY_TRAINING, progress=False, log=lines.append,
                                        retrain=True)
    assert any("training the embedded base model" in x for x in lines)      # trained, not read from the package
    assert (embedded.embedded_model_folder(DIGITS, spec, TINY_TRAINING) / "model.safetensors").is_file()
    meta = embedded.embedded_model_info(DIGITS, spec, TINY_TRAINING, retrain=True)
    assert not meta.get("shipped") and meta["threads"] == torch.get_num_threads()
    for k, v in shipped.state_dict().items():                               # same thread count, same weights
        assert torch.equal(v, retrained.state_dict()[k]), k
    # another schedule is not what the package ships: trained here, not read from it
    assert embedded.shipped_entry(DIGITS, spec, {**TINY_TRAINING, "epochs": 2}) is None


def test_a_changed_or_missing_shipped_file_is_an_error_not_another_model(tmp_path, monkeypatch):
    spec = ModelSpec("vit_tiny_patch16_224", TINY)
    torch.manual_seed(0)
    fake_shipping(tmp_path, monkeypatch, embedded.build(spec).state_dict(), spec, TINY_TRAINING)
    with open(tmp_path / "digits.safetensors", "r+b") as f:    # one byte of the weights changed
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(HetpruneError, match=r"has SHA-256 \w+…, not the \w+… that embedded.json records"):
        embedded.embedded_model(DIGITS, spec, TINY_TRAINING, progress=False)
    (tmp_path / "digits.safetensors").unlink()
    with pytest.raises(HetpruneError, match=r"digits.safetensors is missing .*--retrain-base"):
        embedded.embedded_model(DIGITS, spec, TINY_TRAINING, progress=False)


def test_retrain_base_goes_with_the_embedded_model_only(tmp_path, capsys):
    rc = main(["prune", "--model", "vit_tiny_patch16_224", "--retrain-base", "--budget", "2", "--data", str(tmp_path),
               "--out", str(tmp_path / "o")])
    assert rc == 2 and "--retrain-base retrains the embedded base model" in capsys.readouterr().err
