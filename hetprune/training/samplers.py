"""The samplers: seeded global batches split across ranks (`GlobalBatchSampler`), and the epoch carried with
each item to the data set (`EpochKeys`, `EpochItems`, `set_epoch`), so a run draws the same whatever the number
of ranks and loader workers."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, Sampler, Subset

from ..core.errors import HetpruneError


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
