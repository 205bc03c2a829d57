"""Reproduce benchmarks/results/digits-compare.md and digits-compare.png
(or, with --name and --target-macs, another comparison such as HetDPT+).

Runs `hetprune compare` on an embedded benchmark (``--data digits``, the
default, or ``digit-pairs``) for several budgets and seeds, then copies its table and plot into benchmarks/results/
with the machine and the exact command.

    python benchmarks/digits_compare.py                      # budgets 8,12; seeds 0,1,2
    python benchmarks/digits_compare.py --budgets 12 --seeds 0 --out runs/quick
    python benchmarks/digits_compare.py --name digits-hetdpt-plus --strategies isomorphic,hetdpt-plus \
        --target-macs 0.5 --out runs/digits-hetdpt-plus

Resumable: rerun the same command to continue an interrupted run.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path

from studylib.runs import resumable

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="hetdpt,attn-only,act-only,mix50,block-drop")
    p.add_argument("--budgets", default="8,12")
    p.add_argument("--target-macs", default=None, help="a MAC target instead of site budgets (e.g. 0.5)")
    p.add_argument("--name", default="digits-compare", help="stem of the files in benchmarks/results/")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--jobs", default="2", help="rows run in parallel single-threaded processes")
    p.add_argument("--out", default="runs/digits-compare")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--data", default="digits", help="the embedded benchmark: digits or digit-pairs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting for every run")
    args = p.parse_args()

    from hetprune.cli import main as cli
    from hetprune.harness.compare import base_text

    budget = ["--target-macs", args.target_macs] if args.target_macs else ["--budgets", args.budgets]
    argv = ["compare", "--data", args.data, "--strategies", args.strategies, *budget, "--seeds", args.seeds,
            "--jobs", args.jobs, "--out", args.out] + [a for item in args.set for a in ("--set", item)]
    argv = resumable(argv, Path(args.out))
    rc = cli(argv)
    if rc:
        return rc
    out, results = Path(args.out), Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    data = json.loads((out / "results.json").read_text())
    env = (data.get("timing") or {}).get("environment", {})
    command = "python benchmarks/digits_compare.py " + " ".join(sys.argv[1:])
    text = (out / "results.md").read_text()
    body = text[text.index("MACs per image"):]  # the table and its conventions; the header is ours
    header = (
        f"# {args.strategies.replace(',', ', ')} on the embedded {args.data} ViT\n\n"
        f"Produced by `{command.strip()}` (which runs `hetprune {' '.join(argv)}`).\n\n"
        f"Machine: {env.get('cpu', platform.processor() or '?')}, {env.get('cpu_count', '?')} cores, "
        f"{env.get('threads', '?')} torch threads for timing, torch {env.get('torch', '?')}, "
        f"timm {env.get('timm', '?')}, {env.get('platform', platform.platform())}; "
        f"load average {env.get('load_start')} at the start of timing, {env.get('load_end')} at the end.\n\n"
        + base_text(data["meta"].get("base") or {})
    )
    (results / f"{args.name}.md").write_text(header + body)
    shutil.copyfile(out / "pareto.png", results / f"{args.name}.png")
    shutil.copyfile(out / "results.json", results / f"{args.name}.json")
    print(f"wrote {results / args.name}.md, .png, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
