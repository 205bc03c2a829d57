"""A training log on hetprune's event hooks, as a plugin: each epoch's loss, learning rate, metric (and the
EMA's) and images per second, written to ``training-log.csv`` in the run's work folder (``OUT.work``,
beside ``OUT/report.json``) and, where the ``tensorboard`` extra is installed
(``pip install "hetprune[tensorboard]"``), to TensorBoard event files in ``OUT.work/tensorboard``
(``tensorboard --logdir OUT.work/tensorboard``). Under torchrun rank 0 writes. Uses only the public plugin
API: the stage events name the run's work folder (``info["workdir"]``), the run and whether it resumes; the
epoch events carry the metrics. A fresh run (``--overwrite``, or a work folder left by a run that was not
resumed) starts fresh files; a resumed run continues them and their step count.
"""

from __future__ import annotations

import csv
from pathlib import Path

import hetprune

__version__ = hetprune.__version__

CSV_FILE = "training-log.csv"
COLUMNS = ("stage", "epoch", "step", "loss", "lr", "metric", "ema_metric", "images_per_s", "seconds")


class TrainingLog:
    """Rows of epoch metrics, one CSV (and one TensorBoard run) per work folder and run. ``step`` counts a
    stage's epochs across its fine-tunes (a strategy may run several), so TensorBoard's curves do not fold
    back. A new run that does not resume starts the folder's files afresh; one that resumes continues them,
    and its step count from the CSV's last row of each stage."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.run = None
        self.steps: dict[str, int] = {}
        self.writer = None
        self.counts: dict[Path, tuple] = {}   # per folder this process wrote to: (run, its step counts)

    def open(self, folder: str | Path, run=None, resume: bool = False) -> None:
        """Write to ``folder`` for run ``run`` from now on (a new run, a compare row, or a run going back to
        a folder it wrote to: it continues there)."""
        folder = Path(folder)
        if self.folder == folder and self.run == run:
            return
        self.close()
        known = self.counts.get(folder)
        if known is not None and known[0] == run:
            steps = known[1]
        elif resume:
            steps = last_steps(folder / CSV_FILE)
        else:
            steps = {}
            start_afresh(folder)
        self.counts[folder] = (run, steps)
        self.folder, self.run, self.steps = folder, run, steps

    def row(self, stage: str, epoch: int, metrics: dict) -> None:
        from hetprune.plugin_api import distributed

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


def last_steps(path: Path) -> dict[str, int]:
    """Each stage's last step in a training log (none where there is no log yet)."""
    steps: dict[str, int] = {}
    if path.is_file():
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if (row.get("step") or "").isdigit():
                    steps[row["stage"]] = max(steps.get(row["stage"], 0), int(row["step"]))
    return steps


def start_afresh(folder: Path) -> None:
    """Remove an earlier run's training log and TensorBoard event files from ``folder`` (rank 0), and nothing
    else."""
    from hetprune.plugin_api import distributed

    if not distributed.is_main():
        return
    (folder / CSV_FILE).unlink(missing_ok=True)
    for events in (folder / "tensorboard").glob("events.out.tfevents.*"):
        events.unlink()


LOG = TrainingLog()


@hetprune.hookimpl
def on_stage_start(stage, info):
    if info.get("workdir"):
        LOG.open(info["workdir"], info.get("run"), bool(info.get("resume")))


@hetprune.hookimpl
def on_epoch_end(stage, epoch, metrics):
    LOG.row(stage, epoch, metrics)


@hetprune.hookimpl
def on_stage_end(stage, info):
    if LOG.writer is not None:
        LOG.writer.flush()
