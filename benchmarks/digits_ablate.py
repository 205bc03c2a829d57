"""Reproduce benchmarks/results/<data>-ablate-b<K>.md (+ .json, splits and scorer plots).

Runs `hetprune ablate` on an embedded data set (default digits; --data
digit-pairs for the second benchmark): every feasible split of each budget
fine-tuned fully with 3 seeds, the predictors judged against that ground truth,
and the scorers compared at the first predictor's pick.

    python benchmarks/digits_ablate.py                       # digits, budgets 6,12; seeds 0,1,2
    python benchmarks/digits_ablate.py --budgets 12 --seeds 0
    python benchmarks/digits_ablate.py --data digit-pairs --budgets 12 --scorers ""
    python benchmarks/digits_ablate.py --data digit-pairs --predictors poly,local --set hetdpt.refine=2 --tag refine2

Resumable: rerun the same command to continue an interrupted run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path

from studylib.runs import resumable

ROOT = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="6,12")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--scorers", default="gate-taylor,taylor,block-influence,random")
    p.add_argument("--jobs", default="2")
    p.add_argument("--data", default="digits", help="embedded data set: digits or digit-pairs")
    p.add_argument("--predictors", default=None, help="predictors to judge, e.g. poly,local (default: poly)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed on to hetprune ablate")
    p.add_argument("--tag", default="", help="suffix of the result files (b12-TAG), for a variant run")
    p.add_argument("--out", default=None, help="default runs/<data>-ablate")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()

    import torch

    from hetprune.cli import main as cli

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/digits_ablate.py " + shlex.join(sys.argv[1:])
    tag = f"-{args.tag}" if args.tag else ""
    for budget in [int(b) for b in args.budgets.split(",")]:
        out = Path(args.out or f"runs/{args.data}-ablate{tag}") / f"b{budget}"
        argv = ["ablate", "--data", args.data, "--budget", str(budget), "--seeds", args.seeds, "--jobs", args.jobs,
                "--out", str(out)]
        if args.scorers:
            argv += ["--scorers", args.scorers]
        if args.predictors:
            argv += ["--predictors", args.predictors]
        for item in args.set:
            argv += ["--set", item]
        argv = resumable(argv, out)
        load_before = os.getloadavg()
        rc = cli(argv)
        if rc:
            return rc
        load_after = os.getloadavg()
        text = (out / "ablation.md").read_text()
        body = text.split("\n\n", 2)[-1]
        name = f"{args.data}-ablate-b{budget}{tag}"
        header = (f"# Ablation on the embedded {args.data} ViT, budget {budget}\n\n"
                  f"Produced by `{command.strip()}` (which runs `hetprune {shlex.join(argv)}`).\n\n"
                  f"Machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
                  f"{platform.platform()}; load average (1, 5, 15 min) "
                  f"{' '.join(f'{x:.2f}' for x in load_before)} at the start, "
                  f"{' '.join(f'{x:.2f}' for x in load_after)} at the end.\n\n")
        (results / f"{name}.md").write_text(header + body)
        shutil.copyfile(out / "ablation.json", results / f"{name}.json")
        shutil.copyfile(out / "splits.png", results / f"{name}-splits.png")
        if (out / "scorers.png").exists():
            shutil.copyfile(out / "scorers.png", results / f"{name}-scorers.png")
        print(f"wrote {results}/{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
