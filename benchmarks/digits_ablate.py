"""Reproduce benchmarks/results/digits-ablate-b<K>.md (+ .json, splits and scorer plots).

Runs `hetprune ablate` on the embedded default (digits ViT): every feasible
split of each budget fine-tuned fully with 3 seeds, the poly predictor judged
against that ground truth, and the scorers compared at its pick.

    python benchmarks/digits_ablate.py                       # budgets 6,12; seeds 0,1,2
    python benchmarks/digits_ablate.py --budgets 12 --seeds 0

Resumable: rerun the same command to continue an interrupted run.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
from pathlib import Path

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
    p.add_argument("--out", default="runs/digits-ablate")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()

    import torch

    from hetprune.cli import main as cli

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/digits_ablate.py " + " ".join(sys.argv[1:])
    for budget in [int(b) for b in args.budgets.split(",")]:
        out = Path(args.out) / f"b{budget}"
        argv = ["ablate", "--budget", str(budget), "--seeds", args.seeds, "--scorers", args.scorers,
                "--jobs", args.jobs, "--out", str(out)]
        if (out / "rows.jsonl").exists():
            argv.append("--resume")
        rc = cli(argv)
        if rc:
            return rc
        text = (out / "ablation.md").read_text()
        body = text.split("\n\n", 2)[-1]
        header = (f"# Ablation on the embedded default (digits ViT), budget {budget}\n\n"
                  f"Produced by `{command.strip()}` (which runs `hetprune {' '.join(argv)}`).\n\n"
                  f"Machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
                  f"{platform.platform()}.\n\n")
        (results / f"digits-ablate-b{budget}.md").write_text(header + body)
        shutil.copyfile(out / "ablation.json", results / f"digits-ablate-b{budget}.json")
        shutil.copyfile(out / "splits.png", results / f"digits-ablate-b{budget}-splits.png")
        if (out / "scorers.png").exists():
            shutil.copyfile(out / "scorers.png", results / f"digits-ablate-b{budget}-scorers.png")
        print(f"wrote {results}/digits-ablate-b{budget}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
