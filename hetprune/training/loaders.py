"""The loaders and their cache: one epoch's batches of a data set (`loader`), loaders kept with their worker
processes across epochs and stopped when a run ends (`close_loaders`, `closing_loaders`), the seeded subsets a
fine-tune reads (`subset`), the seeding of a run and of each loader worker, and how many workers read image
files (`default_workers`)."""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..core.errors import HetpruneError
from .samplers import EpochItems, EpochKeys, GlobalBatchSampler


def default_workers() -> int:
    """Loader processes for image files: the CPUs this process may use, shared among the local processes
    (one per GPU), less one for the process itself; at least one. No fixed cap: with the paper's augmentations
    one core reads a few hundred images a second, and a GPU trains DeiT-B at thousands
    (benchmarks/results/loader-throughput.md)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, available_cpus() // max(1, local) - 1)


def available_cpus() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def busy_elsewhere(samples: int = 9, every_s: float = 0.02) -> int:
    """The CPUs of this process that other programs keep busy right now: the kernel's count of runnable threads
    (``/proc/loadavg``'s fourth field, the median of a few readings a few milliseconds apart) less this one, which
    is running as it reads, in the share of the machine's CPUs this process may use (the count is the whole
    machine's); where there is no such file, the 1-minute load average."""
    import statistics
    import time

    counts = []
    for _ in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as fh:
                counts.append(int(fh.read().split()[3].split("/")[0]))
        except (OSError, IndexError, ValueError):
            return round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0
        time.sleep(every_s)
    share = available_cpus() / max(1, os.cpu_count() or 1)
    return max(0, round((statistics.median(counts) - 1) * share))


def row_threads(jobs: int = 1, workers: int = 0, busy: int = 0) -> int:
    """Torch threads for one row trained on the CPU: the CPUs this process may use less those other programs keep
    busy (``busy``: `busy_elsewhere`), shared among the ``jobs`` rows that run at once, less one for each loader
    worker of the row (they decode on cores of their own); at least one. A thread on a core something else also
    wants waits for it at every operation: on a busy 2-core machine a fine-tune with 2 threads trained at 26-28
    images/s, with 1 thread at 211-332."""
    return max(1, (available_cpus() - max(0, busy)) // max(1, jobs) - max(0, workers))


@contextlib.contextmanager
def row_threading(device, jobs: int = 1, workers: int = 0, log=None):
    """Train a row on the CPU with `row_threads` torch threads (never more than the process had), saying so in
    one line; the threads are put back afterwards (timing a model wants them all). Nothing changes on a GPU."""
    if getattr(device, "type", str(device)) != "cpu":
        yield None
        return
    before, busy = torch.get_num_threads(), busy_elsewhere()
    threads = min(before, row_threads(jobs, workers, busy))
    if log is not None:
        log(f"cpu: {threads} torch thread(s) per row ({available_cpus()} CPUs, {busy} kept busy by other programs, "
            f"{jobs} row(s) at a time, {workers} loader worker(s) each)")
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


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
