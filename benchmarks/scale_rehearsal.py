"""The scale rehearsal (issue 42, item 7): the paper's DeiT-B recipe, at real shapes, on this CPU.

* model: DeiT-Tiny-shaped at 224 x 224 (197 tokens; the distilled variant, as the recipe's student), random
  weights, with a teacher of its shape (``finetune.teacher``);
* data: an ImageFolder of generated JPEGs (a few hundred, 224 x 224, ten classes);
* run: ``hetprune prune --config deit-b-paper``, shrunk only in epochs and images through ``--set``, with every
  feature of the recipe on (mixup, cutmix, RandAugment, random erasing, label smoothing, drop path, EMA, token
  KD from the separate teacher, repeated augmentation, evaluation every epoch with the best kept) plus
  accumulation and clipping, under ``torchrun --nproc-per-node 2`` (gloo);
* killed (SIGKILL to every process) in the middle of the final fine-tune, then resumed with ``--resume``: the
  result must be bit-identical to an uninterrupted run's;
* the same run's ``--plan``: its images per stage and its probe (images per second), against the stage times
  the real run measured (a local plugin on the event hooks records them), and each rank's peak memory.

    python benchmarks/scale_rehearsal.py                   # about 15-25 minutes on 2 cores
    python benchmarks/scale_rehearsal.py --images 64 --quick   # a smoke run of the script (minutes)

Writes benchmarks/results/scale-rehearsal.{md,json}, with the machine, the load and the command. The runs'
folders stay in runs/rehearsal/ (git-ignored) so a rerun reuses the generated data and the base models.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from studylib.files import write
from studylib.machine import load, machine
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "runs" / "rehearsal"
KWARGS = {"num_classes": 10}   # DeiT-Tiny at 224: 12 blocks, dim 192, 3 heads; ten classes of generated images

STAGE_TIMER = '''"""Records each stage's seconds (on_stage_end) in the run's work folder: the rehearsal's stage times."""
import json
from pathlib import Path

import hetprune
from hetprune import distributed


WORKDIR = {}


@hetprune.hookimpl
def on_stage_start(stage, info):
    if "workdir" in info:
        WORKDIR["last"] = info["workdir"]


@hetprune.hookimpl
def on_stage_end(stage, info):
    if not distributed.is_main() or "last" not in WORKDIR:
        return
    path = Path(WORKDIR["last"]) / "stage-times.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"stage": stage, "seconds": info.get("seconds")}) + "\\n")
'''


def make_data(folder: Path, train: int, val: int) -> None:
    """Seeded random JPEGs in ten classes (what they show does not matter to a timing or a resume)."""
    import numpy as np
    from PIL import Image

    if (folder / "done").is_file():
        return
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("val", val)):
        for i in range(n):
            c = folder / split / f"c{i % 10}"
            c.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)).save(c / f"{i}.jpg", quality=90)
    (folder / "done").write_text("")


def make_models(folder: Path) -> tuple[Path, Path]:
    """The student's base (distilled DeiT-Tiny) and the teacher (DeiT-Tiny), random and seeded."""
    import torch

    from hetprune.core.io import save_weights
    from hetprune.model.spec import ModelSpec, build

    paths = folder / "student.safetensors", folder / "teacher.safetensors"
    for path, name, seed in zip(paths, ("deit_tiny_distilled_patch16_224", "deit_tiny_patch16_224"), (0, 1)):
        if not path.is_file():
            torch.manual_seed(seed)
            save_weights(path, build(ModelSpec(name, KWARGS)))
    return paths


def prune_args(args, student: Path, teacher: Path, out: Path) -> list[str]:
    k = json.dumps(KWARGS)
    sets = {
        # shrunk in epochs and images only; every other value is deit-b-paper's
        "finetune.epochs": args.epochs, "finetune.batch_size": args.batch,
        "short_finetune.epochs": 1, "short_finetune.subset": args.point_images, "short_finetune.batch_size": args.batch,
        "scoring.subset": args.point_images, "scoring.batch_size": args.batch, "scoring.batches": 1,
        "scorer_options": "{gate-taylor: {warmup_epochs: 1, epochs_per_removal: 1}}",
        # the separate teacher of the student's shape (the recipe's is the pretrained DeiT-B)
        "finetune.teacher": "deit_tiny_patch16_224", "finetune.teacher_pretrained": "false",
        "finetune.teacher_checkpoint": str(teacher), "finetune.teacher_kwargs": "{num_classes: 10}",
        # on beside the recipe's features: accumulation (2 micro-batches) and clipping, and recovery points
        "finetune.accum_steps": 2, "finetune.clip_grad": 1.0, "finetune.save_every_steps": 2,
    }
    out_args = ["prune", "--model", "deit_tiny_distilled_patch16_224", "--model-kwargs", k, "--checkpoint", str(student),
                "--data", str(args.data), "--config", "deit-b-paper", "--amp", "none", "--device", "cpu",
                "--budget", str(args.budget), "--workers", "1", "--plugin", "stage_timer", "--out", str(out)]
    for key, value in sets.items():
        out_args += ["--set", f"{key}={value}"]
    return out_args


def torchrun(cli: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hetprune",
            *cli]


FINETUNE_RESUMED = re.compile(r"resume: .*fine-?tune.* continues after")   # the trainer's line on --resume


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, theirs, ...), read from /proc. torchrun starts each rank in a
    session of its own, so killing torchrun's process group leaves the ranks running: they must be found."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has exited
    except OSError:
        return False


def kill_tree(pid: int, wait_s: float = 30.0) -> tuple[list[int], list[int]]:
    """SIGKILL ``pid`` and every process below it, each by its id (found before any is killed, while they are
    still its descendants); wait until none is alive. Returns (killed ids, survivors)."""
    pids = [pid, *descendants(pid)]
    for p in reversed(pids):   # the ranks first, then torchrun (which would otherwise restart nothing anyway)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.time() + wait_s
    while time.time() < deadline and any(alive(p) for p in pids[1:]):
        time.sleep(0.2)
    return pids, [p for p in pids[1:] if alive(p)]


def run(cmd: list[str], log: Path, env: dict, kill_when=None) -> tuple[int, float, dict | None]:
    """Run ``cmd`` in its own process group (output to ``log``); with ``kill_when``, SIGKILL torchrun and every
    rank, each by its process id, as soon as it returns True. Returns (exit code, seconds, what the kill did:
    None, or the processes killed and any that survived)."""
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        kill = None
        while proc.poll() is None:
            time.sleep(0.5)
            if kill_when is not None and kill is None and kill_when():
                killed, survivors = kill_tree(proc.pid)
                kill = {"processes": len(killed), "survivors": len(survivors)}
        return proc.wait(), time.time() - t0, kill


def same_weights(a: Path, b: Path) -> tuple[bool, float]:
    import torch
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    if x.keys() != y.keys():
        return False, float("inf")
    diff = max(float((x[k].double() - y[k].double()).abs().max()) for k in x) if x else 0.0
    return all(torch.equal(x[k], y[k]) for k in x), diff


def stage_times(work: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for path in work.rglob("stage-times.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out[row["stage"]] = round(out.get(row["stage"], 0.0) + float(row["seconds"] or 0), 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=320, help="training images (default 320; 80 more for val)")
    p.add_argument("--epochs", type=int, default=3, help="the final fine-tune's epochs (default 3)")
    p.add_argument("--batch", type=int, default=32, help="the global batch (default 32: 2 ranks x 2 micro x 8)")
    p.add_argument("--point-images", type=int, default=64, help="images of a MAP point's fine-tune (default 64)")
    p.add_argument("--budget", type=int, default=4, help="sites to remove (default 4)")
    p.add_argument("--probe", type=float, default=30.0, help="the plan's probe seconds (default 30)")
    p.add_argument("--quick", action="store_true", help="a smoke run: results go to runs/rehearsal, not results/")
    args = p.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "stage_timer.py").write_text(STAGE_TIMER)
    args.data = WORK / f"images-{args.images}"
    make_data(args.data, args.images, max(20, args.images // 4))
    student, teacher = make_models(WORK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETPRUNE_NO_PROGRESS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(WORK), str(ROOT), str(ROOT / "plugins"), os.environ.get("PYTHONPATH", "")])}
    load_before = load()
    started = time.time()
    runs = {}
    for name in ("uninterrupted", "interrupted", "plan"):
        out = WORK / name
        for stale in (out, out.with_name(out.name + ".work")):
            subprocess.run(["rm", "-rf", str(stale)], check=True)   # the rehearsal's own folders only
    # 1. uninterrupted
    cli = prune_args(args, student, teacher, WORK / "uninterrupted")
    rc, seconds, _ = run(torchrun(cli), WORK / "uninterrupted.log", env)
    runs["uninterrupted"] = {"exit": rc, "seconds": round(seconds, 1),
                             "stages": stage_times(WORK / "uninterrupted.work"),
                             "peak_rss_gb_per_rank": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20, 2)}
    # 2. killed in the middle of the final fine-tune (its first checkpoint), then resumed
    work = WORK / "interrupted.work"
    checkpoint = work / "finetune" / "finetune-checkpoint.pt"
    cli_b = prune_args(args, student, teacher, WORK / "interrupted")
    rc_kill, seconds_kill, kill = run(torchrun(cli_b), WORK / "interrupted-killed.log", env,
                                      kill_when=lambda: checkpoint.is_file())
    killed = kill is not None and kill["survivors"] == 0 and not (WORK / "interrupted" / "model.safetensors").exists()
    rc_resume, seconds_resume, _ = run(torchrun([*cli_b, "--resume"]), WORK / "interrupted-resumed.log", env)
    resumed_log = (WORK / "interrupted-resumed.log").read_text()
    continued = FINETUNE_RESUMED.search(resumed_log) is not None
    runs["interrupted"] = {"killed": killed, "kill": kill, "killed_after_s": round(seconds_kill, 1),
                           "exit": rc_resume, "resumed_s": round(seconds_resume, 1),
                           "continued_a_checkpoint": continued,
                           "resume_lines": [line for line in resumed_log.splitlines() if "resume" in line][:6]}
    identical, diff = (same_weights(WORK / "uninterrupted" / "model.safetensors", WORK / "interrupted" / "model.safetensors")
                       if rc == 0 and rc_resume == 0 else (False, float("nan")))
    runs["interrupted"].update(identical=identical, max_abs_difference=diff)
    # 3. the plan of the same run, with its probe
    cli_c = prune_args(args, student, teacher, WORK / "plan") + ["--plan", "--plan-probe", str(args.probe)]
    rc_plan, seconds_plan, _ = run(torchrun(cli_c), WORK / "plan.log", env)
    plan = json.loads((WORK / "plan.work" / "plan.json").read_text()) if rc_plan == 0 else None
    reports = {}
    for name in ("uninterrupted", "interrupted"):
        path = WORK / name / "report.json"
        if path.is_file():
            r = json.loads(path.read_text())
            reports[name] = {k: r.get(k) for k in ("n_attn", "n_act", "sites", "metric", "metric_before_finetune",
                                                    "finetune_reported", "macs", "dense_macs")}
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "prune_command": "torchrun --standalone --nproc-per-node 2 -m hetprune " + shlex.join(cli),
        "machine": machine(),
        "python": platform.python_version(), "load_before": load_before,
        "load_after": load(), "wall_s": round(time.time() - started, 1),
        "settings": {k: getattr(args, k) for k in ("images", "epochs", "batch", "point_images", "budget", "probe")},
        "runs": runs, "reports": reports, "plan_exit": rc_plan, "plan_s": round(seconds_plan, 1), "plan": plan,
    }
    target = (WORK if args.quick else RESULTS) / "scale-rehearsal"
    write(target.parent, target.stem, result, markdown(result))
    ok = rc == 0 and rc_resume == 0 and identical and rc_plan == 0 and killed and continued
    return 0 if ok else 1


def markdown(r: dict) -> str:
    u, i = r["runs"]["uninterrupted"], r["runs"]["interrupted"]
    lines = ["# Scale rehearsal: the paper's DeiT-B recipe at real shapes on this CPU", "",
             f"Command: `{r['command']}` ({r['wall_s']:.0f} s in all). Machine: {r['machine']}, Python {r['python']}; "
             f"load average {r['load_before']} before, {r['load_after']} after.", "",
             f"The run: `{r['prune_command']}`", "",
             "DeiT-Tiny-shaped student (the distilled variant) and teacher at 224 x 224 (197 tokens), random weights; "
             f"{r['settings']['images']} generated training images; `--config deit-b-paper` shrunk in epochs and "
             "images only, every feature of the recipe on, plus accumulation (2) and clipping, 2 ranks (gloo).", "",
             "## Kill and resume", "",
             f"* uninterrupted: exit {u['exit']} in {u['seconds']:.0f} s",
             f"* interrupted: SIGKILL to torchrun and each rank by its process id "
             f"({(i.get('kill') or {}).get('processes', 0)} processes, {(i.get('kill') or {}).get('survivors', '-')} "
             f"survived; {'every one gone, no result written' if i['killed'] else 'NOT a clean kill'}) after "
             f"{i['killed_after_s']:.0f} s (the final fine-tune's first checkpoint), then `--resume`: exit {i['exit']} "
             f"in {i['resumed_s']:.0f} s, "
             + ("continuing the checkpoint" if i.get("continued_a_checkpoint") else "**without continuing a checkpoint**")
             + "".join(f" (`{line}`)" for line in i.get("resume_lines", [])[:6] if FINETUNE_RESUMED.search(line))[:400],
             f"* the resumed model against the uninterrupted one: **{'bit-identical' if i['identical'] else 'DIFFERENT'}** "
             f"(largest difference {i['max_abs_difference']:.3g})", ""]
    if r.get("reports"):
        lines += table(["run", "split", "sites", "top-1 before fine-tune", "top-1", "reported epoch"],
                       [[name, f"{rep['n_attn']}+{rep['n_act']}", " ".join(rep["sites"] or []),
                         rep["metric_before_finetune"], rep["metric"], rep.get("finetune_reported")]
                        for name, rep in r["reports"].items()])
        lines += ["", "(Random weights on random images: the top-1 is chance; what is checked is that the run "
                      "completes, resumes exactly, and what it costs.)", ""]
    lines += ["## The plan against the run", ""]
    if r["plan"]:
        probe = r["plan"]["probe"] or {}
        measured = u["stages"]
        lines += [f"Probe: {probe.get('train_ips')} images/s training (student + teacher, batch {probe.get('batch')} "
                  f"over {probe.get('world')} ranks), {probe.get('eval_ips')} images/s evaluating, load average "
                  f"{probe.get('load')}. Peak memory (resident, the largest process): {u['peak_rss_gb_per_rank']} GiB.", "",
                  *table(["stage", "fine-tunes", "train images", "eval images", "planned s",
                          "measured s (stage events)"],
                         [[s["stage"], s["fine_tunes"], f"{s['train_images']:,}", f"{s['eval_images']:,}",
                           "-" if s["hours"] is None else f"{s['hours'] * 3600:.0f}", measured_for(s["stage"], measured)]
                          for s in r["plan"]["steps"]])]
        lines += ["", "Measured stage times: " + ", ".join(f"{k} {v:.0f} s" for k, v in measured.items()), ""]
    else:
        lines += [f"The plan failed (exit {r['plan_exit']}): see runs/rehearsal/plan.log", ""]
    return "\n".join(lines) + "\n"


def measured_for(stage: str, measured: dict) -> str:
    key = {"stage 1: MAP points": "allocate", "select: gate phase": "select", "stage 2: fine-tune": "finetune"}.get(stage)
    return f"{measured[key]:.0f}" if key in measured else "-"


if __name__ == "__main__":
    raise SystemExit(main())
