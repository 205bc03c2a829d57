"""The training features of a long fine-tune (issue 42): each option changes what the trainer does, and each
test fails when its option is ignored."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from hetprune import HetpruneError, config
from hetprune.data import DataBundle, GlobalBatchSampler, digits
from hetprune.train import ClassificationSource, TrainConfig, train, training_loss

from conftest import TINY_SPEC


@pytest.fixture(scope="module")
def data():
    return digits()


def tiny(seed: int = 0):
    from hetprune.models import build

    torch.manual_seed(seed)
    return build(TINY_SPEC)


def same_weights(a, b, atol: float = 0.0) -> bool:
    return all(torch.allclose(x, y, atol=atol, rtol=0) for x, y in zip(a.state_dict().values(),
                                                                       b.state_dict().values()))


def rows_by_item(source, cfg, seed: int, rank: int, world: int, steps: int = 2) -> dict:
    """Item index -> (mixed image, soft target) for the first ``steps`` global batches of one rank."""
    from hetprune.data import subset

    n = len(subset(source.data.train, cfg.subset, cfg.seed))
    sampler = GlobalBatchSampler(n, cfg.batch_size, seed, rank=rank, world=world, pad_empty=world > 1,
                                 pairs=cfg.mixes)
    out = {}
    batches = source.epoch(cfg, seed, rank, world, torch.device("cpu"), world > 1)
    for (batch, share, whole), items, _ in zip(batches, sampler, range(steps)):
        x, y = batch
        for i, item in enumerate(items[:share]):
            out[item] = (x[i], y[i])
    return out


# -- 1. mixup and cutmix -----------------------------------------------------------------------------------

MIX = dict(epochs=1, batch_size=15, subset=45, mixup=0.8, cutmix=1.0, mix_switch_prob=0.5, label_smoothing=0.1)


@pytest.mark.parametrize("world", [2, 3])
def test_a_global_batch_is_mixed_alike_at_every_world_size(data, world):
    source = ClassificationSource(data)
    for seed in (0, 1, 2, 3):   # mixup steps and cutmix steps (the switch draws both)
        cfg = TrainConfig(**MIX, seed=seed)
        single = rows_by_item(source, cfg, seed, 0, 1)
        ranks = {}
        for r in range(world):
            ranks.update(rows_by_item(source, cfg, seed, r, world))
        assert sorted(ranks) == sorted(single)
        for item, (x, y) in single.items():
            assert torch.equal(ranks[item][0], x) and torch.equal(ranks[item][1], y), (seed, item)


def test_mixing_mixes_pairs_and_folds_label_smoothing_into_the_targets(data):
    from hetprune.mixing import mix_params

    source = ClassificationSource(data)
    kinds = set()
    for seed in range(6):
        cfg = TrainConfig(**MIX, seed=seed)
        lam, box = mix_params(cfg, seed, 0, (15, 1, 16, 16))
        kinds.add("cutmix" if box else "mixup")
        mixed = rows_by_item(source, cfg, seed, 0, 1, steps=1)
        plain = rows_by_item(source, TrainConfig(epochs=1, batch_size=15, subset=45, seed=seed), seed, 0, 1, steps=1)
        order = GlobalBatchSampler(45, 15, seed).global_batches()[0]
        for i, item in enumerate(order):
            partner = order[len(order) - 1 - i]
            x, y = mixed[item]
            if box is None:
                expected = plain[item][0] * lam + plain[partner][0] * (1 - lam)
                assert torch.allclose(x, expected, atol=1e-6)
            off = 0.1 / 10
            target = torch.full((10,), off)
            target[plain[item][1]] += (1 - 0.1) * lam
            target[plain[partner][1]] += (1 - 0.1) * (1 - lam)
            assert torch.allclose(y, target, atol=1e-6), (seed, item)
        assert any(not torch.equal(mixed[k][0], plain[k][0]) for k in order)
    assert kinds == {"cutmix", "mixup"}


def test_mixed_training_differs_from_plain_training(data):
    plain, mixed = tiny(), tiny()
    train(plain, data, TrainConfig(epochs=1, batch_size=16, subset=32, kd="none"), progress=False)
    train(mixed, data, TrainConfig(epochs=1, batch_size=16, subset=32, kd="none", mixup=0.8), progress=False)
    assert not same_weights(plain, mixed)


# -- 2. label smoothing --------------------------------------------------------------------------------------

def test_label_smoothing_without_mixup_is_timms_and_reaches_training(data):
    from timm.loss import LabelSmoothingCrossEntropy

    logits, labels = torch.randn(6, 10), torch.randint(0, 10, (6,))
    cfg = TrainConfig(kd="none", label_smoothing=0.1)
    got = training_loss(logits, labels, None, cfg)
    assert got.item() == pytest.approx(LabelSmoothingCrossEntropy(0.1)(logits, labels).item(), rel=1e-6)
    assert got.item() != pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-3)
    plain, smoothed = tiny(), tiny()
    train(plain, data, TrainConfig(epochs=1, batch_size=16, subset=32, kd="none"), progress=False)
    train(smoothed, data, TrainConfig(epochs=1, batch_size=16, subset=32, kd="none", label_smoothing=0.3),
          progress=False)
    assert not same_weights(plain, smoothed)


# -- the settings: off by default, out of the keys, one clear error each -----------------------------------

def test_the_new_options_are_off_and_absent_by_default():
    s = config.resolve({})
    assert s["finetune"] == config.CORE_DEFAULTS["finetune"]
    assert set(TrainConfig().to_dict()) == {"epochs", "lr", "batch_size", "weight_decay", "warmup_epochs", "kd",
                                            "kd_temperature", "kd_alpha", "subset", "seed", "device", "workers",
                                            "amp"}
    s = config.resolve({}, sets=["finetune.mixup=0.8", "finetune.ema_decay=0.99996", "finetune.drop_path=0.1"])
    assert s["finetune"]["mixup"] == 0.8 and s["finetune"]["drop_path"] == 0.1
    assert "mixup" not in s["short_finetune"]


@pytest.mark.parametrize("item,message", [
    ("finetune.keep=worst", "keep must be one of last, best, ema, got 'worst'"),
    ("finetune.lr_scale=cubic", "lr_scale must be one of none, linear, sqrt"),
    ("finetune.clip_mode=max", "clip_mode must be one of norm, value, agc"),
    ("finetune.mixup=-1", "mixup is an alpha >= 0"),
    ("finetune.mix_prob=2", "mix_prob is a probability within [0, 1]"),
    ("finetune.label_smoothing=1", "label_smoothing must be within [0, 1)"),
    ("finetune.drop_path=1.5", "drop_path must be within [0, 1) or null"),
    ("finetune.ema_decay=1", "ema_decay must be within [0, 1)"),
    ("finetune.accum_steps=0", "accum_steps must be >= 1"),
    ("finetune.keep=best", "keep: best needs eval_every >= 1"),
    ("finetune.keep=ema", "keep: ema needs ema_decay > 0"),
    ("finetune.kd_token=true", "kd_token distils into the distillation token: it needs kd soft or hard"),
    ("finetune.teacher_checkpoint=t.pth", "name its timm model in teacher too"),
    ("finetune.drop_path=x", "finetune.drop_path = 'x' is not a number or null"),
    ("finetune.mixupp=1", "unknown key 'finetune.mixupp'"),
])
def test_each_new_option_has_one_clear_error(item, message):
    sets = [item] + (["finetune.kd=none"] if "kd_token" in item else [])
    with pytest.raises(HetpruneError) as exc:
        config.resolve({}, sets=sets)
    assert message in str(exc.value)
