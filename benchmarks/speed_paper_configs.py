"""Measured speedup of the paper's pruned configurations, dense vs pruned.

    python benchmarks/speed_paper_configs.py                                  # CPU, fp32, batch auto
    python benchmarks/speed_paper_configs.py --device cuda --dtype bf16 --batch-size 256

For DeiT-B and DeiT-S: the dense timm model, and the same model with the sites
of the shipped recipe ``deit_base_hetdpt_paper`` removed and the linear MLPs
merged (attention gone in blocks 0,3,7,8,11, GELU gone and MLP merged in
blocks 2,7,8,10,11; the DeiT-S recipe reuses those sites on DeiT-S's arch).
Weights are random: speed does not depend on them. Both models of a pair are
timed interleaved in one process (hetprune.measure.bench.measure).

Writes ``benchmarks/results/speed-<device>.md`` and ``.json``. Targets:
CPU, measured speedup >= 95% of the MAC ratio; GPU, DeiT-B >= 1.58x (the
paper's number). When a CPU target is missed (or with ``--profile always``)
torch.profiler shows where the time goes, per op, in the results file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from studylib.tables import table

from hetprune.measure.bench import environment_line, format_table, measure, resolve_device
from hetprune.core.io import write_json_atomic, write_text_atomic
from hetprune.model.spec import ModelSpec, build
from hetprune.model.recipe import Recipe, apply_recipe, arch_of, resolve_recipe

PAPER_RECIPE = "deit_base_hetdpt_paper"
CONFIGS = {"deit_b": "deit_base_patch16_224", "deit_s": "deit_small_patch16_224"}
PAPER_SPEEDUP = {"deit_b": 1.58, "deit_s": 1.39}  # GPU speedups the paper reports
CPU_EFFICIENCY_TARGET = 0.95
CANDIDATE_BATCHES = (64, 32, 16, 8, 4, 2, 1)
OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", metavar="auto|cpu|cuda|cuda:N")
    p.add_argument("--dtype", default=None, choices=("fp32", "bf16", "fp16"),
                   help="default: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--batch-size", default="auto", metavar="N|auto",
                   help="auto: 256 on CUDA; on CPU the largest of 64,32,... whose dense forward "
                        "takes under --max-forward-s")
    p.add_argument("--max-forward-s", type=float, default=60.0, help="CPU batch choice limit (default 60 s)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--cast", default="autocast", choices=("autocast", "weights"),
                   help="bf16/fp16 under autocast over fp32 weights (default), or in that dtype's weights")
    p.add_argument("--tf32", default="on", choices=("on", "off"), help="fp32 matmuls in TF32 on GPUs with it")
    p.add_argument("--configs", default="deit_b,deit_s", help="comma list of " + ", ".join(CONFIGS))
    p.add_argument("--profile", default="auto", choices=("auto", "always", "never"),
                   help="auto: profile a pair whose CPU target is missed")
    p.add_argument("--out", default=str(OUT), help="results folder")
    p.add_argument("--render", metavar="JSON", help="only rewrite the Markdown next to a results JSON (no measuring)")
    return p.parse_args(argv)


def pruned_recipe(name: str, dense: torch.nn.Module) -> Recipe:
    """The paper's DeiT-B sites, on the architecture of ``name``."""
    paper = resolve_recipe(PAPER_RECIPE)
    if name == paper.base.name:
        return paper
    d = paper.to_dict()
    d["base"] = ModelSpec(name).to_dict()
    d["arch"] = arch_of(dense)
    d["provenance"] = {**paper.provenance, "source": f"sites of shipped recipe {PAPER_RECIPE} on {name}"}
    return Recipe.from_dict(d, where=f"{PAPER_RECIPE} on {name}")


def make_pair(name: str):
    torch.manual_seed(0)
    dense = build(ModelSpec(name))
    recipe = pruned_recipe(name, dense)
    torch.manual_seed(0)
    pruned = apply_recipe(build(recipe.base), recipe, compute_merge=True).eval()
    return dense, pruned, recipe


@torch.inference_mode()
def one_forward_s(model, batch: int, shape, device) -> float:
    x = torch.randn(batch, *shape, device=device)
    model(x)  # first call allocates
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    model(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def choose_batch(arg: str, dense, shape, device, max_forward_s: float, log) -> tuple[int, str]:
    if arg != "auto":
        return int(arg), "given with --batch-size"
    if device.type == "cuda":
        return 256, "CUDA default"
    probe = 4
    per_image = one_forward_s(dense.to(device), probe, shape, device) / probe
    for b in CANDIDATE_BATCHES:
        if b * per_image <= max_forward_s:
            how = (f"largest of {CANDIDATE_BATCHES} whose dense forward is estimated under {max_forward_s:.0f} s "
                   f"({per_image:.2f} s/image at batch {probe})")
            log(f"  batch {b}: {how}")
            return b, how
    return 1, "even batch 1 is slow"


# -- profiling --------------------------------------------------------------------
GROUPS = (
    ("linear (addmm/mm)", ("addmm", "aten::mm", "matmul", "linear")),
    ("attention (sdpa/bmm/softmax)", ("scaled_dot_product", "flash_attention", "bmm", "softmax")),
    ("layer norm", ("layer_norm",)),
    ("gelu", ("gelu",)),
    ("add/mul", ("aten::add", "aten::mul")),
    ("conv (patch embed)", ("conv",)),
    ("copies/reshapes", ("copy", "clone", "contiguous", "cat", "transpose", "permute", "view", "reshape",
                         "unbind", "expand", "select", "slice", "empty", "aten::to")),
)


def group_of(op: str) -> str:
    for group, keys in GROUPS:
        if any(k in op for k in keys):
            return group
    return "other"


@torch.inference_mode()
def profile_ops(model, batch: int, shape, device, autocast_dtype) -> dict[str, float]:
    """Self time (ms) per aten op of one forward."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(batch, *shape, device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])

    def fwd():
        if autocast_dtype is None:
            return model(x)
        with torch.autocast(device.type, dtype=autocast_dtype):
            return model(x)

    fwd()
    with profile(activities=activities) as prof:
        fwd()
        if device.type == "cuda":
            torch.cuda.synchronize()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {e.key: getattr(e, attr) / 1e3 for e in prof.key_averages() if getattr(e, attr) > 0}


def profile_section(label: str, dense_ops: dict, pruned_ops: dict, mac_ratio: float, batch: int) -> str:
    total_d, total_p = sum(dense_ops.values()), sum(pruned_ops.values())
    lines = [f"#### Profile: {label} (one forward each, batch {batch}, self time per op)", "",
             f"Profiled total: dense {total_d:.0f} ms, pruned {total_p:.0f} ms ({total_d / total_p:.2f}x; "
             f"MAC ratio {mac_ratio:.2f}x). If every group scaled with MACs the pruned model would take "
             f"{total_d / mac_ratio:.0f} ms; the 'excess' column is pruned minus dense/MAC-ratio per group.", ""]
    groups: dict[str, list[float]] = {}
    for ops, col in ((dense_ops, 0), (pruned_ops, 1)):
        for op, ms in ops.items():
            groups.setdefault(group_of(op), [0.0, 0.0])[col] += ms
    lines += table(["group", "dense ms", "pruned ms", "dense/pruned", "share of dense", "excess ms"],
                   [[g, f"{d:.1f}", f"{p:.1f}", f"{d / p:.2f}x" if p > 0 else "gone", f"{d / total_d:.1%}",
                     f"{p - d / mac_ratio:+.1f}"] for g, (d, p) in sorted(groups.items(), key=lambda kv: -kv[1][0])])
    biggest = sorted(set(dense_ops) | set(pruned_ops), key=lambda k: -max(dense_ops.get(k, 0), pruned_ops.get(k, 0)))
    ops = [(op, dense_ops.get(op, 0.0), pruned_ops.get(op, 0.0)) for op in biggest[:12]]
    lines += ["", *table(["op", "dense ms", "pruned ms", "dense/pruned"],
                         [[f"`{op}`", f"{d:.1f}", f"{p:.1f}", f"{d / p:.2f}x" if p else "gone"] for op, d, p in ops])]
    return "\n".join(lines)


# -- report -----------------------------------------------------------------------------
def _pruned_row(result: dict) -> dict:
    return next(r for r in result["results"] if r["model"] == "hetdpt-paper")


def _verdict(met) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")


def run_section(key: str, result: dict) -> str:
    row = _pruned_row(result)
    paired = row.get("paired_speedup")
    text = [f"### {key}: {result['model']}, batch {row['batch_size']} ({result['batch_choice']})", "",
            format_table(result, markdown=True), "",
            f"**Measured speedup {row['speedup']:.2f}x"
            + (f" (per-round median {paired['median']:.2f}x)" if paired else "")
            + f", MAC ratio {row['mac_ratio']:.2f}x ({row['speedup_over_mac_ratio']:.0%} of it). "
            f"{result['target']}: {_verdict(result['target_met'])}.**"]
    if "profile_ms" in result:
        prof = result["profile_ms"]
        text += ["", profile_section(key, prof["dense"], prof["hetdpt-paper"], row["mac_ratio"], row["batch_size"])]
    return "\n".join(text)


def render(payload: dict) -> str:
    """The Markdown report, from the JSON alone (so ``--render`` can redo it without measuring)."""
    runs = payload["runs"]
    first = next(iter(runs.values()))
    env, settings = first["environment"], first["settings"]
    rows = []
    for result in runs.values():
        d = next(r for r in result["results"] if r["model"] == "dense")
        p = _pruned_row(result)
        paired = f"{p['paired_speedup']['median']:.2f}x" if "paired_speedup" in p else "-"
        rows.append([result["model"], p["batch_size"], f"{d['latency_s']['median'] * 1e3:.0f}",
                     f"{p['latency_s']['median'] * 1e3:.0f}", f"{p['speedup']:.2f}x", paired, f"{p['mac_ratio']:.2f}x",
                     f"{p['speedup_over_mac_ratio']:.0%}", _verdict(result["target_met"])])
    summary = table(["config", "batch", "dense ms", "pruned ms", "measured speedup", "per-round median", "MAC ratio",
                     "speedup / MAC ratio", "target"], rows)
    loads = [r["environment"].get(k) for r in runs.values() for k in ("load_start", "load_end")]
    busy = max([load[0] for load in loads if load], default=0) > (env["cpu_count"] or 1)
    warning = ([f"**Note: the 1-minute load average exceeded the {env['cpu_count']} cores during the run: other "
                "jobs shared the CPU. Interleaving spreads that noise over both models, but the latencies "
                "themselves are slower than on an idle machine and the ratios noisier.**", ""] if busy else [])
    mode = env.get("precision", env["dtype"]) + (", compiled" if env.get("compile") else "")
    doc = [f"# Speed of the paper's pruned configurations ({env['device']}, {mode})", "",
           "Produced by:", "", "```", payload["command"], "```", "",
           f"Machine: {environment_line(first)}. Python {env['python']}, timm {env.get('timm')}, "
           f"{env['platform']}. Whole run: {payload['minutes']:.1f} min.", "", *warning,
           f"Dense timm model vs the same model with the sites of `{PAPER_RECIPE}` removed and its linear MLPs "
           "merged (random weights). The two models of a pair are timed interleaved in one process "
           f"(`hetprune.measure.bench.measure`: {settings['warmup']} warm-up round(s), {settings['repeats']} timed rounds). "
           "Speedup = ratio of median latencies; per-round = the dense/pruned ratio within each interleaved round "
           "(both times share that round's noise). Load average is [1, 5, 15]-minute.", "",
           *summary, ""]
    for key, result in runs.items():
        doc += [run_section(key, result), ""]
    return "\n".join(doc)


# -- main -------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        payload = json.loads(Path(args.render).read_text())
        write_text_atomic(Path(args.render).with_suffix(".md"), render(payload))
        print(f"wrote {Path(args.render).with_suffix('.md')}")
        return 0
    command = shlex.join(["python", "benchmarks/speed_paper_configs.py", *(sys.argv[1:] if argv is None else argv)])
    device = resolve_device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    torch.set_num_threads(args.threads)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    started = time.time()
    shape = (3, 224, 224)
    runs = {}
    for key in [c.strip() for c in args.configs.split(",") if c.strip()]:
        name = CONFIGS[key]
        log(f"{key}: building {name} dense and pruned ({PAPER_RECIPE} sites, merged) ...")
        dense, pruned, recipe = make_pair(name)
        batch, how = choose_batch(args.batch_size, dense, shape, device, args.max_forward_s, log)
        result = measure({"dense": dense, "hetdpt-paper": pruned}, shape, [batch], device=args.device, dtype=dtype,
                         compile=args.compile, repeats=args.repeats, warmup=args.warmup, min_time_s=0.0,
                         reference="dense", threads=args.threads, log=log, cast=args.cast, tf32=args.tf32 == "on")
        row = _pruned_row(result)
        if device.type == "cuda":
            target = PAPER_SPEEDUP[key] if key == "deit_b" else None
            met = None if target is None else row["speedup"] >= target
            target_text = (f"GPU target: speedup >= {target}x (paper)" if target else
                           f"no GPU target (paper reports {PAPER_SPEEDUP[key]}x for its own DeiT-S config)")
        else:
            met = row["speedup_over_mac_ratio"] >= CPU_EFFICIENCY_TARGET
            target_text = f"CPU target: speedup >= {CPU_EFFICIENCY_TARGET:.0%} of the MAC ratio"
        result.update(config=key, model=name, batch_choice=how, recipe=recipe.to_dict(), target=target_text,
                      target_met=met)
        log(format_table(result))
        if args.profile == "always" or (args.profile == "auto" and met is False):
            log(f"{key}: profiling one forward of each model ...")
            ac = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
            result["profile_ms"] = {"dense": profile_ops(dense, row["batch_size"], shape, device, ac),
                                    "hetdpt-paper": profile_ops(pruned, row["batch_size"], shape, device, ac)}
        runs[key] = result
        del dense, pruned
    minutes = (time.time() - started) / 60
    payload = {"command": command, "minutes": round(minutes, 2), "runs": runs}
    stem = Path(args.out) / f"speed-{device.type}"
    write_json_atomic(stem.with_suffix(".json"), payload)
    write_text_atomic(stem.with_suffix(".md"), render(payload))
    log(f"wrote {stem}.md and .json in {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
