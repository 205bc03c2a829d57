"""Why does (or doesn't) gate-taylor beat random? The within-kind scorers, and variants that test the
hypotheses of issue 14, at one fixed split, 3 seeds, the default full fine-tune.

Every row is ``hetprune prune --data D --strategy mix --set mix.ratio=A/K --budget K --scorer S ...``
(``mix`` at that ratio removes exactly A attention and K-A activation sites). The variants:

* ``gate-taylor``: the paper's learned gates (scores accumulate over the whole run, 300 images);
* ``gate-taylor reset`` / ``gate-taylor ema 0.5``: scores reset (decay 0) or halved after each removal,
  so early evidence from a model that no longer exists counts less;
* ``gate-taylor 1000 images`` / ``all data``: the gate phase trains on 1000 or every training image, not
  on a 300-image subset;
* ``loss-drop``: the loss increase of each real removal (zeroth order, not a Taylor estimate), greedy;
* ``taylor``, ``block-influence``, ``random``: one-shot scores, all sites off at once;
* ``...: its sites, one-shot``, one per gate-taylor variant: that variant's own picks (same seed) removed
  all at once with only the final fine-tune (the ``listed`` control scorer of benchmarks/listed_scorer.py):
  it separates the choice of sites from gate-taylor's gradual removal, which trains the weights while it
  removes.

    OMP_NUM_THREADS=1 python benchmarks/scorer_study.py --data digit-pairs --budget 12 --split 5+7

Runs two prunes at a time (each single-threaded); a finished run whose command is unchanged is reused.
Writes benchmarks/results/{data}-scorers-b{K}-{A}+{M}.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from studylib.files import write
from studylib.machine import load, machine as studylib_machine
from studylib.tables import table

HERE = Path(__file__).resolve().parent

VARIANTS = {   # name -> extra prune arguments
    "gate-taylor": ["--scorer", "gate-taylor"],
    "gate-taylor reset": ["--scorer", "gate-taylor", "--set", "scorer_options={gate-taylor: {score_decay: 0}}"],
    "gate-taylor ema 0.5": ["--scorer", "gate-taylor", "--set", "scorer_options={gate-taylor: {score_decay: 0.5}}"],
    "gate-taylor 1000 images": ["--scorer", "gate-taylor", "--set", "scoring.subset=1000"],
    "gate-taylor all data": ["--scorer", "gate-taylor", "--set", "scoring.subset=null"],
    "loss-drop": ["--scorer", "loss-drop"],
    "taylor": ["--scorer", "taylor"],
    "block-influence": ["--scorer", "block-influence"],
    "random": ["--scorer", "random"],
}
GRADUAL = [v for v in VARIANTS if v.startswith("gate-taylor")]   # they train the weights while removing


def control_name(variant: str) -> str:
    return f"{variant}: its sites, one-shot"


def slug(name: str) -> str:
    return name.replace(" ", "-").replace(",", "").replace(".", "")


def run(cmd: list[str], out: Path, env: dict) -> dict:
    """One prune, reused when its report exists and the command is unchanged."""
    text = shlex.join(cmd)
    marker = out / "command.txt"
    if (out / "report.json").is_file() and marker.is_file() and marker.read_text() == text:
        return json.loads((out / "report.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as fh:
        done = subprocess.run(cmd + ["--out", str(out), "--overwrite"], stdout=fh, stderr=subprocess.STDOUT,
                              env=env)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {text}\n  log: {log}")
    marker.write_text(text)
    return json.loads((out / "report.json").read_text())


def summary(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def scorer_table(rows: list[dict]) -> list[str]:
    """One row per variant (the results JSON's ``rows``), against the random scorer's mean where it ran."""
    rand = next((r for r in rows if r["variant"] == "random"), None)
    cells = []
    for r in rows:
        secs = [s for s in r["seconds"] if s is not None]
        cells.append([r["variant"], summary(r["top1"]), ", ".join(f"{x:.1f}" for x in r["top1"]),
                      f"{statistics.mean(r['top1_before_finetune']):.1f}",
                      f"{r['mean'] - rand['mean']:+.2f}" if rand else "-",
                      f"{statistics.mean(secs):.0f}" if secs else "-"])
    return table(["variant", "top-1 % after fine-tune (mean ± std)", "per seed", "top-1 % before fine-tune (mean)",
                  "vs random (points)", "prune s (mean, report)"], cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="digit-pairs")
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--split", default="5+7", help="attention+activation removals, e.g. 5+7")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="run folder (default runs/scorer-study/DATA-bK-A+M)")
    args = ap.parse_args()
    n_attn, n_act = (int(x) for x in args.split.split("+"))
    if n_attn + n_act != args.budget:
        raise SystemExit(f"--split {args.split} does not add up to --budget {args.budget}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    tag = f"{args.data}-scorers-b{args.budget}-{n_attn}+{n_act}"
    root = Path(args.out or f"runs/scorer-study/{args.data}-b{args.budget}-{n_attn}+{n_act}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}
    base = [sys.executable, "-m", "hetprune", "prune", "--data", args.data, "--strategy", "mix",
            "--set", f"mix.ratio={n_attn / args.budget!r}",
            "--budget", str(args.budget)]
    load_start = load()
    started = time.time()

    def job(variant, seed):
        cmd = base + VARIANTS[variant] + ["--seed", str(seed)]
        t = time.time()
        report = run(cmd, root / f"{slug(variant)}-seed{seed}", env)
        print(f"{variant:<28} seed {seed}: {report['n_attn']}+{report['n_act']} top-1 "
              f"{report['top1_before_finetune']:.2f} -> {report['top1']:.2f} ({time.time() - t:.0f} s)", flush=True)
        return variant, seed, report

    results: dict[str, dict[int, dict]] = {v: {} for v in variants}
    with ThreadPoolExecutor(args.jobs) as pool:
        for variant, seed, report in pool.map(lambda vs: job(*vs), [(v, s) for v in variants for s in seeds]):
            results[variant][seed] = report
        # the controls: a gradual scorer's picks (same seed), all at once, only the final fine-tune
        def control(variant, seed):
            picked = results[variant][seed]["sites"]
            cmd = base + ["--plugin", "listed_scorer", "--scorer", "listed", "--set",
                          "scorer_options={listed: {sites: [" + ", ".join(picked) + "]}}", "--seed", str(seed)]
            name = control_name(variant)
            report = run(cmd, root / f"{slug(name)}-seed{seed}", env)
            if sorted(report["sites"]) != sorted(picked):
                raise SystemExit(f"control {name!r} seed {seed} removed {report['sites']}, not {picked}")
            print(f"{name:<28} seed {seed}: top-1 {report['top1_before_finetune']:.2f} -> "
                  f"{report['top1']:.2f}", flush=True)
            return name, seed, report

        todo = [(v, s) for v in variants if v in GRADUAL for s in seeds]
        for name, seed, report in pool.map(lambda vs: control(*vs), todo):
            results.setdefault(name, {})[seed] = report
    load_end = load()

    rows = []
    for variant, per_seed in results.items():
        top1 = [per_seed[s]["top1"] for s in seeds]
        before = [per_seed[s]["top1_before_finetune"] for s in seeds]
        rows.append({"variant": variant, "top1": top1, "top1_before_finetune": before,
                     "mean": statistics.mean(top1), "std": statistics.stdev(top1) if len(top1) > 1 else 0.0,
                     "seconds": [per_seed[s].get("seconds") for s in seeds],
                     "sites": {s: per_seed[s]["sites"] for s in seeds}})
    command = "OMP_NUM_THREADS=1 python benchmarks/scorer_study.py " + shlex.join(sys.argv[1:])
    machine = f"{studylib_machine()}, Python {platform.python_version()}"
    payload = {"command": command, "data": args.data, "budget": args.budget, "split": [n_attn, n_act],
               "seeds": seeds, "machine": machine, "load_start": load_start, "load_end": load_end,
               "minutes": round((time.time() - started) / 60, 1),
               "prune_minutes": round(sum(x or 0 for r in rows for x in r["seconds"]) / 60, 1), "rows": rows}

    lines = [f"# Scorers at the split {n_attn}+{n_act} (budget {args.budget}) on the embedded {args.data} ViT", "",
             f"Produced by `{command}` (the prunes' own times add up to {payload['prune_minutes']} min, two run "
             f"at a time): for each variant and seed, `hetprune prune "
             f"--data {args.data} --strategy mix --set mix.ratio={n_attn / args.budget!r} --budget {args.budget} "
             f"--scorer ...` with the default full fine-tune (see the script's docstring for what each variant "
             f"tests).", "",
             f"Machine: {machine}. Load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load_start)} at the "
             f"start, {', '.join(f'{x:.2f}' for x in load_end)} at the end (accuracy does not depend on load).", "",
             *scorer_table(rows)]
    lines += ["", "Sites (per seed):", ""]
    for r in rows:
        for s in seeds:
            lines.append(f"* {r['variant']}, seed {s}: {' '.join(r['sites'][s])}")
    write(HERE / "results", tag, payload, "\n".join(lines), echo=False)
    print("\n".join(lines[:len(rows) + 9]))


if __name__ == "__main__":
    main()
