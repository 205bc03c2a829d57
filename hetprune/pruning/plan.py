"""A plan before the run (``--plan``): every stage's fine-tunes, training images and evaluations, and, after a
short probe of the real training step on the real device at the real batch, its time and GPU-hours.

A strategy describes its stages with `PlanStep`s (``DepthStrategy.plan``; HetDPT adds stage 1's points and
checks, a scorer with a training phase its own: ``plan(job, counts)``). Counts are image passes: an epoch of
a fine-tune is ``min(subset, training set)`` images, as the trainer runs it. The probe (`probe`) runs the
final fine-tune's own training step (student plus teacher, under the run's autocast, with its accumulation,
on every rank) for a few seconds, through the same `hetprune.training.train.train` a run uses, and a few batches of
evaluation; the plan's hours are image passes divided by those rates. Nothing is trained that the run keeps:
the probe's student is a copy of the dense model, and nothing is saved but the plan file.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..core import devices
from ..core import distributed as dist
from ..core.config import TrainConfig
from ..core.errors import HetpruneError, option
from ..core.io import read_json, write_json_atomic

PLAN_FILE = "plan.json"
PROBE_SECONDS = 45.0   # the 30-60 s: long enough for a stable rate, short enough for a quick look


@dataclass
class PlanStep:
    """One stage of a run: what it does, its fine-tunes, and the image passes through training and evaluation."""

    stage: str
    what: str
    fine_tunes: int = 0
    train_images: int = 0
    eval_images: int = 0

    def times(self, train_ips: float | None, eval_ips: float | None, startup_s: float = 0.0) -> float | None:
        """Seconds, from the probe's rates and each fine-tune's start-up (None without a probe)."""
        if not train_ips or not eval_ips:
            return None
        return self.train_images / train_ips + self.eval_images / eval_ips + self.fine_tunes * startup_s


def check_probe(seconds) -> float:
    """The probe's length: a number of seconds >= 0 (0: no probe)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise HetpruneError(f"{option('plan-probe', str(seconds))} is not a number of seconds >= 0 (0: no probe)")
    return float(seconds)


def epoch_images(cfg: TrainConfig, train_size: int | None) -> int | None:
    """Images one epoch of ``cfg`` trains on (its subset of the training set), None where the size is unknown."""
    if train_size is None:
        return cfg.subset
    return min(cfg.subset or train_size, train_size)


def val_size(task, split: str = "val") -> int | None:
    """Images one evaluation of ``split`` reads (val, or the selection split), where the size is known."""
    data = getattr(task, "data", None)
    if data is not None:
        held = data.val if split == "val" else data.selection
        return None if held is None else len(held)
    held = task.val if split == "val" else getattr(task, "selection", None)
    dataset = getattr(held, "dataset", None)
    return len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None


def finetune_step(job, section: str, stage: str, what: str, count: int = 1, evaluations: int = 0) -> PlanStep:
    """``count`` fine-tunes of schedule ``section`` (with their own evaluations, ``eval_every``) and
    ``evaluations`` more: all of them on the split choices are made on (the selection split: a point's
    metric, a best epoch), not the val set."""
    cfg = job.config.schedule(section)
    per = epoch_images(cfg, job.task.train_size) or 0
    evals = (cfg.epochs // cfg.eval_every + (1 if cfg.epochs % cfg.eval_every else 0)) if cfg.eval_every else 0
    held = val_size(job.task, job.task.choice_split) or 0
    return PlanStep(stage, what, count, count * cfg.epochs * per, (count * evals + evaluations) * held)


def evaluation_step(job, stage: str, what: str, count: int) -> PlanStep:
    """``count`` evaluations of the val set: what the result reports."""
    return PlanStep(stage, what, 0, 0, count * (val_size(job.task) or 0))


def grouped(rows: list[tuple[str, list[PlanStep]]]) -> list[PlanStep]:
    """Many rows' steps summed per (group, stage), in order of first appearance: a compare's rows per
    strategy, an ablation's per kind of row."""
    out: dict[tuple[str, str], PlanStep] = {}
    counts: dict[tuple[str, str], int] = {}
    for group, steps in rows:
        for step in steps:
            key = (group, step.stage)
            if key not in out:
                out[key] = PlanStep(f"{group}: {step.stage}", step.what)
            counts[key] = counts.get(key, 0) + 1
            s = out[key]
            s.fine_tunes += step.fine_tunes
            s.train_images += step.train_images
            s.eval_images += step.eval_images
    for key, n in counts.items():
        if n > 1:
            out[key].what = f"{n} rows; each: {out[key].what}"
    return list(out.values())


# -- the probe ---------------------------------------------------------------------------------------------
@dataclass
class Probe:
    """What the probe measured on this machine: training and evaluation rates (images per second over every
    rank), the peak memory per device, and how it was measured."""

    train_ips: float
    eval_ips: float
    peak_memory_gb: float | None
    seconds: float
    steps: int
    batch: int
    device: str
    amp: str
    world: int
    teacher: bool
    section: str
    note: str = ""
    load: float | None = None   # the machine's load average when the probe ran (a shared machine's rates vary)
    startup_s: float = 0.0      # what one fine-tune costs before and after its steps (loaders, copies, wrapping)


def probe(job, seconds: float = PROBE_SECONDS, section: str = "finetune") -> Probe:
    """Time the final fine-tune's training step for about ``seconds``: two warm-up steps (allocation,
    compilation, workers starting), then as many steps as fit, through `hetprune.training.train.train` on a copy of
    the dense model with the schedule's teacher, batch, accumulation and autocast; then evaluation batches.
    Every rank takes part (the rates are the whole run's)."""
    cfg = job.train_config(section)
    n = job.task.train_size
    world = dist.world()
    teacher = job.teacher_for(cfg)[0] if cfg.kd != "none" else None
    device = job.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    student = job.place(copy.deepcopy(job.dense))
    quiet = dict(progress=False, log=lambda m: None)

    def steps(k: int) -> tuple[int, float]:
        """About ``k`` training steps (whole epochs of the data where it holds fewer): images trained, seconds."""
        images = k * cfg.batch_size
        epochs, subset = (1, images) if n is None or images <= n else (math.ceil(images / n), n)
        run = TrainConfig.from_dict({**cfg.to_dict(), "device": device, "epochs": epochs, "subset": subset,
                                     "eval_every": 0, "keep": "last", "save_every_steps": 0, "warmup_epochs": 0})
        if dist.active():
            dist.barrier()
        t0 = time.perf_counter()
        job.task.fit(student, teacher, run, "plan-probe", **quiet)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return epochs * subset, time.perf_counter() - t0

    _, warm = steps(2)                 # allocation, compilation, workers starting: not timed
    base_images, base = steps(2)       # a fine-tune's own start-up cost, plus about two steps
    per_image = max(base / base_images, 1e-9)
    k = max(4, min(10_000, int(seconds / per_image / cfg.batch_size)))
    images, took = steps(k)
    train_ips = (images - base_images) / max(took - base, 1e-9)   # the start-up cost cancels out
    startup = max(0.0, base - base_images / train_ips)   # ... and is what two steps took beyond their images
    eval_ips = _eval_rate(job, max(1.0, seconds / 6))
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    note = "" if device.type == "cuda" else "on the CPU: no device memory to report"
    return Probe(round(train_ips, 1), round(eval_ips, 1), None if peak is None else round(peak, 2),
                 round(warm + base + took, 1), math.ceil(images / cfg.batch_size), cfg.batch_size, str(device),
                 job.amp, world, teacher is not None,
                 section, note, round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
                 round(startup, 2))


def _eval_rate(job, seconds: float) -> float:
    """Images per second of the dense model's forward pass under the run's autocast, at evaluation's batch
    (256 per rank, as the classification task evaluates), on inputs of the task's shape."""
    example = job.example[:1]
    batch = example.expand(256, *example.shape[1:]).contiguous()
    model = job.dense.eval()
    with torch.inference_mode(), devices.autocast(job.device, job.amp):
        model(batch)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            model(batch)
            done += len(batch)
        if job.device.type == "cuda":
            torch.cuda.synchronize(job.device)
    return done * dist.world() / (time.perf_counter() - t0)


# -- the plan -----------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """A run's plan: its steps, the probe (or None), and where it was written."""

    title: str
    steps: list[PlanStep]
    probe: Probe | None
    key: str
    world: int
    notes: list[str] = field(default_factory=list)

    def totals(self) -> PlanStep:
        return PlanStep("total", "", sum(s.fine_tunes for s in self.steps), sum(s.train_images for s in self.steps),
                        sum(s.eval_images for s in self.steps))

    def to_dict(self) -> dict:
        rates = (self.probe.train_ips, self.probe.eval_ips, self.probe.startup_s) if self.probe else (None, None)
        rows = []
        for s in [*self.steps, self.totals()]:
            t = s.times(*rates)
            rows.append({**asdict(s), "hours": None if t is None else round(t / 3600, 3),
                         "gpu_hours": None if t is None else round(t * self.world / 3600, 3)})
        return {"title": self.title, "key": self.key, "world": self.world, "steps": rows,
                "probe": None if self.probe is None else asdict(self.probe), "notes": self.notes}

    def text(self) -> str:
        d = self.to_dict()
        head = f"{'stage':<34} {'what':<46} {'fine-tunes':>10} {'train images':>15} {'eval images':>13}"
        timed = self.probe is not None
        head += f" {'hours':>8} {'GPU-hours':>10}" if timed else ""
        lines = [f"plan: {self.title}", head]
        for row in d["steps"]:
            # a long stage name or description wraps onto lines of its own below the row, never cut off
            stage, what = textwrap.wrap(row["stage"], 34) or [""], textwrap.wrap(row["what"], 46) or [""]
            line = (f"{stage[0]:<34} {what[0]:<46} {row['fine_tunes']:>10,} "
                    f"{row['train_images']:>15,} {row['eval_images']:>13,}")
            if timed:
                line += f" {row['hours']:>8.2f} {row['gpu_hours']:>10.2f}"
            lines.append(line)
            lines += [f"{s:<34} {w}".rstrip() for s, w in itertools.zip_longest(stage[1:], what[1:], fillvalue="")]
        if self.probe:
            p = self.probe
            memory = f"{p.peak_memory_gb:.1f} GiB peak per device" if p.peak_memory_gb is not None else p.note
            lines.append(f"probe: {p.steps} steps of the {p.section} step in {p.seconds:.0f} s ({'student + teacher' if p.teacher else 'student'}, "
                         f"batch {p.batch} over {p.world} rank(s), {p.device}, amp {p.amp}): {p.train_ips:,.0f} "
                         f"images/s training, {p.eval_ips:,.0f} images/s evaluating, {p.startup_s:.1f} s of "
                         f"start-up per fine-tune; {memory}"
                         + (f"; load average {p.load}" if p.load is not None else ""))
        else:
            lines.append("no probe (--plan-probe 0): run --plan with a probe for hours and memory")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def write(plan: Plan, folder: Path) -> Path:
    """The plan as JSON in the run's work folder, where the run that follows finds it (`read_probe`)."""
    path = Path(folder) / PLAN_FILE
    write_json_atomic(path, plan.to_dict())
    return path


def read_probe(folder: Path, key: str) -> dict | None:
    """The probe a ``--plan`` of the same run wrote (same settings, budget, base model, task and ranks), for
    the run's report; None when there is none."""
    path = Path(folder) / PLAN_FILE
    if not path.is_file():
        return None
    try:
        found = read_json(path, "plan file")
    except HetpruneError:
        return None
    return found.get("probe") if found.get("key") == key else None


def hours(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"
