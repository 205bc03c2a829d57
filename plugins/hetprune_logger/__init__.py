"""A training log on hetprune's event hooks, as a plugin: each epoch's loss, learning rate, metric (and the
EMA's) and images per second, written to ``training-log.csv`` in the run's work folder (``OUT.work``,
beside ``OUT/report.json``) and, where the ``tensorboard`` extra is installed
(``pip install "hetprune[tensorboard]"``), to TensorBoard event files in ``OUT.work/tensorboard``
(``tensorboard --logdir OUT.work/tensorboard``). Under torchrun rank 0 writes. Uses only the public plugin
API: the stage events name the run's work folder (``info["workdir"]``), the epoch events carry the metrics.
"""

from __future__ import annotations

import csv
from pathlib import Path

import hetprune

__version__ = hetprune.__version__

CSV_FILE = "training-log.csv"
COLUMNS = ("stage", "epoch", "step", "loss", "lr", "metric", "ema_metric", "images_per_s", "seconds")


class TrainingLog:
    """Rows of epoch metrics, one CSV (and one TensorBoard run) per work folder. ``step`` counts a stage's
    epochs across its fine-tunes (a strategy may run several), so TensorBoard's curves do not fold back."""

    def __init__(self):
        self.folder: Path | None = None
        self.steps: dict[str, int] = {}
        self.writer = None

    def open(self, folder: str) -> None:
        """Write to ``folder`` from now on (a new run, or a compare row)."""
        if self.folder == Path(folder):
            return
        self.close()
        self.folder, self.steps = Path(folder), {}

    def row(self, stage: str, epoch: int, metrics: dict) -> None:
        from hetprune.core import distributed

        if self.folder is None or not distributed.is_main():
            return
        step = self.steps[stage] = self.steps.get(stage, 0) + 1
        values = {"stage": stage, "epoch": epoch, "step": step, **{k: metrics.get(k) for k in COLUMNS[3:]}}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / CSV_FILE
        new = not path.is_file()
        with open(path, "a", newline="", encoding="utf-8") as f:
            out = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                out.writeheader()
            out.writerow({k: "" if v is None else v for k, v in values.items()})
        writer = self.tensorboard()
        if writer is not None:
            for key in COLUMNS[3:]:
                if isinstance(metrics.get(key), (int, float)):
                    writer.add_scalar(f"{stage}/{key}", metrics[key], step)
            writer.flush()

    def tensorboard(self):
        """A SummaryWriter on ``OUT.work/tensorboard`` when TensorBoard is installed, else None."""
        if self.writer is None and self.folder is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:   # the optional extra is not installed: the CSV alone
                return None
            self.writer = SummaryWriter(str(self.folder / "tensorboard"))
        return self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = None


LOG = TrainingLog()


@hetprune.hookimpl
def on_stage_start(stage, info):
    if info.get("workdir"):
        LOG.open(info["workdir"])


@hetprune.hookimpl
def on_epoch_end(stage, epoch, metrics):
    LOG.row(stage, epoch, metrics)


@hetprune.hookimpl
def on_stage_end(stage, info):
    if LOG.writer is not None:
        LOG.writer.flush()
