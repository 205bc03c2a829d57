"""HetDPT+ order study (issue 16): depth-then-width (the paper), width-then-depth and interleaved rounds,
at equal MACs, against width-only ``isomorphic``, on the embedded benchmarks.

For each data set and MAC target it runs ``hetprune compare --strategies isomorphic`` once and
``hetprune compare --strategies hetdpt-plus --set hetdpt_plus.order=ORDER`` per order (3 seeds, two rows
at a time, each single-threaded; every other setting is the default), then writes one table:

    python benchmarks/plus_order.py                  # digits and digit-pairs, 0.5x and 0.35x MACs
    python benchmarks/plus_order.py --data digits --targets 0.5 --seeds 0

Resumable: rerun the same command to continue. Writes benchmarks/results/hetdpt-plus-order.md and .json
(``--name`` for another stem).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from studylib.files import write
from studylib.machine import load, machine
from studylib.runs import resumable
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent
ORDERS = ("depth-width", "width-depth", "interleaved")


def compare(data: str, target: str, seeds: str, out: Path, strategy: str, extra: list[str]) -> list[dict]:
    from hetprune.cli import main as cli

    argv = ["compare", "--data", data, "--strategies", strategy, "--target-macs", target, "--seeds", seeds,
            "--jobs", "2", "--batch-sizes", "1", "--out", str(out), *extra]
    argv = resumable(argv, out)
    if cli(argv):
        raise SystemExit(f"hetprune {' '.join(argv)} failed")
    return json.loads((out / "results.json").read_text())["rows"]


def summary(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def order_table(rows: list[dict]) -> list[str]:
    """One row per data, target and strategy (the results JSON's ``rows``), each against isomorphic's."""
    cells = []
    for row in rows:
        iso = next(r for r in rows if r["data"] == row["data"] and r["target_macs"] == row["target_macs"]
                   and r["strategy"] == "isomorphic")
        diff = statistics.mean(row["top1"]) - statistics.mean(iso["top1"])
        wall = [w for w in row["wall_s"] if w is not None]
        cells.append([row["data"], f"{row['target_macs']:g}", row["strategy"], summary(row["top1"]),
                      ", ".join(f"{x:.1f}" for x in row["top1"]),
                      ", ".join(row["splits"]) if row["strategy"] != "isomorphic" else "-",
                      f"{statistics.mean(row['mac_ratio']):.3f}", "-" if row is iso else f"{diff:+.2f}",
                      f"{statistics.mean(wall):.0f}" if wall else "-"])
    return table(["data", "MACs target", "strategy", "top-1 % (mean ± std)", "per seed",
                  "depth split per seed (attn+act)", "MAC ratio (mean)", "vs isomorphic (points)", "wall s (mean)"],
                 cells)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="digits,digit-pairs")
    p.add_argument("--targets", default="0.5,0.35", help="MAC targets (fractions of dense)")
    p.add_argument("--orders", default=",".join(ORDERS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="runs/plus-order")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--name", default="hetdpt-plus-order", help="stem of the files in --results (a part rerun "
                   "under its own name leaves the whole study's files as they are)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting for every run")
    args = p.parse_args()
    common = [a for item in args.set for a in ("--set", item)]
    # isomorphic refuses the settings of strategies it does not run (hetdpt.*, hetdpt_plus.*)
    width_only = [a for item in args.set if not item.startswith("hetdpt") for a in ("--set", item)]
    started, load_start = time.time(), load()
    os.environ["OMP_NUM_THREADS"] = "1"
    records = []
    for data in args.data.split(","):
        for target in args.targets.split(","):
            cells = {"isomorphic": compare(data, target, args.seeds, Path(args.out) / f"{data}-{target}-isomorphic",
                                           "isomorphic", width_only)}
            for order in args.orders.split(","):
                cells[order] = compare(data, target, args.seeds, Path(args.out) / f"{data}-{target}-{order}",
                                       "hetdpt-plus", [*common, "--set", f"hetdpt_plus.order={order}"])
            for name, rows in cells.items():
                rows = sorted(rows, key=lambda r: r["seed"])
                records.append({"data": data, "target_macs": float(target), "strategy": name,
                              "top1": [r["top1"] for r in rows], "seeds": [r["seed"] for r in rows],
                              "splits": [f"{r['n_attn']}+{r['n_act']}" for r in rows],
                              "mac_ratio": [r["macs"] / r["dense_macs"] for r in rows],
                              "wall_s": [r.get("wall_s") for r in rows]})
    command = "python benchmarks/plus_order.py " + " ".join(sys.argv[1:])
    payload = {"command": command, "machine": machine(), "load_start": load_start, "load_end": load(),
               "minutes": round((time.time() - started) / 60, 1), "rows": records}
    lines = [f"# HetDPT+ order: {args.orders.replace(',', ', ')}, against isomorphic at equal MACs", "",
             f"Produced by `{command}` ({payload['minutes']} min of runs not reused from an earlier "
             "invocation), which runs `hetprune compare --data DATA --target-macs T --seeds "
             f"{args.seeds} --jobs 2 --batch-sizes 1` with `--strategies isomorphic`, and with `--strategies "
             "hetdpt-plus --set hetdpt_plus.order=ORDER` per order"
             + (f", each with {' '.join(f'`--set {x}`' for x in args.set)}" if args.set else "")
             + "; every other setting is the default.", "",
             f"Machine: {payload['machine']}. Load average {', '.join(f'{x:.2f}' for x in load_start)} at the start "
             "(accuracy does not depend on load).", "", *order_table(records)]
    write(args.results, args.name, payload, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
