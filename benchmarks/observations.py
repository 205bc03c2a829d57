"""The paper's two observations (issue 43, item 3), measured on the embedded benchmarks.

* gradient disparity: each removable site's gate gradient |dL/dm| (the first-order estimate of what removing
  it does to the loss), averaged over training batches, by kind. The paper: an activation's gradients are far
  larger than an attention sub-block's;
* recovery asymmetry (the paper's Fig. 5): remove one site from the embedded base model, measure top-1 at
  once, then fine-tune (KD from the dense model, the embedded short schedule stretched to E epochs) and
  measure after every epoch. The paper: removing attention costs a moderate drop and recovers slowly;
  removing an activation costs a severe drop (often over 90 %) and recovers fast.

``--sites N`` measures N sites of each kind, evenly spaced over the depth (default: every site).

    python benchmarks/observations.py                       # digits and digit-pairs, seed 0, 6 epochs
    python benchmarks/observations.py --data digits --epochs 2 --sites 2   # a quick look
    python benchmarks/observations.py --data digit-grid --sites 6 --epochs 5 --add   # one more benchmark
    python benchmarks/observations.py --render               # the summary again from the results file

Writes benchmarks/results/observations.{md,json} with the machine, the load and the command (of each run,
where ``--add`` put runs of several commands in one file).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from hetprune_hetdpt import gates
from studylib.files import write
from studylib.machine import load, machine
from studylib.tables import table

from hetprune import Site, sites
from hetprune.core.loader import resolve
from hetprune.model import surgery
from hetprune.training.embedded import benchmark, embedded_model
from hetprune.training.task import classification

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KINDS = ("attn", "act")


def gradients(model, task, n_batches: int, seed: int) -> dict[str, float]:
    """Each site's mean |dL/dm| over ``n_batches`` training batches (no weight changes)."""
    model = copy.deepcopy(model).eval()
    every = sites(model, "attn") + sites(model, "act")
    bank, handles = gates.install(model, every)
    try:
        total = torch.zeros(len(every))
        n = 0
        for batch in task.scoring_batches(64 * n_batches, 64, n_batches, seed):
            bank.scores.grad = None
            task.loss(model, batch).backward()
            total += bank.scores.grad.detach().abs()
            n += 1
    finally:
        gates.uninstall(model, handles)
    return {str(s): float(total[i] / n) for i, s in enumerate(every)}


def recovery(dense, task, site: Site, epochs: int, seed: int) -> dict:
    """Top-1 with ``site`` removed: at once, then after each epoch of a KD fine-tune from the dense model."""
    model = copy.deepcopy(dense)
    (surgery.remove_attention if site.kind == "attn" else surgery.remove_activation)(model, site.block)
    at_once = task.evaluate(model)
    cfg = resolve().run.schedule("short_finetune", epochs=epochs, eval_every=1, seed=seed)
    history = task.fit(model, dense, cfg, "observe", progress=False, log=lambda m: None)
    curve = [h.get("metric") for h in history]
    return {"site": str(site), "at_once": at_once, "curve": curve}


def kind_summary(dense_top1: float, rows: list[dict], grads: dict) -> dict:
    out = {}
    for kind in KINDS:
        mine = [r for r in rows if r["site"].startswith(kind)]
        g = [v for k, v in grads.items() if k.startswith(kind)]
        epochs = len(mine[0]["curve"]) if mine else 0
        at_once = statistics.fmean(r["at_once"] for r in mine) if mine else None
        curve = [statistics.fmean(r["curve"][e] for r in mine) for e in range(epochs)]
        drop = None if at_once is None else dense_top1 - at_once
        out[kind] = {
            "grad_mean": statistics.fmean(g), "grad_median": statistics.median(g), "grad_min": min(g),
            "grad_max": max(g), "at_once_mean": at_once, "drop_mean": drop,
            "drop_max": max(dense_top1 - r["at_once"] for r in mine) if mine else None,
            "drop_relative_mean": None if drop is None else drop / dense_top1,
            "curve_mean": curve,
            # the share of the kind's mean drop won back after the first epoch (1.0: all of it); only where
            # there is a drop of at least a point to win back
            "recovered_after_1": (curve[0] - at_once) / drop if drop is not None and drop >= 1.0 and curve else None,
        }
    return out


def run(name: str, seed: int, epochs: int, n_sites: int | None, n_batches: int) -> dict:
    bench = benchmark(name)
    torch.manual_seed(seed)
    dense = embedded_model(name, progress=False, log=lambda *_: None)
    data = bench.data(selection=0)   # a study of removals, not a choice: the curve and the drop both on val
    task = classification(data)
    dense_top1 = task.evaluate(dense)
    t0 = time.time()
    grads = gradients(dense, task, n_batches, seed)
    rows = []
    for kind in KINDS:
        chosen = sites(dense, kind)
        if n_sites:
            step = max(1, len(chosen) // n_sites)
            chosen = chosen[::step][:n_sites]
        for s in chosen:
            r = recovery(dense, task, s, epochs, seed)
            rows.append(r)
            print(f"  {name} seed {seed} {s}: {r['at_once']:.2f} at once -> "
                  + " ".join(f"{c:.1f}" for c in r["curve"]), flush=True)
    return {"data": name, "seed": seed, "dense_top1": dense_top1, "tokens": tokens_of(dense),
            "gradients": grads, "recovery": rows, "by_kind": kind_summary(dense_top1, rows, grads),
            "seconds": round(time.time() - t0, 1)}


def tokens_of(model) -> int | None:
    embed = getattr(model, "patch_embed", None)
    n = getattr(embed, "num_patches", None)
    return None if n is None else n + getattr(model, "num_prefix_tokens", 1)


def verdict(k: dict) -> dict:
    """The observations as numbers: the activation/attention gradient ratio, each kind's mean drop, and the
    share of it won back after one epoch (None: no drop of a point to win back)."""
    a, m = k["attn"], k["act"]
    return {"gradient_ratio": m["grad_mean"] / max(a["grad_mean"], 1e-12),
            "drop_attn": a["drop_mean"], "drop_act": m["drop_mean"], "drop_act_max": m["drop_max"],
            "won_back_attn": a["recovered_after_1"], "won_back_act": m["recovered_after_1"]}


def markdown(r: dict) -> str:
    lines = ["# The paper's two observations on the embedded benchmarks", "",
             f"Command: `{r['command']}` ({r['wall_s']:.0f} s). Machine: {r['machine']}; load average "
             f"{r['load_before']} before, {r['load_after']} after (accuracy and gradients do not depend on it).", "",
             "Gradient disparity: each site's gate gradient |dL/dm| (m = 1 keeps the site, 0 removes it), the mean "
             f"of its absolute value over {r['batches']} training batches of 64, summarised by kind. Recovery "
             "asymmetry: one site removed from the embedded base model, top-1 at once, then after each epoch of the "
             f"embedded short fine-tune (KD from the dense model, {r['epochs']} epochs, evaluated every epoch). "
             "The paper: activations' gradients are far larger than attention's; removing attention costs a "
             "moderate drop and recovers slowly, removing an activation a severe drop (often over 90 %) that "
             "recovers fast.", ""]
    for run_ in r["runs"]:
        k = run_["by_kind"]
        v = verdict(k)
        made = (f"Command: `{run_['command']}` ({run_.get('wall_s', 0):.0f} s); load average {run_['load_before']} "
                f"before, {run_['load_after']} after; {run_['epochs']} epochs."
                if run_.get("command") and run_["command"] != r["command"] else "")
        lines += [f"## {run_['data']} (seed {run_['seed']}; {run_['tokens']} tokens; dense top-1 "
                  f"{run_['dense_top1']:.2f})", "", *([made, ""] if made else [])]
        rows = []
        for kind in KINDS:
            x = k[kind]
            n = sum(1 for row in run_["recovery"] if row["site"].startswith(kind))
            won = "no drop of a point" if x["recovered_after_1"] is None else f"{x['recovered_after_1']:.0%}"
            rows.append([kind, n, f"{x['grad_mean']:.4g}", f"{x['grad_median']:.4g}", f"{x['grad_min']:.4g}",
                         f"{x['grad_max']:.4g}", f"{x['at_once_mean']:.2f}", f"{x['drop_mean']:.2f} / {x['drop_max']:.2f}",
                         won, " ".join(f"{c:.1f}" for c in x["curve_mean"])])
        lines += table(["kind", "sites", "mean \\|dL/dm\\|", "median", "min", "max", "top-1 at once (mean)",
                        "drop (mean / largest)", "won back after epoch 1", "top-1 by epoch (mean)"], rows)
        lines += ["", f"Activation/attention gradient ratio (means): **{v['gradient_ratio']:.1f}x**.", "",
                  "Per site (top-1 at once, then by epoch): " + "; ".join(
                      f"{row['site']} {row['at_once']:.1f} -> {' '.join(f'{c:.1f}' for c in row['curve'])}"
                      for row in run_["recovery"]), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="digits,digit-pairs")
    p.add_argument("--seeds", default="0")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--sites", type=int, default=None, help="sites per kind (default: every site)")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--out", default=str(RESULTS / "observations"))
    p.add_argument("--add", action="store_true",
                   help="add these runs to OUT.json (replacing a run of the same data and seed), keeping the others")
    p.add_argument("--render", action="store_true",
                   help="recompute the summary and the Markdown from OUT.json's per-site measurements (no runs)")
    args = p.parse_args()
    out = Path(args.out)
    if args.render:
        r = json.loads(out.with_suffix(".json").read_text())
        for run_ in r["runs"]:
            run_["by_kind"] = kind_summary(run_["dense_top1"], run_["recovery"], run_["gradients"])
            run_["verdict"] = verdict(run_["by_kind"])
        write(out.parent, out.stem, r, markdown(r))
        return 0
    load_before = load()
    t0 = time.time()
    runs = [run(name, int(seed), args.epochs, args.sites, args.batches)
            for name in args.data.split(",") for seed in args.seeds.split(",")]
    command = "python benchmarks/observations.py " + shlex.join(sys.argv[1:])
    load_after = load()
    for run_ in runs:
        run_["verdict"] = verdict(run_["by_kind"])
        # each run says how it was made (a file may hold runs of several commands: --add)
        run_.update(command=command, machine=machine(), load_before=load_before, load_after=load_after,
                    epochs=args.epochs, batches=args.batches)
    r = {"command": command, "machine": machine(), "load_before": load_before, "load_after": load_after,
         "wall_s": time.time() - t0, "epochs": args.epochs, "batches": args.batches, "runs": runs}
    if args.add and out.with_suffix(".json").is_file():
        old = json.loads(out.with_suffix(".json").read_text())
        mine = {(x["data"], x["seed"]) for x in runs}
        kept = [x for x in old["runs"] if (x["data"], x["seed"]) not in mine]
        for x in kept:   # the runs of the earlier command keep its provenance
            for k in ("command", "machine", "load_before", "load_after", "epochs", "batches"):
                x.setdefault(k, old[k])
        for x in runs:
            x["wall_s"] = round(r["wall_s"], 1)
        r = {**old, "runs": kept + runs}   # the header keeps the first command's own time
    write(out.parent, out.stem, r, markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
