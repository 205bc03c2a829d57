"""Shared fixtures: tiny ViTs (depth <= 4, dim <= 64) and the digits data.

Every test runs with its own cache folder, so nothing is read from or
written to the user's real cache.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import hetprune

from hetprune.model.spec import ModelSpec, build

TINY_KWARGS = dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=4, num_heads=2,
                   init_values=0.1)
TINY_SPEC = ModelSpec("vit_tiny_patch16_224", TINY_KWARGS)

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HETPRUNE_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HETPRUNE_NO_PROGRESS", "1")


@pytest.fixture
def tiny_spec() -> ModelSpec:
    return copy.deepcopy(TINY_SPEC)


@pytest.fixture
def tiny_model(tiny_spec):
    torch.manual_seed(0)
    return build(tiny_spec)


def seeded_tiny(seed: int = 0):
    """The tiny ViT with its weights drawn from ``seed``: a student and a teacher that differ."""
    torch.manual_seed(seed)
    return build(TINY_SPEC)


@pytest.fixture(scope="session")
def digits_data():
    from hetprune.training.embedded_data import digits

    return digits()


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
    """A tiny ViT briefly trained on digits, saved as a checkpoint: ``(model, spec, path)``."""
    from hetprune.training.embedded_data import digits
    from hetprune.core.io import save_weights
    from hetprune.training.train import TrainConfig, train

    torch.manual_seed(0)
    model = build(TINY_SPEC)
    train(model, digits(), TrainConfig(epochs=4, lr=2e-3, kd="none", subset=800, warmup_epochs=0), progress=False)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_weights(path, model)
    return model.eval(), copy.deepcopy(TINY_SPEC), path


def tiny_example(n: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 16, 16, generator=gen)


class PluginOf:
    """A plugin object registering the given components with one registration hook."""

    def __init__(self, hook: str, *components):
        def register_all(register):
            for c in components:
                register(c)

        setattr(self, hook, hetprune.hookimpl(register_all))


class CountedStats:
    """os.stat and os.scandir watched: how often each file's metadata was read (``stat`` of an os.scandir entry
    or os.stat itself), by path."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def count(self, path) -> None:
        path = os.fspath(path)
        if path.endswith(".png"):
            self.counts[path] = self.counts.get(path, 0) + 1

    def __enter__(self):
        self.real = os.stat, os.scandir
        real_stat, real_scandir, counter = os.stat, os.scandir, self

        class Entry:
            def __init__(self, entry):
                self._entry = entry

            def __getattr__(self, name):
                return getattr(self._entry, name)

            def stat(self, *args, **kwargs):
                counter.count(self._entry.path)
                return self._entry.stat(*args, **kwargs)

        class Entries:
            def __init__(self, entries):
                self._entries = entries

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._entries.close()

            def __iter__(self):
                return self

            def __next__(self):
                return Entry(next(self._entries))

            def close(self):
                self._entries.close()

        def stat(path, *args, **kwargs):
            counter.count(path)
            return real_stat(path, *args, **kwargs)

        os.stat, os.scandir = stat, lambda *args: Entries(real_scandir(*args))
        return self

    def __exit__(self, *exc):
        os.stat, os.scandir = self.real
