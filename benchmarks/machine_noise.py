"""How steady is this machine's compute? The floor under every speed figure measured on it.

Times, in alternating rounds for ``--seconds`` per thread count, the two kinds
of work a ViT block on the embedded digits model does at batch 64: the MLP's
matmul (1088 x 96 @ 96 x 384, fp32) and attention (``scaled_dot_product_attention``
over 64 x 3 heads, 17 tokens, head dim 32), ``--calls`` calls per round each. It
reports each one's median and 5th-95th percentile band, and the band of their
ratio per round: a drift that slows both alike cancels in that ratio (as it
does in an interleaved speedup), a drift of one against the other does not,
and it moves the measured speedup of a model with more or less attention
(the digits splits) by as much.

    python benchmarks/machine_noise.py                     # 20 s at 1 and at 2 threads

Writes benchmarks/results/machine-noise.{md,json} (``--tag`` changes the name).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from studylib.files import write
from studylib.tables import table

from hetprune import bench

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def band(values: list[float]) -> dict:
    med = statistics.median(values)
    return {"median": med, "p5": percentile(values, 0.05), "p95": percentile(values, 0.95),
            "low": percentile(values, 0.05) / med - 1, "high": percentile(values, 0.95) / med - 1}


@torch.inference_mode()
def rounds(threads: int, seconds: float, calls: int) -> dict:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(1088, 96, generator=gen), torch.randn(96, 384, generator=gen)
    q = torch.randn(64, 3, 17, 32, generator=gen)
    attend = torch.nn.functional.scaled_dot_product_attention
    for _ in range(calls):   # warm-up
        a @ b
        attend(q, q, q)
    mm, sdpa = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(calls):
            a @ b
        mm.append((time.perf_counter() - t) / calls)
        t = time.perf_counter()
        for _ in range(calls):
            attend(q, q, q)
        sdpa.append((time.perf_counter() - t) / calls)
    return {"threads": threads, "rounds": len(mm), "calls_per_round": calls, "matmul_s": band(mm),
            "attention_s": band(sdpa), "attention_over_matmul": band([s / m for s, m in zip(sdpa, mm)])}


def markdown(results: list[dict], env: dict, command: str, load: list) -> str:
    out = ["# Machine noise: how steady matmul and attention time on this machine", "", f"Command: `{command}`", "",
           f"Machine: {env['device_name']}, {env['cpu_count']} CPUs, torch {env['torch']}, fp32. Load average "
           f"{load[0]} at start, {load[1]} at end. Band: the 5th to the 95th percentile of the rounds, against "
           "their median.", ""]
    rows = []
    for r in results:
        cells = [r["threads"], r["rounds"]]
        for key, scale in (("matmul_s", 1e6), ("attention_s", 1e6), ("attention_over_matmul", 1.0)):
            b = r[key]
            cells.append(f"{b['median'] * scale:.3g} ({b['low']:+.0%} to {b['high']:+.0%})")
        rows.append(cells)
    out += table(["threads", "rounds", "matmul µs (band)", "attention µs (band)", "attention / matmul (band)"], rows)
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="per thread count")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--calls", type=int, default=20, help="calls of each kind per round")
    p.add_argument("--tag", default="machine-noise")
    args = p.parse_args()
    command = " ".join(["python benchmarks/machine_noise.py", *(shlex.quote(a) for a in sys.argv[1:])])
    env = bench.environment(torch.device("cpu"), "fp32", compile=False)
    start = bench.load_average()
    results = [rounds(int(t), args.seconds, args.calls) for t in args.threads.split(",")]
    load = [start, bench.load_average()]
    md = markdown(results, env, command, load)
    write(ROOT / "benchmarks" / "results", args.tag, {"command": command, "environment": env, "load": load,
                                                      "results": results}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
