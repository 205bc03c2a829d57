"""Does the latency cost model predict measured speedups? (issues 17 and 28)

For each geometry (DeiT-B, DeiT-S at 224 px with random weights, timing does
not depend on them; the embedded digits and digit-pairs ViTs) and batch size it

1. builds the latency table from an empty cache and reports what that cost;
2. turns ``--target-speedup S`` (latency model) into the feasible splits every
   depth strategy chooses from: attn-only, act-only and mix50 take their
   corner or middle, hetdpt picks one of them by accuracy, so every feasible
   split is built, with its sites on as many shared blocks as possible (the
   placement the budget guards against), block-drop's block count, and a
   width-pruned model at 1/S of the MACs (every block its own shape);
3. predicts each model's time from the table, then times the dense model and
   all of them interleaved, whole (``hetprune.measure.bench.measure``), and reports
   predicted against measured speedup and whether the target was met. An
   identical copy of the dense model is timed as one more model (A/A): its
   measured speedup should be 1, and its distance from 1 is the machine's
   noise floor within a session. Every model is timed in ``--sessions``
   sessions (default 2), one after the other, each what ``hetprune bench``
   does: the measured speedup is the median of the sessions' speedups, and
   their range is the noise floor between sessions (the table is timed in a
   session of its own, so no prediction can be judged closer). On a shared
   2-core VM attention's time against the MLP matmul's drifts by 20-30 % from
   round to round (``benchmarks/machine_noise.py``), so the speedups of digits
   splits with more or less attention move by 10-15 % between sessions; more
   sessions give a median that a prediction can be judged against.

    python benchmarks/latency_model.py                      # all geometries, batch 1 and a large batch
    python benchmarks/latency_model.py --configs digits --batches 1,256
    python benchmarks/latency_model.py --configs digits,digit-pairs --batches 64,256 --no-width \
        --quiet-load 1.5 --sessions 5 --budget 4 --tag embedded   # the embedded models, on a quiet machine

Writes benchmarks/results/latency-model-cpu.{md,json} (``--tag`` changes the
name). Run it on a quiet machine: it prints the load average at start and end;
with ``--quiet-load L`` each geometry and batch waits (up to ``--quiet-wait``
seconds) until the 1-minute load average is below L, and says if it never was.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from studylib.files import write
from studylib.tables import table

from hetprune import bench
from hetprune.measure.latency_table import LatencyTable
from hetprune.model import surgery
from hetprune.model.sites import depth
from hetprune.model.spec import DIGIT_PAIRS_SPEC, DIGITS_SPEC, ModelSpec, build
from hetprune.pruning.budget import Budget, feasible_pairs

ROOT = Path(__file__).resolve().parent.parent

AA = "dense again (A/A)"
CONFIGS = {
    "deit-b": (ModelSpec("deit_base_patch16_224", {}), (3, 224, 224), 8),
    "deit-s": (ModelSpec("deit_small_patch16_224", {}), (3, 224, 224), 32),
    "digits": (DIGITS_SPEC, (1, 16, 16), 256),
    "digit-pairs": (DIGIT_PAIRS_SPEC, (1, 16, 16), 256),   # the same ViT with two 16x8 patches: 3 tokens
}


def overlapping(model, a: int, m: int, merge: bool = True):
    """``a`` attention and ``m`` activation sites on as many shared blocks as possible (from the last block
    down, so the class token keeps the early attention), merged."""
    out = copy.deepcopy(model)
    n = depth(out)
    for b in range(a):
        surgery.remove_attention(out, n - 1 - b)
    for b in range(m):
        surgery.remove_activation(out, n - 1 - b)
    if merge:
        surgery.merge_all(out)
    return out.eval()


def dropped(model, k: int):
    out = copy.deepcopy(model)
    n = depth(out)
    for b in range(k):
        surgery.drop_block(out, n - 1 - b)
    return out.eval()


def run_config(name: str, batch: int, speedup: float, repeats: int, log, width: bool = True,
               device: str = "cpu", dtype: str = "fp32", budget_s: float = 2.0, sessions: int = 2) -> dict:
    spec, shape, _ = CONFIGS[name]
    torch.manual_seed(0)
    dev = torch.device(device)
    dense = build(spec).eval().to(dev)
    x = torch.randn(2, *shape, device=dev)
    table = LatencyTable(dev, batch_size=batch, dtype=dtype, log=log)
    started = time.time()
    budget = Budget(target_speedup=speedup, cost_model="latency")
    pairs = feasible_pairs(dense, budget, x, cost=table.predict, prepare=table.prepare)
    dense_pred = table.predict(dense, x)
    per_block = dense_pred - table.predict(dropped(dense, 1), x)
    depth_table_s = time.time() - started     # what a depth strategy's budget costs: dense, the variants, dropped
    # an identical copy, timed as if it were another model: its measured "speedup" should be 1; how far it
    # lands from 1 is this machine's noise floor for every other row
    models = {"dense": dense, AA: copy.deepcopy(dense)}
    for a, m in pairs:
        models[f"split {a}+{m}"] = overlapping(dense, a, m)
    k = int(-(-(dense_pred - dense_pred / speedup) // per_block))
    models[f"block-drop {k}"] = dropped(dense, k)
    if width:   # width-pruned to 1/S of the MACs (magnitude importance; every block its own shape)
        from hetprune.model.macs import count_macs
        from hetprune_width.pruner import IsomorphicWidthPruner

        thin = copy.deepcopy(dense).cpu()
        IsomorphicWidthPruner().prune(thin, count_macs(dense, x[:1]) / speedup, x[:1].cpu())
        models[f"width 1/{speedup:g} MACs"] = thin.eval().to(dev)
    table.prepare(list(models.values()), x)   # new parts (width-pruned blocks) in one session, as a run's report does
    predicted = {n: table.predict(mdl, x) for n, mdl in models.items()}
    build_s = time.time() - started
    log(f"{name} batch {batch}: table of {len(table.entries)} parts built and {len(models) - 1} models predicted in "
        f"{build_s:.1f}s")
    # timed whole in several sessions one after the other, each what `hetprune bench` does: on a shared machine
    # measured speedups move between sessions, and a prediction cannot be judged closer than they agree
    timed = [bench.measure(models, shape, [batch], device=device, dtype=dtype, repeats=repeats, min_time_s=0.05,
                           budget_s=budget_s, reference="dense", log=log) for _ in range(sessions)]
    by_session = [{r["model"]: r for r in m["results"]} for m in timed]
    rows = []
    for model, r in by_session[0].items():
        pred = predicted["dense"] / predicted[model]
        each = [s[model]["speedup"] for s in by_session]
        median = statistics.median(each)
        rows.append({"model": model, "predicted_speedup": pred, "measured_speedup": median,
                     "session_speedups": each, "session_spread": max(abs(v / median - 1) for v in each),
                     "error": pred / median - 1, "mac_ratio": r["mac_ratio"],
                     "paired_speedup": r["paired_speedup"]["median"], "rounds": len(r["latency_s"]["runs"]),
                     "predicted_ms": predicted[model] * 1e3, "measured_ms": r["latency_s"]["median"] * 1e3,
                     "measured_iqr_ms": [r["latency_s"]["q1"] * 1e3, r["latency_s"]["q3"] * 1e3],
                     "target_met": None if model in ("dense", AA) else median >= speedup * 0.97})
    return {"config": name, "batch": batch, "speedup_target": speedup, "table_parts": len(table.entries),
            "depth_table_s": depth_table_s, "table_and_predictions_s": build_s,
            "self_check": table.check, "untrusted": table.untrusted,
            "sessions": sessions, "environment": timed[0]["environment"], "rows": rows}


def wait_until_quiet(limit: float | None, wait_s: float, log) -> dict:
    """Wait until the 1-minute load average is below ``limit`` (checked every 15 s, at most ``wait_s``)."""
    started = time.time()
    while True:
        load = bench.load_average()
        if limit is None or load is None or load[0] < limit:
            return {"load": load, "waited_s": round(time.time() - started), "quiet": True}
        if time.time() - started >= wait_s:
            log(f"load average {load[0]} never fell below {limit} in {wait_s:.0f} s: measuring anyway, marked")
            return {"load": load, "waited_s": round(time.time() - started), "quiet": False}
        time.sleep(15)


def _quiet_text(res: dict) -> str:
    q = res.get("quiet")
    if not q:
        return ""
    return (f" Waited {q['waited_s']} s for a 1-minute load average below {q['limit']}"
            + ("." if q["quiet"] else ": it never was, so these rows were measured on a busy machine."))


def _check_text(res: dict) -> str:
    c = res.get("self_check")
    if not c:
        return ""
    text = (f" Self-check: the dense model timed whole beside its parts, {c['measured_s'] * 1e3:.2f} ms; its parts "
            f"add up to {c['predicted_s'] * 1e3:.2f} ms ({c['error']:+.1%}).")
    return text + (f" The table said its predictions cannot be trusted: {res['untrusted']}." if res.get("untrusted")
                   else "")


def markdown(results: list[dict], command: str) -> str:
    env = results[0]["environment"]
    out = ["# Latency cost model: predicted against measured speedup", "",
           f"Command: `{command}`", "",
           f"Machine: {env['device_name']}, {env['cpu_count']} CPUs, torch {env['torch']}, {env['threads']} threads, "
           f"{env['dtype']}. Each table lists every model the budget allows (every feasible split, sites sharing blocks; "
           f"block-drop's count), predicted from the per-part table and timed whole, interleaved with the dense "
           f"model in short rounds (median of the rounds; the budget in seconds per model is in the command), in "
           f"{results[0].get('sessions', 2)} sessions one after the other, each what `hetprune bench` does: measured "
           f"speedup = the median of the sessions' speedups, sessions' range = their lowest and highest, off by = "
           f"the session farthest from the median. Target met = measured speedup >= 97% of the target.", ""]
    for res in results:
        e = res["environment"]
        out += [f"## {res['config']}, batch {res['batch']}, --target-speedup {res['speedup_target']:g} (latency)", "",
                f"Table: {res['table_parts']} parts. The parts a depth budget needs (dense, without attention, "
                f"merged MLP, both, dropped, outside) took {res['depth_table_s']:.1f} s to time from an empty cache; "
                f"with the width-pruned model's blocks and every prediction, "
                f"{res['table_and_predictions_s']:.1f} s. Load average {e.get('load_start')} at start, "
                f"{e.get('load_end')} at end." + _quiet_text(res) + _check_text(res), ""]
        out += table(["model", "predicted ms", "measured ms (IQR)", "predicted speedup", "measured speedup",
                      "sessions' range (off by)", "error", "MAC ratio", "target met"],
                     [[r["model"], f"{r['predicted_ms']:.2f}",
                       f"{r['measured_ms']:.2f} ({r['measured_iqr_ms'][0]:.2f}-{r['measured_iqr_ms'][1]:.2f})",
                       f"{r['predicted_speedup']:.3f}", f"{r['measured_speedup']:.3f}",
                       f"{min(r['session_speedups']):.3f}-{max(r['session_speedups']):.3f} ({r['session_spread']:.1%})",
                       f"{r['error']:+.1%}", f"{r['mac_ratio']:.2f}",
                       "-" if r["target_met"] is None else "yes" if r["target_met"] else "NO"] for r in res["rows"]])
        judged = [r for r in res["rows"] if r["model"] not in ("dense", AA)]
        worst = max(abs(r["error"]) for r in judged)
        noise = next((abs(r["error"]) for r in res["rows"] if r["model"] == AA), None)
        within = sum(abs(r["error"]) <= 0.05 for r in judged)
        inside = sum(min(r["session_speedups"]) <= r["predicted_speedup"] <= max(r["session_speedups"])
                     for r in judged)
        moved = max(r["session_spread"] for r in judged)
        out += ["", f"Largest prediction error: {worst:.1%}; within 5 %: {within} of {len(judged)}; inside the "
                f"sessions' range: {inside} of {len(judged)}."
                + (f" Noise floor: the identical copy of dense measured {noise:.1%} away from dense;" if noise is not None
                   else "") + f" a session's speedup was up to {moved:.1%} away from the median of the sessions.",
                ""]
    judged = [(res, r) for res in results for r in res["rows"] if r["model"] not in ("dense", AA)]
    res, worst = max(judged, key=lambda t: abs(t[1]["error"]))
    out += ["## Summary", "",
            f"Largest |prediction error| over every table: {abs(worst['error']):.1%} ({worst['model']}, "
            f"{res['config']} batch {res['batch']}); within 5 %: "
            f"{sum(abs(r['error']) <= 0.05 for _, r in judged)} of {len(judged)} rows.", ""]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="digits,deit-s,deit-b")
    p.add_argument("--batches", default=None, help="batch sizes (default: 1 and each config's large batch)")
    p.add_argument("--speedup", type=float, default=1.5)
    p.add_argument("--repeats", type=int, default=7, help="rounds of the whole-model timing, at least")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds per model of the whole-model timing: as many 0.05 s rounds as fit (at least --repeats)")
    p.add_argument("--sessions", type=int, default=2,
                   help="times each model is timed whole, one session after the other (the median is compared)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--tag", default="cpu")
    p.add_argument("--no-width", action="store_true", help="leave out the width-pruned model")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 (autocast), fp16 (CUDA)")
    p.add_argument("--out", default=None, help="folder for the results (default benchmarks/results)")
    p.add_argument("--quiet-load", type=float, default=None,
                   help="wait before each geometry and batch until the 1-minute load average is below this")
    p.add_argument("--quiet-wait", type=float, default=600.0, help="seconds to wait for that at most")
    args = p.parse_args()
    if args.sessions < 1:
        p.error(f"--sessions must be at least 1, got {args.sessions}")
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HETPRUNE_CACHE"] = tempfile.mkdtemp(prefix="hetprune-latency-bench-")  # a cold table
    command = "python benchmarks/latency_model.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"load average at start: {bench.load_average()}", flush=True)
    results = []
    for name in args.configs.split(","):
        batches = [int(b) for b in args.batches.split(",")] if args.batches else [1, CONFIGS[name][2]]
        for batch in batches:
            quiet = wait_until_quiet(args.quiet_load, args.quiet_wait, log=lambda m: print(m, flush=True))
            results.append(run_config(name, batch, args.speedup, args.repeats, log=lambda m: print(m, flush=True),
                                      width=not args.no_width, device=args.device, dtype=args.dtype,
                                      budget_s=args.budget, sessions=args.sessions))
            if args.quiet_load is not None:
                results[-1]["quiet"] = {**quiet, "limit": args.quiet_load}
    md = markdown(results, command)
    write(Path(args.out) if args.out else ROOT / "benchmarks" / "results", f"latency-model-{args.tag}",
          {"command": command, "results": results}, md)
    print(f"load average at end: {bench.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
