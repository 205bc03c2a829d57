"""What a model is pruned for: its data, loss, metric and, optionally, its owner's training loop.

Every strategy talks to a [`Task`][hetprune.training.task.Task] and never to a data set, a loss or a
training loop directly, so the same strategy prunes a classifier for top-1
with hetprune's KD trainer or a segmentation backbone for mIoU with the
user's own loop.

* [`Task`][hetprune.training.task.Task] is the user's: ``train``/``val`` are anything re-iterable
  that yields batches (a DataLoader), ``loss(model, batch)`` returns a scalar
  tensor, ``metric(model, val)`` a number (``higher_is_better`` says which way
  is good), and ``finetune(model, teacher, schedule)``, if given, is called
  for every fine-tune hetprune would run, with the [`Schedule`][hetprune.training.task.Schedule] its own
  trainer would have used.
* `classification` is today's default: a `DataBundle`
  (embedded digits, an ImageFolder), cross-entropy + KD, top-1, hetprune's
  trainer with per-epoch checkpoints and torchrun.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..core import contract, devices, tensors
from ..core import distributed as dist
from ..core.keys import fingerprint as fingerprint_of
from ..core.config import TrainConfig
from .bundle import DataBundle, example_batch
from .loaders import loader, subset
from ..core.errors import HetpruneError, switch
from .resume import code_key
from .train import ClassificationSource, evaluate, evaluate_dataset, train


@dataclass(frozen=True)
class Schedule:
    """One fine-tune hetprune asks a Task for.

    ``stage`` names it (``point``: one MAP point; ``gate``: gate-taylor's
    weight training between removals; ``finetune``: the fine-tune after
    pruning; ``width-finetune``, ``share``: HetDPT+'s). ``config`` is what
    hetprune's own trainer would use: epochs, learning rate, batch size, how
    many training items (``subset``), the KD mode and the seed.
    """

    stage: str
    config: TrainConfig

    @property
    def epochs(self) -> int:
        return self.config.epochs

    @property
    def lr(self) -> float:
        return self.config.lr

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def subset(self) -> int | None:
        return self.config.subset


SPLITS = ("val", "selection")   # what a task evaluates on: the reported split, and the one choices are made on


class Task:
    """A user's task: data, loss, metric, and optionally a training loop (see the module docstring).

    ``fingerprint`` keys resumable state (MAP points, fine-tune checkpoints)
    to the data: pass one that changes when your data changes. Without it,
    hetprune hashes the first batch of each split and the split sizes.
    ``example`` is an input batch for cost counting and exactness checks
    (default: the input of the first validation batch). ``selection`` is
    a held-out part of the training data (batches as ``val``, none of them
    in ``train``): every choice a strategy makes (MAP points, checks, a best
    epoch, ...) is measured on it, never on ``val``, which only reports the
    result. Without one, choices are measured on ``val`` and the report says so.
    """

    def __init__(self, train: Iterable, val: Iterable, loss: Callable[[nn.Module, Any], torch.Tensor],
                 metric: Callable[[nn.Module, Iterable], float], higher_is_better: bool = True,
                 finetune: Callable[[nn.Module, nn.Module, Schedule], Any] | None = None,
                 metric_name: str = "metric", example: torch.Tensor | None = None,
                 fingerprint: str | None = None, name: str = "task", selection: Iterable | None = None):
        for what, value in (("train", train), ("val", val)) + ((("selection", selection),) if selection is not None
                                                                 else ()):
            if value is None or not hasattr(value, "__iter__"):
                raise HetpruneError(f"Task {what} must be re-iterable batches (a DataLoader or a list), "
                                    f"got {type(value).__name__}")
            if iter(value) is value:
                raise HetpruneError(f"Task {what} is an iterator, which runs dry after one pass; pass "
                                    "something re-iterable (a DataLoader, a list of batches)")
        for what, value in (("loss", loss), ("metric", metric)):
            if not callable(value):
                raise HetpruneError(f"Task {what} must be a function, got {type(value).__name__}")
        if finetune is not None and not callable(finetune):
            raise HetpruneError(f"Task finetune must be a function (model, teacher, schedule) or None, "
                                f"got {type(finetune).__name__}")
        self._set(train, val, loss, metric, higher_is_better, finetune, metric_name, example, fingerprint, name,
                  selection)

    def _set(self, train, val, loss, metric, higher_is_better, finetune, metric_name, example, fingerprint, name,
             selection=None):
        self.train, self.val, self.selection = train, val, selection
        self._loss, self._metric, self._finetune = loss, metric, finetune
        self.higher_is_better = bool(higher_is_better)
        self.metric_name, self.name = str(metric_name), str(name)
        self._example, self._fingerprint = example, fingerprint

    # -- what strategies call ---------------------------------------------------------------------
    @property
    def own_finetune(self) -> bool:
        """Whether the task trains in its own loop (``finetune``) rather than hetprune's."""
        return self._finetune is not None

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The scalar loss scorers differentiate (one batch, already on the model's device)."""
        value = self._loss(model, batch)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise HetpruneError(f"the task's loss must return a scalar tensor, got {_describe(value)}")
        return value.reshape(())

    @property
    def choice_split(self) -> str:
        """The split choices are measured on: ``selection`` where the task has one, else ``val``."""
        return "selection" if self.selection is not None else "val"

    def split_data(self, split: str):
        """The data of ``split`` (``val`` or ``selection``). Reading ``val`` while a strategy chooses
        something is an error for a task with a selection split (`hetprune.core.contract.check_val_read`)."""
        if split not in SPLITS:
            raise HetpruneError(f"a task evaluates on split val or selection, not {split!r}")
        if split == "selection":
            if self.selection is None:
                raise HetpruneError(f"the task {self.name!r} has no selection split (Task(selection=...), or the "
                                    "selection setting for a data set hetprune loads)")
            return self.selection
        if self.selection is not None:
            contract.check_val_read(self.name)
        return self.val

    def evaluate(self, model: nn.Module, device: torch.device | str = "cpu", amp: str = "none",
                 workers: int = 0, distributed: bool | None = None, split: str = "val") -> float:
        """The task's metric of ``model`` on the validation data (``split="selection"``: on the selection
        split), checked to be a finite number.

        The metric sees this process's ``val`` (under torchrun, the user's loader decides what each rank
        reads; ``distributed`` only matters to the classification task, which splits and sums counts)."""
        data = self.split_data(split)
        device = devices.resolve(device)
        devices.place(model, device)
        was_training = model.training
        model.eval()
        checked = self.__dict__.setdefault("_has_batches", set())
        if split not in checked:   # checked once: an empty loader is the user's mistake
            if next(iter(data), None) is None:
                raise HetpruneError(f"the task's {split} data ({self.name}) yields no batch")
            checked.add(split)
        val = _OnDevice(data, device)
        try:
            with torch.inference_mode(), devices.autocast(device, devices.resolve_amp(amp, device)):
                value = self._metric(model, val)
        except HetpruneError:
            raise
        except Exception as exc:
            raise HetpruneError(f"the task's metric {_name_of(self._metric)} raised {type(exc).__name__}: "
                                f"{exc}") from exc
        finally:
            model.train(was_training)
        return checked_metric(value, self.metric_name)

    def fit(self, model: nn.Module, teacher: nn.Module | None, cfg: TrainConfig, stage: str, **trainer) -> list[dict]:
        """Run one fine-tune: the task's own loop when it has one, else hetprune's trainer on ``loss``.

        ``trainer`` holds what hetprune's trainer takes besides the schedule
        (checkpoint folder, resume, progress, log, ...); a user loop owns its
        own checkpoints and gets only the model, the teacher and the schedule.
        """
        schedule = Schedule(stage, cfg)
        if self._finetune is None:
            return train(model, self.source(), cfg, teacher=teacher, **trainer)
        try:
            history = self._finetune(model, teacher, schedule)
        except HetpruneError:
            raise
        except Exception as exc:
            raise HetpruneError(f"the task's finetune callback {_name_of(self._finetune)} raised {type(exc).__name__}: {exc} "
                                f"(during the {stage!r} fine-tune)") from exc
        devices.place(model, devices.resolve(cfg.device)).eval()
        return list(history) if isinstance(history, (list, tuple)) else []

    def source(self):
        """What hetprune's trainer iterates (see `hetprune.training.train.BatchSource`)."""
        return UserSource(self)

    def scoring_batches(self, items: int, batch_size: int, n_batches: int, seed: int, workers: int = 0,
                        pin_memory: bool = False):
        """The first ``n_batches`` training batches (the loader's own batch size), for one-shot scorers."""
        for i, batch in enumerate(self.train):
            if i >= n_batches:
                break
            yield batch

    def example(self, n: int = 2) -> torch.Tensor:
        """A model input for cost counting and exactness checks (at most ``n`` items)."""
        if self._example is not None:
            return self._example[:n]
        batch = next(iter(self.val), None)
        if batch is None:
            raise HetpruneError(f"the task's val data ({self.name}) yields no batch")
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not isinstance(x, torch.Tensor):
            raise HetpruneError("cannot take an example input from the task's val batches (a batch is not a tensor "
                                "and its first item is not one: a dict batch, say): pass Task(example=INPUT), the "
                                "tensor the model is called with")
        return x[:n]

    @property
    def train_size(self) -> int | None:
        """How many training items there are, where that is known (a sized data set behind the loader)."""
        dataset = getattr(self.train, "dataset", None)
        return len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None

    @property
    def fingerprint(self) -> str:
        """What keys this task's resumable state: the ``fingerprint`` given, else a hash of the data's batches
        (every tensor in them, nested in tuples, lists, namedtuples or dicts, of the first batch of a loader
        and of every batch of a list). Where the batches hold no tensor to hash, a fresh value per Task
        object: nothing is ever reused across runs for it (`fingerprinted` says which)."""
        if self._fingerprint is None:
            train, val = _batches_digest(self.train), _batches_digest(self.val)
            held = {} if self.selection is None else {"selection": _batches_digest(self.selection)}
            if train.get("tensors") or val.get("tensors"):
                self._fingerprint = fingerprint_of({"name": self.name, "train": train, "val": val,
                                                    "metric": self.metric_name, "v": 2, **held})
            else:
                import uuid

                self._fingerprint, self._unhashable = f"unhashed-{uuid.uuid4().hex}", True
        return self._fingerprint

    @property
    def key(self) -> str:
        """What keys a stored result made on this task: the data (`fingerprint`), the metric's name and
        direction, and the code of its loss, metric and training loop (`hetprune.training.resume.code_key`: qualified
        names, source, the plain values they use). A task whose metric changed (top-1 to top-1 error under
        the same name) gets another key, so nothing measured with the old metric is reused."""
        if getattr(self, "_key", None) is None:
            code, unreadable = {}, []
            for part, fn in (("loss", self._loss), ("metric", self._metric), ("finetune", self._finetune)):
                code[part], missing = code_key(fn)
                unreadable += [f"{part} {name}" for name in missing]
            self._key = fingerprint_of({"data": self.fingerprint, "metric": self.metric_name,
                                        "higher_is_better": self.higher_is_better, "code": code})
            self._unreadable = unreadable
        return self._key

    @property
    def unreadable(self) -> list[str]:
        """The parts of the task's code whose source hetprune cannot read (so it cannot tell whether they
        changed between runs): results made with them are reused only on ``resume=True`` / ``--resume``."""
        self.key
        return list(self._unreadable)

    @property
    def fingerprinted(self) -> bool:
        """False when the data could not be hashed (and no ``fingerprint`` was given): this task's points,
        checkpoints and compare rows are then never reused by a later run."""
        self.fingerprint
        return not getattr(self, "_unhashable", False)

    def describe(self) -> dict:
        return {"name": self.name, "metric": self.metric_name, "higher_is_better": self.higher_is_better,
                "own_finetune": self.own_finetune, "fingerprint": self.fingerprint}

    def format(self, value: float) -> str:
        """A metric value for a log line: ``top-1 97.78%``, or ``mIoU 83.388``."""
        return format_metric(self.metric_name, value)

    def number(self, value: float) -> str:
        """A metric value as a bare number: ``97.78``, or ``0.11342`` for an MSE."""
        return metric_number(self.metric_name, value)


class UserSource:
    """hetprune's trainer (`hetprune.training.train.train`) over a user Task: its batches and its loss.

    ``subset`` (training items) is rounded up to whole batches of the loader.
    The loss is the task's alone: hetprune cannot distil an output it does
    not understand (give the Task a ``finetune`` to distil). Under torchrun
    each rank iterates its own loader (give it a DistributedSampler); every
    rank must yield the same number of batches, and the ranks check that at
    every step (one small all-reduce). Unchecked, the extra step's gradient
    all-reduce pairs with whatever collective the other ranks call next: on
    gloo it silently summed the wrong tensors and both ranks went on; elsewhere
    it waits until the timeout. So every rank stops with the same error.
    """

    def __init__(self, task: Task):
        self.task = task

    @property
    def metric_name(self) -> str:
        return self.task.metric_name

    @property
    def higher_is_better(self) -> bool:
        return self.task.higher_is_better

    def check(self, cfg: TrainConfig) -> None:
        """Refuse the schedule options that need hetprune's own (images, labels) batches: one error naming them."""
        used = [name for name, on in (("mixup", cfg.mixup > 0), ("cutmix", cfg.cutmix > 0),
                                      ("label_smoothing", cfg.label_smoothing > 0), ("repeats", cfg.repeats > 1),
                                      ("kd_token", cfg.kd_token)) if on]
        if used:
            raise HetpruneError(f"{', '.join(used)} act on hetprune's own classification batches and loss; the task "
                                f"{self.task.name} brings its own loader and loss: do them there (Task(finetune=...)),"
                                " or leave them off")

    @property
    def eval_split(self) -> str:
        """The split an epoch is evaluated on: the selection split where there is one (a best epoch is a choice)."""
        return self.task.choice_split

    def evaluate(self, model: nn.Module, cfg: TrainConfig, device: torch.device, amp: str, distributed: bool) -> float:
        """The task's metric (an epoch's evaluation, ``eval_every``), on `eval_split`."""
        return self.task.evaluate(model, device, amp=amp, workers=cfg.workers, distributed=distributed,
                                  split=self.eval_split)

    def _limit(self, cfg: TrainConfig) -> int | None:
        """Batches of the loader's own batch size that hold ``subset`` items (None: every batch). Counted
        in items as a DataLoader's are, also for a list of batches, which has no batch size."""
        if cfg.subset is None:
            return None
        size = getattr(self.task.train, "batch_size", None)
        if size:
            return max(1, math.ceil(cfg.subset / size))
        if isinstance(self.task.train, (list, tuple)):
            seen = 0
            for n, batch in enumerate(self.task.train, 1):
                seen += _batch_items(batch)
                if seen >= cfg.subset:
                    return n
            return None
        return max(1, cfg.subset)   # an unsized iterable of unknown batch size: each batch counts as one item

    def steps_per_epoch(self, cfg: TrainConfig) -> int:
        n, limit = _count(self.task.train), self._limit(cfg)
        if n is None:
            return limit or 1
        return max(1, n if limit is None else min(n, limit))

    def _ordered(self, seed: int):
        """The training batches of one epoch: a list's (or tuple's) in an order seeded by the epoch's seed, as
        a shuffling DataLoader's are (which shuffles itself: hetprune seeds torch's generator per epoch)."""
        train = self.task.train
        if isinstance(train, (list, tuple)) and len(train) > 1:
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
            return (train[i] for i in order)
        return iter(train)

    def epoch(self, cfg: TrainConfig, seed: int, rank: int, world: int, device: torch.device, distributed: bool,
              start: int = 0):
        limit, n = self._limit(cfg), 0
        batches = self._ordered(seed)
        while limit is None or n < limit:
            batch = next(batches, _END)
            if distributed and n >= start:
                self._same_step(batch is not _END, n, rank, world, device)
            if batch is _END:
                break
            n += 1
            if n > start:   # a resumed epoch skips the steps already done (the loader reads them again)
                yield devices.place(batch, device), 1, world   # DDP's mean of the ranks' means
        if n == 0:
            raise HetpruneError(f"the task's train data ({self.task.name}) yields no batch")

    def _same_step(self, has_batch: bool, n: int, rank: int, world: int, device: torch.device) -> None:
        """Every rank has a batch ``n + 1``, or none has (the epoch ends); else every rank raises the same
        error."""
        having = int(dist.sum_tensor(torch.tensor([float(has_batch)], device=device)).item())
        if 0 < having < world:
            raise HetpruneError(
                f"under torchrun every rank must yield the same number of training batches, but at batch {n + 1} "
                f"{having} of {world} ranks had one and {world - having} had run out (rank {rank} "
                f"{'had one' if has_batch else 'had run out'}; task {self.task.name}). Give the task's train "
                "loader a DistributedSampler with drop_last=True, or as many batches on every rank")

    def loss(self, net: nn.Module, batch, teacher: nn.Module | None, cfg: TrainConfig, device: torch.device,
             amp: str) -> torch.Tensor:
        with devices.autocast(device, amp):
            loss = self.task.loss(net, batch)   # the batch as the user built it
        return loss.float() if loss.element_size() < 4 else loss


class ClassificationTask(Task):
    """Today's default task: a DataBundle, cross-entropy + KD from the dense model, top-1 in percent."""

    def __init__(self, data: DataBundle):
        self.data = data   # map-style data sets (not batches): this task batches them itself
        self._set(data.train, data.val, _cross_entropy, _top1, True, None, "top1", None, data.fingerprint,
                  data.name, data.selection)

    def evaluate(self, model, device="cpu", amp="none", workers=0, distributed=None, split="val") -> float:
        """Top-1 in percent (on ``split``: val or selection); under torchrun each rank takes a share and the
        counts are summed, unless ``distributed=False`` (a rank's own model on the whole split)."""
        dataset = self.split_data(split)
        workers = workers or int(self.data.workers or 0)   # 0: the data set's own default
        if distributed is False:
            device = devices.resolve(device)
            return evaluate(model, loader(dataset, 256, shuffle=False, workers=workers,
                                          pin_memory=device.type == "cuda"), device, amp=amp)
        return evaluate_dataset(model, dataset, device, workers=workers, amp=amp)

    def source(self):
        return ClassificationSource(self.data)

    def scoring_batches(self, items, batch_size, n_batches, seed, workers=0, pin_memory=False):
        """A seeded subset of ``items`` training images in fixed batches: the first ``n_batches`` of them."""
        data = subset(self.data.train, items, seed)
        workers = workers or int(self.data.workers or 0)
        for i, batch in enumerate(loader(data, batch_size, shuffle=False, workers=workers, pin_memory=pin_memory)):
            if i >= n_batches:
                break
            yield tuple(batch)

    def example(self, n: int = 2) -> torch.Tensor:
        return example_batch(self.data, n)

    @property
    def train_size(self) -> int:
        return len(self.data.train)

    @property
    def key(self) -> str:
        """The data's fingerprint: the loss, metric and trainer are hetprune's own, fixed for this task."""
        return self.fingerprint

    @property
    def unreadable(self) -> list[str]:
        return []

    def describe(self) -> dict:
        return {**self.data.describe(), "metric": "top1", "higher_is_better": True}


def classification(data: DataBundle) -> ClassificationTask:
    """The default Task for a classification DataBundle (embedded digits, an ImageFolder tree)."""
    return ClassificationTask(data)


def check_data_fits(task, model: nn.Module) -> None:
    """Refuse classification data the model was not made for, where both are known (a classification task's
    data): images of another shape than the model takes, or another class count than the width of its
    ``(N, classes)`` output. A model pruned on digits (10 classes) measured on digit-pairs (19, the same
    16x16 images) otherwise "passes" a metric check at chance."""
    from ..model.spec import input_shape_of

    data = getattr(task, "data", None)
    if not isinstance(data, DataBundle):
        return
    x, shape = task.example(1), tuple(input_shape_of(model))
    if tuple(x.shape[1:]) != shape:
        raise HetpruneError(f"the data {data.name} has images of shape {tuple(x.shape[1:])}, the model takes "
                            f"{shape}: give the data the model was trained on")
    param = next(model.parameters(), None)
    if param is not None:
        x = devices.place(x, param.device).to(param.dtype)
    with torch.inference_mode():
        out = model(x)
    if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[-1] != data.num_classes:
        raise HetpruneError(f"the model outputs {out.shape[-1]} classes but the data {data.name} has "
                            f"{data.num_classes}: give the data the model was trained on")


def as_task(value) -> Task:
    """A Task as given, or the classification Task of a DataBundle."""
    if isinstance(value, Task):
        return value
    if isinstance(value, DataBundle):
        return classification(value)
    raise HetpruneError(f"expected a hetprune.Task (or a DataBundle), got {type(value).__name__}")


def reuse_tag(task: Task, resume: bool, log: Callable[[str], None]) -> str | None:
    """Which stored results of ``task`` a run may reuse without being asked: None for all whose key matches
    (the task's code is keyed), else a tag of this run's own.

    Results are always stored under `Task.key`. When part of the task's code has no source hetprune can read,
    it cannot tell whether that code changed since a result was stored, so results of earlier runs are reused
    only when the caller asked for it (``resume=True`` / ``--resume``, and the log says so); otherwise the run
    reuses only what it stored itself, under the returned tag (rank 0's, under torchrun)."""
    unreadable = task.unreadable
    if not unreadable:
        return None
    said = getattr(task, "_said_unreadable", None)
    if resume:
        if said != "resume":
            log(f"resume: the task's {', '.join(unreadable)} has no source hetprune can read, so it cannot tell "
                f"whether it changed since results were stored; reusing them because {switch('resume')} asks for it")
            task._said_unreadable = "resume"
        return None
    if said != "fresh":
        log(f"note: the task's {', '.join(unreadable)} has no source hetprune can read, so results stored by "
            f"earlier runs are not reused (pass {switch('resume')} to reuse them)")
        task._said_unreadable = "fresh"
    if getattr(task, "_run_tag", None) is None:
        import uuid

        task._run_tag = dist.on_main(lambda: uuid.uuid4().hex[:12])
    return task._run_tag


def metric_number(name: str, value: float) -> str:
    """A metric's value as a number for a log or a table: two decimals for top-1 (percent), else five
    significant digits, whatever the metric's scale (two decimals made every point of an MSE task read 0.11)."""
    return f"{value:.2f}" if name == "top1" else f"{value:.5g}"


def format_metric(name: str, value: float) -> str:
    """``top-1 97.78%`` for top-1, else ``NAME 83.388`` or ``mse 0.11342`` (`metric_number`)."""
    return f"top-1 {metric_number(name, value)}%" if name == "top1" else f"{name} {metric_number(name, value)}"


def checked_metric(value, name: str = "metric") -> float:
    """``value`` as a float; one clear error when a metric returns something else, NaN or inf."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise HetpruneError(f"the task's metric ({name}) must return a number, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise HetpruneError(f"the task's metric ({name}) returned {value}; it must be a finite number")
    return value


# -- helpers ----------------------------------------------------------------------------------------
def _cross_entropy(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def _top1(model, val) -> float:
    """Top-1 in percent over batches ``(x, y)`` (the classification task batches and counts across ranks
    itself, in `ClassificationTask.evaluate`; this is the same metric on ready-made batches)."""
    hits = total = 0
    for x, y in val:
        hits += int((model(x).argmax(dim=-1) == y).sum())
        total += y.numel()
    return 100.0 * hits / total


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:80]


def _batch_items(batch) -> int:
    """How many items a batch holds: the leading size of its first tensor (1 where it has none)."""
    first = next((t for _, t in tensors.leaves(batch) if t.dim()), None)
    return int(first.shape[0]) if first is not None else 1


_END = object()   # the end of a rank's training batches


def _count(batches) -> int | None:
    try:
        return len(batches)
    except TypeError:
        return None


def _name_of(fn) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


class _OnDevice:
    """Validation batches moved to the run's device as a metric reads them (re-iterable)."""

    def __init__(self, batches, device: torch.device):
        self._batches, self._device = batches, device

    def __iter__(self):
        for batch in self._batches:
            yield devices.place(batch, self._device)   # of the user's own type (namedtuple, dict, ...)

    def __len__(self):
        return len(self._batches)


def _batches_digest(batches) -> dict:
    """A content hash of a loader's first batch (a list's: every batch) and how many batches there are: every
    tensor in them whole, with its place, shape and dtype; ``tensors`` says how many were hashed."""
    import hashlib

    whole = isinstance(batches, (list, tuple))
    sample = list(batches) if whole else [b for b in [next(iter(batches), None)] if b is not None]
    if not sample:
        return {"empty": True, "tensors": 0}
    h, count = hashlib.sha256(), 0
    for i, batch in enumerate(sample):
        for where, t in tensors.leaves(batch, f"[{i}]"):
            t = t.detach().cpu().contiguous()
            h.update(f"{where}:{tuple(t.shape)}:{t.dtype};".encode())
            h.update((t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy().tobytes())
            count += 1
    return {"batches": _count(batches), "hashed": "all" if whole else "first", "digest": h.hexdigest(),
            "tensors": count}
