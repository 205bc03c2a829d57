"""Mixup and CutMix of a global batch, drawn from the global step, so every rank and every world size mixes
alike.

timm's ``Mixup`` (batch mode) mixes item ``i`` of a batch with item ``B-1-i`` (the batch flipped), with one
lambda (and one box) per batch drawn from numpy's global generator. Here the lambda and the box of global
step ``t`` of an epoch come from a generator seeded by ``(epoch seed, t)``, and the sampler hands both items of
a pair to the same rank in an order whose flip pairs them again (`hetprune.training.samplers.GlobalBatchSampler`'s
``pairs``): a rank mixes its own share exactly as one process mixes the whole batch, item for item. The box
and the targets are timm's own (``cutmix_bbox_and_lam``, ``mixup_target``: label smoothing folded in).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.config import TrainConfig


def mix_params(cfg: TrainConfig, seed: int, step: int, shape: tuple) -> tuple[float, tuple | None]:
    """``(lambda, cutmix box or None)`` of global step ``step`` of the epoch seeded ``seed``: timm's batch-mode
    draws (``mix_prob``, ``mix_switch_prob``, Beta(alpha, alpha)), from a generator of that step alone."""
    rng = np.random.default_rng([seed, step])
    lam, cutmix = 1.0, False
    if rng.random() < cfg.mix_prob:
        if cfg.mixup > 0 and cfg.cutmix > 0:
            cutmix = bool(rng.random() < cfg.mix_switch_prob)
            alpha = cfg.cutmix if cutmix else cfg.mixup
        else:
            cutmix = cfg.cutmix > 0
            alpha = cfg.cutmix if cutmix else cfg.mixup
        lam = float(rng.beta(alpha, alpha))
    if not cutmix:
        return lam, None
    box, lam = _seeded_numpy(int(rng.integers(2 ** 32)), lambda: _cutmix_box(shape, lam))
    return float(lam), tuple(int(v) for v in box)


def _cutmix_box(shape: tuple, lam: float):
    from timm.data.mixup import cutmix_bbox_and_lam

    return cutmix_bbox_and_lam(shape, lam, correct_lam=True)   # lambda corrected by the clipped box's area


def _seeded_numpy(seed: int, fn):
    """``fn()`` with numpy's global generator (timm's box draws from it) seeded, then put back as it was."""
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        return fn()
    finally:
        np.random.set_state(state)


def mix_batch(x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig, num_classes: int, seed: int,
              step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of global batch ``step``, mixed (each item with the one its flip pairs it with) and
    its soft targets (timm's ``mixup_target``, with ``label_smoothing``)."""
    from timm.data.mixup import mixup_target

    lam, box = mix_params(cfg, seed, step, tuple(x.shape))
    if box is not None and lam != 1.0:
        yl, yh, xl, xh = box
        x = x.clone()
        x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
    elif lam != 1.0:
        x = x * lam + x.flip(0) * (1.0 - lam)
    return x, mixup_target(y, num_classes, lam, cfg.label_smoothing)
