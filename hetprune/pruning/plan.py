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
import dataclasses
import itertools
import math
import os
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..core import devices
from ..core import distributed as dist
from ..core.config import TrainConfig
from ..core.errors import HetpruneError, option
from ..core.io import read_json, write_json_atomic
from ..core.keys import matches
from ..training.bundle import DataBundle
from ..training.loaders import row_threading
from ..training.samplers import set_epoch
from ..training.train import train, workers_for

PLAN_FILE = "plan.json"   # one of what hetprune.core.io.PLANNED names
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
    return cfg.subset if train_size is None else cfg.epoch_images(train_size)


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
    rank), the peak memory per device, and how it was measured.

    ``train_ips`` is the rate the plan's hours use: the run's training step fed by its own loader, in a steady
    state. Beside it, where the task trains with hetprune's trainer: ``step_ips``, the step alone on a batch
    already on the device, and ``loader_ips``, the loader alone (the run's augmentations and workers, batches
    copied to the device); ``bound`` names the slower of the two, which the run cannot beat."""

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
    startup_s: float = 0.0      # what one fine-tune costs before its steps (loader workers starting, wrapping)
    step_ips: float | None = None     # the training step alone, on a batch already on the device
    loader_ips: float | None = None   # the loader alone: augmentations, workers, the copy to the device
    bound: str | None = None          # "the training step" or "the loader": the slower of the two alone
    workers: int | None = None        # the loader's worker processes per rank
    # the step's efficiency: model FLOPs per trained image (student forward and backward, teacher forward), what
    # that makes at train_ips, and the device's dense peak at the step's precision where it is a known GPU
    flops_per_image: float | None = None
    achieved_tflops: float | None = None
    precision: str | None = None
    peak_board: str | None = None
    peak_tflops: float | None = None

    @property
    def peak_share(self) -> float | None:
        """The achieved rate as a share of the device's dense peak (None where either is unknown)."""
        return self.achieved_tflops / self.peak_tflops if self.achieved_tflops and self.peak_tflops else None


WARM_STEPS = 3           # steps of a timed stretch that are not timed: allocation, compilation, workers' first batches
MAX_PROBE_ITEMS = 2_000_000   # the longest epoch the probe draws (a sampler's order is a list of this many items)


class Repeated(Dataset):
    """A small training set repeated to ``length`` items, so one epoch lasts as long as the probe needs (an epoch
    restarting every few steps on a small folder was timed instead of the run's steady state)."""

    def __init__(self, dataset: Dataset, length: int):
        self.dataset, self.length = dataset, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.dataset[i % len(self.dataset)]

    def set_epoch(self, seed: int) -> None:
        set_epoch(self.dataset, seed)


class TimedSource:
    """A training source (what `hetprune.training.train.train` iterates) that yields ``steps`` batches of
    ``inner``'s, one long stretch, each batch's arrival time recorded; with ``batch`` it yields that one batch
    (already on the device) at every step instead: the training step alone. Everything else is ``inner``'s."""

    def __init__(self, inner, steps: int, batch=None):
        self.inner, self.steps, self.batch, self.marks, self.whole = inner, steps, batch, [], 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def steps_per_epoch(self, cfg) -> int:
        return self.steps

    def epoch(self, cfg, seed, rank, world, device, distributed, start=0):
        def stream():
            if self.batch is not None:
                yield from itertools.repeat(self.batch)
            for k in itertools.count():   # a source whose epoch is shorter than the stretch: the next epoch
                yield from self.inner.epoch(cfg, seed + k, rank, world, device, distributed)

        for item in itertools.islice(stream(), self.steps):   # item: (batch, this rank's share, global batch)
            self.marks.append(time.perf_counter())
            self.whole = item[2]
            yield item

    def rate(self, ended: float) -> float:
        """Images per second (global batches) from the end of the warm-up steps to ``ended``."""
        timed = self.marks[WARM_STEPS:]
        return len(timed) * self.whole / max(ended - timed[0], 1e-9) if timed else 0.0


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _steps_for(seconds: float, per_step: float, cap: int) -> int:
    """Timed steps that fill ``seconds`` at ``per_step`` seconds each (at least 4, at most ``cap``), the same on
    every rank (rank 0's count)."""
    steps = max(4, min(cap, int(seconds / max(per_step, 1e-9))))
    return int(dist.broadcast(steps)) if dist.active() else steps


def probe(job, seconds: float = PROBE_SECONDS, section: str = "finetune") -> Probe:
    """Time the final fine-tune's training step for about ``seconds`` on a copy of the dense model, with the
    schedule's teacher, batch, accumulation and autocast, on every rank (the rates are the whole run's), then
    evaluation batches. Where the task trains with hetprune's trainer the probe times, each in a steady state
    after `WARM_STEPS` untimed steps: the step alone (one batch, already on the device, at every step), the
    loader alone (one long epoch of the training set repeated, with the run's augmentations and workers,
    copied to the device), and the two together on that same, already running loader: the run's rate, which
    the hours use. A task with its own training loop is timed through it, together only."""
    cfg = job.train_config(section)
    world = dist.world()
    teacher = job.teacher_for(cfg)[0] if cfg.kd != "none" else None
    device = job.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    student = job.place(copy.deepcopy(job.dense))
    started = time.perf_counter()
    run = TrainConfig.from_dict({**cfg.to_dict(), "device": device, "epochs": 1, "subset": None, "eval_every": 0,
                                 "keep": "last", "save_every_steps": 0, "warmup_epochs": 0})
    workers = cfg.workers or int(getattr(getattr(job.task, "data", None), "workers", None) or 0)
    with row_threading(device, 1, workers):   # the threads a row trains with (a CPU run's: what its cores leave)
        if job.task.own_finetune:   # its own loop: its loader and its step cannot be timed apart
            found = _probe_user_loop(job, student, teacher, cfg, seconds)
        else:
            found = _probe_source(job, student, teacher, run, seconds)
        eval_ips = _eval_rate(job, max(1.0, seconds / 8))
    efficiency = step_efficiency(job, student, teacher, found["train_ips"])
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    note = "" if device.type == "cuda" else "on the CPU: no device memory to report"
    return Probe(eval_ips=round(eval_ips, 1), peak_memory_gb=None if peak is None else round(peak, 2),
                 seconds=round(time.perf_counter() - started, 1), batch=cfg.batch_size, device=str(device),
                 amp=job.amp, world=world, teacher=teacher is not None, section=section, note=note,
                 load=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None, **found, **efficiency)


def step_flops(job, student, teacher) -> float | None:
    """Model FLOPs one trained image costs (1 MAC = 2 FLOPs): the student's forward and backward (three forwards)
    and the teacher's forward; None where the models' MACs cannot be counted (an operation the counter cannot
    size)."""
    from ..model.macs import count_macs

    example = job.example
    try:
        with torch.no_grad():
            student_macs = count_macs(student, example)
            teacher_macs = count_macs(teacher, example) if teacher is not None else 0
    except HetpruneError:
        return None
    return 2.0 * (3 * student_macs + teacher_macs)


def step_efficiency(job, student, teacher, train_ips: float) -> dict:
    """The probe's efficiency fields: FLOPs per image, the TFLOP/s they make at ``train_ips``, and the device's
    dense peak at the step's precision (`hetprune.core.devices.GPU_PEAKS`), where it is a known GPU."""
    flops = step_flops(job, student, teacher)
    device = job.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    precision = devices.matmul_precision(job.amp, job.config.tf32 and devices.has_tf32(device))
    known = devices.peak_tflops(name, precision)
    return {"flops_per_image": flops, "achieved_tflops": None if flops is None else flops * train_ips / 1e12,
            "precision": precision, "peak_board": known[0] if known else None,
            "peak_tflops": known[1] if known else None}


def _probe_source(job, student, teacher, run: TrainConfig, seconds: float) -> dict:
    """The three rates of a task hetprune's trainer runs (see `probe`)."""
    quiet = dict(progress=False, log=lambda m: None)
    device = job.device
    cap = max(WARM_STEPS + 8, min(10_000, MAX_PROBE_ITEMS // run.batch_size))
    source = job.task.source()
    data = getattr(source, "data", None)
    if not isinstance(data, DataBundle):   # a user's own loader (its batches, its workers)
        data = None
    else:   # hetprune's own classification data: one long epoch, the set repeated
        source = type(source)(dataclasses.replace(data, train=Repeated(data.train, cap * run.batch_size)))

    def steps(share: float, batch=None) -> tuple[TimedSource, float]:
        """Train for about ``share`` of the probe's seconds, in a steady state, on ``source``'s batches (or on
        ``batch`` at every step): a short calibrating stretch sets the timed stretch's steps. The timed
        stretch, and when its call began."""
        calibration = TimedSource(source, WARM_STEPS + 3, batch)
        train(student, calibration, run, teacher=teacher, **quiet)
        per_step = calibration.whole / max(calibration.rate(_sync(device)), 1e-9)
        timed = TimedSource(source, WARM_STEPS + _steps_for(seconds * share, per_step, cap), batch)
        began = time.perf_counter()
        train(student, timed, run, teacher=teacher, **quiet)
        return timed, began

    # the step alone: one real batch, already on the device, at every step. It is read without loader workers:
    # workers started for it would go on filling their queues while the step is timed, and on the H200 their
    # decoding slowed the step's own process (step alone 1,358 images/s, the two together 1,600)
    quiet_run = TrainConfig.from_dict({**run.to_dict(), "workers": 0})
    alone_source = source if data is None else type(source)(dataclasses.replace(source.data, workers=0))
    first = next(iter(TimedSource(alone_source, 1).epoch(quiet_run, run.seed, dist.rank(), dist.world(), device,
                                                         dist.active())))
    alone, _ = steps(0.25, first)
    step_ips = alone.rate(_sync(device))
    # the loader alone: its batches copied to the device, nothing trained; its workers start cold here, as each
    # fine-tune of a run starts its own
    feed, deadline, began = TimedSource(source, cap), None, time.perf_counter()
    for _ in feed.epoch(run, run.seed, dist.rank(), dist.world(), device, dist.active()):
        if len(feed.marks) == WARM_STEPS + 1:
            deadline = time.perf_counter() + seconds * 0.25
        if deadline is not None and time.perf_counter() >= deadline:
            break
    loader_ips = feed.rate(_sync(device))
    cold_start = feed.marks[0] - began if feed.marks else 0.0
    # the two together, on the same loader (its workers already up): the run's rate
    both, began = steps(0.3)
    train_ips = both.rate(_sync(device))
    startup = cold_start + (both.marks[0] - began if both.marks else 0.0)
    return dict(train_ips=round(train_ips, 1), steps=len(both.marks), startup_s=round(startup, 2),
                step_ips=round(step_ips, 1), loader_ips=round(loader_ips, 1),
                bound="the loader" if loader_ips < step_ips else "the training step",
                workers=None if data is None else workers_for(data, run))


def _probe_user_loop(job, student, teacher, cfg: TrainConfig, seconds: float) -> dict:
    """A task with its own training loop: whole fine-tunes through it (its loader and its step together), the
    start-up of a fine-tune cancelled out by timing a short and a long one."""
    n = job.task.train_size
    quiet = dict(progress=False, log=lambda m: None)

    def steps(k: int) -> tuple[int, float]:
        images = k * cfg.batch_size
        epochs, subset = (1, images) if n is None or images <= n else (math.ceil(images / n), n)
        run = TrainConfig.from_dict({**cfg.to_dict(), "device": job.device, "epochs": epochs, "subset": subset,
                                     "eval_every": 0, "keep": "last", "save_every_steps": 0, "warmup_epochs": 0})
        if dist.active():
            dist.barrier()
        t0 = time.perf_counter()
        job.task.fit(student, teacher, run, "plan-probe", **quiet)
        return epochs * subset, _sync(job.device) - t0

    steps(2)                           # allocation, compilation, workers starting: not timed
    base_images, base = steps(2)       # a fine-tune's own start-up cost, plus about two steps
    per_image = max(base / base_images, 1e-9)
    images, took = steps(_steps_for(seconds * 0.8, per_image * cfg.batch_size, 10_000))
    train_ips = (images - base_images) / max(took - base, 1e-9)   # the start-up cost cancels out
    startup = max(0.0, base - base_images / train_ips)
    return dict(train_ips=round(train_ips, 1), steps=math.ceil(images / cfg.batch_size), startup_s=round(startup, 2))


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

    def map_share(self) -> float | None:
        """What choosing the split costs: stage 1's training images (MAP points and checks) as a share of the
        whole run's (None where the run has no stage 1 or trains nothing)."""
        return map_share(self.steps)

    def to_dict(self) -> dict:
        rates = (self.probe.train_ips, self.probe.eval_ips, self.probe.startup_s) if self.probe else (None, None)
        rows = []
        for s in [*self.steps, self.totals()]:
            t = s.times(*rates)
            rows.append({**asdict(s), "hours": None if t is None else round(t / 3600, 3),
                         "gpu_hours": None if t is None else round(t * self.world / 3600, 3)})
        return {"title": self.title, "key": self.key, "world": self.world, "steps": rows, "map_share": self.map_share(),
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
        if d["map_share"] is not None:
            lines.append(f"choosing the split (stage 1: MAP points and checks): {d['map_share']:.1%} of the run's "
                         "training images")
        if self.probe:
            lines += probe_lines(self.probe)
        elif not any(n.startswith("no probe") for n in self.notes):
            lines.append("no probe (--plan-probe 0): run --plan with a probe for hours and memory")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


STAGE_ONE = "stage 1:"   # how the steps of choosing the split are named (a compare's: "hetdpt: stage 1: ...")
BASE_STAGE = "base:"     # the steps of making the dense base before the run (--base): not the pruning run's


def map_share(steps: list[PlanStep]) -> float | None:
    """Stage 1's training images (a MAP's points and checks) over all of ``steps``' training images: what
    choosing the split costs a run, the share issue 58's cost line bounds (None without a stage 1). The base
    hetprune makes before the run (`BASE_STAGE`) is not the run's: it counts in neither."""
    steps = [s for s in steps if not s.stage.startswith(BASE_STAGE)]
    chosen = sum(s.train_images for s in steps if STAGE_ONE in s.stage)
    total = sum(s.train_images for s in steps)
    return chosen / total if total and any(STAGE_ONE in s.stage for s in steps) else None


def probe_lines(p: Probe) -> list[str]:
    """What the probe measured, for people: its rates (and which bounds the run), memory, load."""
    memory = f"{p.peak_memory_gb:.1f} GiB peak per device" if p.peak_memory_gb is not None else p.note
    what = (f"probe: {p.steps} steps of the {p.section} step in {p.seconds:.0f} s "
            f"({'student + teacher' if p.teacher else 'student'}, batch {p.batch} over {p.world} rank(s), "
            f"{p.device}, amp {p.amp}): {p.train_ips:,.0f} images/s training")
    lines = [what + (f" (the step fed by its loader, {p.workers} worker(s) per rank)" if p.step_ips else "")]
    if p.step_ips and p.loader_ips:
        lines.append(f"  the training step alone (a batch already on the device): {p.step_ips:,.0f} images/s; the "
                     f"loader alone (augmentations, workers, copy to the device): {p.loader_ips:,.0f} images/s: "
                     f"the run is bound by {p.bound}")
    lines.append(f"  {p.eval_ips:,.0f} images/s evaluating, {p.startup_s:.1f} s of start-up per fine-tune; {memory}"
                 + (f"; load average {p.load}" if p.load is not None else ""))
    if p.flops_per_image:
        peak = (f": {p.peak_share:.1%} of the {p.peak_board}'s dense {p.precision} peak of {p.peak_tflops:g} TFLOP/s "
                "(NVIDIA's data sheet)" if p.peak_share is not None else
                f"; no dense {p.precision} peak is known for {p.device} (hetprune.core.devices.GPU_PEAKS)")
        lines.append(f"  the training step: {p.flops_per_image / 1e9:,.3g} GFLOP per image (student forward and "
                     f"backward{', teacher forward' if p.teacher else ''}) at {p.train_ips:,.0f} images/s: "
                     f"{p.achieved_tflops:,.3g} TFLOP/s{peak}")
    return lines


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
    return found.get("probe") if matches(found.get("key"), key) else None


def hours(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"
