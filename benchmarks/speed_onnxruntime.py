"""Deployment speed in ONNX Runtime: the paper's pruned configurations and the default compare's models.

    python benchmarks/speed_onnxruntime.py                       # the committed results (quiet 2-core CPU)
    python benchmarks/speed_onnxruntime.py --configs tiny --compare-dir none --out /tmp/ort-check   # smoke check

1. For DeiT-B and DeiT-S: the dense timm model and the same model with the sites
   of the shipped recipe ``deit_base_hetdpt_paper`` removed and its linear MLPs
   merged (random weights: speed does not depend on them), timed interleaved
   in ONNX Runtime (``hetprune.measure.bench.measure(backend="onnxruntime")``: every
   model exported with ``hetprune.measure.export`` and verified against PyTorch first),
   and, beside it, with the torch backend. Also the wall time of exporting and
   verifying pruned DeiT-B (``hetprune export`` does the same work).
2. The models of the default ``hetprune compare`` (``--compare-dir``, default
   ``runs/compare``; the compare is run first when that folder holds no
   results), timed with their dense base in ONNX Runtime at the compare's
   batch sizes.

Writes ``benchmarks/results/speed-onnxruntime-<device>.md`` and ``.json``.
Targets (CPU): DeiT-B measured speedup >= 95% of its MAC ratio at batch >= 32;
export + verify of DeiT-B under 60 s.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
from studylib.tables import table

from hetprune.measure.bench import environment_line, format_table, measure
from hetprune.core.io import read_json, write_json_atomic, write_text_atomic
from hetprune.model.spec import ModelSpec, build
from hetprune.model.recipe import Recipe, apply_recipe, arch_of, load, load_recipe, resolve_recipe

PAPER_RECIPE = "deit_base_hetdpt_paper"
CONFIGS = {
    "deit_b": ModelSpec("deit_base_patch16_224"),
    "deit_s": ModelSpec("deit_small_patch16_224"),
    # 12 blocks (the paper's sites need them), tiny otherwise: for checking this script, not for results
    # (its random activations decay into denormal floats, which slow torch's CPU path ~50x and not ORT's)
    "tiny": ModelSpec("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 12,
                                               "num_heads": 2, "num_classes": 10}),
}
EFFICIENCY_TARGET = 0.95
EXPORT_TARGET_S = 60.0
OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: ONNX Runtime's CUDA provider")
    p.add_argument("--configs", default="deit_b,deit_s", help="comma list of " + ", ".join(CONFIGS))
    p.add_argument("--batch-size", type=int, default=32, help="batch for the paper configurations (default 32)")
    p.add_argument("--backends", default="onnxruntime,torch",
                   help="backends for the paper configurations (default onnxruntime,torch)")
    p.add_argument("--compare-dir", default="runs/compare",
                   help="a `hetprune compare` output folder ('none' to skip; run when it holds no results.json)")
    p.add_argument("--compare-batch-sizes", default="1,256")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=str(OUT), help="results folder")
    return p.parse_args(argv)


def paper_pair(spec: ModelSpec):
    """Dense and pruned (the paper's DeiT-B sites on ``spec``'s architecture), same random weights."""
    torch.manual_seed(0)
    dense = build(spec)
    d = resolve_recipe(PAPER_RECIPE).to_dict()
    d.update(base=spec.to_dict(), arch=arch_of(dense))
    recipe = Recipe.from_dict(d, where=f"{PAPER_RECIPE} on {spec.name}")
    torch.manual_seed(0)
    pruned = apply_recipe(build(spec), recipe, compute_merge=True).eval()
    return dense, pruned


def export_seconds(model, base) -> dict:
    """Wall time of a verified ONNX export (what `hetprune export --format onnx` does, census against the base)."""
    from hetprune.measure.export import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        check = export_onnx(model, Path(tmp) / "model.onnx", dynamic_batch=True, base=base)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "max_abs_error": check["max_abs_error"], "relative_error": check["relative_error"]}


def compare_models(folder: Path, log) -> tuple[dict, dict]:
    """The dense base and every saved model of a compare folder, running the compare first if needed."""
    if not (folder / "results.json").is_file():
        from hetprune.cli import main as cli

        log(f"no {folder}/results.json: running `hetprune compare --out {folder}` first (resumable) ...")
        argv = ["compare", "--out", str(folder)] + (["--resume"] if (folder / "rows.jsonl").exists() else [])
        if cli(argv):
            raise SystemExit("hetprune compare failed")
    data = read_json(folder / "results.json", "compare results")
    models, first = {}, None
    for row in data["rows"]:
        path = folder / row["model_dir"]
        label = f"{row['strategy']} b{'/'.join(str(v) for v in row['budget'].values())} s{row['seed']}"
        models[label] = load(path)
        first = first or path
    dense = build(load_recipe(first).base)
    return {"dense": dense, **models}, data.get("meta", {})


def main(argv=None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "benchmarks/speed_onnxruntime.py", *(sys.argv[1:] if argv is None else argv)])
    torch.set_num_threads(args.threads)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    started = time.time()
    settings = dict(device=args.device, repeats=args.repeats, warmup=args.warmup, min_time_s=0.0,
                    threads=args.threads, log=log)
    payload = {"command": command, "paper": {}, "compare": None}
    for key in [c.strip() for c in args.configs.split(",") if c.strip()]:
        spec = CONFIGS[key]
        log(f"{key}: {spec.name} dense and pruned ({PAPER_RECIPE} sites, merged) ...")
        dense, pruned = paper_pair(spec)
        shape = tuple(dense.patch_embed.proj.weight.shape[1:2]) + tuple(dense.patch_embed.img_size)
        entry = {"model": spec.name, "export": export_seconds(pruned, dense), "runs": {}}
        log(f"  export + verify of the pruned model: {entry['export']['seconds']:.1f} s")
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            result = measure({"dense": dense, "hetdpt-paper": pruned}, shape, [args.batch_size], reference="dense",
                             backend=backend, **settings)
            log(format_table(result))
            entry["runs"][backend] = result
        payload["paper"][key] = entry
    if args.compare_dir != "none":
        models, meta = compare_models(Path(args.compare_dir), log)
        sizes = [int(b) for b in args.compare_batch_sizes.split(",")]
        shape = tuple(models["dense"].patch_embed.proj.weight.shape[1:2]) + tuple(models["dense"].patch_embed.img_size)
        result = measure(models, shape, sizes, reference="dense", backend="onnxruntime", **settings)
        log(format_table(result))
        payload["compare"] = {"folder": args.compare_dir, "meta": meta, "result": result}
    payload["minutes"] = round((time.time() - started) / 60, 2)
    stem = Path(args.out) / f"speed-onnxruntime-{args.device}"
    write_json_atomic(stem.with_suffix(".json"), payload)
    write_text_atomic(stem.with_suffix(".md"), render(payload))
    log(f"wrote {stem}.md and .json in {payload['minutes']:.1f} min")
    return 0


def _row(result: dict, model: str) -> dict:
    return next(r for r in result["results"] if r["model"] == model)


def render(payload: dict) -> str:
    """The Markdown report, from the JSON alone."""
    doc = ["# Deployment speed in ONNX Runtime", "", "Produced by:", "", "```", payload["command"], "```", "",
           f"Whole run: {payload['minutes']:.1f} min. Every model is exported with `hetprune.measure.export` (torch's dynamo "
           "exporter, opset 18, dynamic batch), verified against PyTorch, and timed in an ONNX Runtime session "
           "interleaved with the others (`hetprune.measure.bench.measure(backend=\"onnxruntime\")`); the session gets the "
           "same thread count as torch. Speedup = ratio of median latencies; per-round = the ratio within each "
           "interleaved round. Load average is [1, 5, 15]-minute.", ""]
    if payload["paper"]:
        doc += ["## The paper's configurations", "",
                f"Dense timm model vs the same model with the sites of `{PAPER_RECIPE}` removed and its linear MLPs "
                "merged (random weights).", ""]
        rows = []
        for key, entry in payload["paper"].items():
            for backend, result in entry["runs"].items():
                d, p = _row(result, "dense"), _row(result, "hetdpt-paper")
                met = p["speedup_over_mac_ratio"] >= EFFICIENCY_TARGET
                target = ("met" if met else "MISSED") if key == "deit_b" and backend == "onnxruntime" else "-"
                export = entry["export"]["seconds"]
                export_cell = (f"{export:.1f} ({'met' if export <= EXPORT_TARGET_S else 'MISSED'}: < 60)"
                               if key == "deit_b" else f"{export:.1f}")
                rows.append([entry["model"], backend, p["batch_size"], f"{d['latency_s']['median'] * 1e3:.0f}",
                             f"{p['latency_s']['median'] * 1e3:.0f}", f"{p['speedup']:.2f}x", f"{p['mac_ratio']:.2f}x",
                             f"{p['speedup_over_mac_ratio']:.0%}", target, export_cell])
        doc += table(["model", "backend", "batch", "dense ms", "pruned ms", "measured speedup", "MAC ratio",
                      "speedup / MAC ratio", "target (>= 95 %)", "export + verify s"], rows)
        doc.append("")
        for key, entry in payload["paper"].items():
            for backend, result in entry["runs"].items():
                doc += [f"### {entry['model']}, {backend}", "", format_table(result, markdown=True), ""]
    if payload.get("compare"):
        c = payload["compare"]
        doc += ["## The default compare's models", "",
                f"Every model saved by `hetprune compare` in `{c['folder']}` (the embedded digits ViT), with the dense "
                "base, timed together in ONNX Runtime.", "", format_table(c["result"], markdown=True), ""]
    first = next((r for e in payload["paper"].values() for r in e["runs"].values()), None) or \
        (payload.get("compare") or {}).get("result")
    if first:
        doc += [f"Machine: {environment_line(first)}.", ""]
    return "\n".join(doc)


if __name__ == "__main__":
    sys.exit(main())
