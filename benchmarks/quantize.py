"""INT8 after pruning, in ONNX Runtime: speed, accuracy, and whether merging hurts quantization.

    python benchmarks/quantize.py                                  # every part (speed needs a quiet machine)
    python benchmarks/quantize.py --parts accuracy                 # rerun the accuracy part alone (one command)
    python benchmarks/quantize.py --parts speed,memory             # the speed table and calibration memory
    python benchmarks/quantize.py --parts speed --configs tiny --speed-batch-sizes 1,8 --out /tmp/q   # smoke

Writes ``benchmarks/results/quantize-cpu.md`` and ``.json`` (``--name`` for another stem); a part run alone replaces its own section and
keeps the others. Every INT8 file is made by ``hetprune.measure.export.export_int8`` (what ``hetprune export
--quantize`` runs), so each is checked (census, ONNX Runtime against PyTorch, the metric) before it is used.

1. **speed**: DeiT-S and DeiT-B with random weights, dense and with the sites of the paper's recipe
   ``deit_base_hetdpt_paper`` removed and merged (as ``benchmarks/speed_onnxruntime.py``), fp32 and INT8
   (static per-channel, static per-tensor, dynamic), and the graph options tried for the speed target, all
   timed in one interleaved ONNX Runtime session per model and batch size, against the fp32 dense model;
   plus where the INT8 pruned DeiT-B's time goes (ONNX Runtime's profiler, per op type).
2. **memory**: the peak memory of an INT8 export of DeiT-B, for several calibration batch sizes (each in a
   fresh process).
3. **accuracy**: on both embedded benchmarks, ``hetprune compare`` at its default MAC target for hetdpt and
   mix50 (seeds 0, 1, 2), run with the merger of ``benchmarks/quantize_unmerged.py`` (``linear-merge`` that
   keeps each model's unmerged twin); every pruned model merged and unmerged, and the dense base, fp32
   against INT8 (each scheme), top-1 on the validation split through ONNX Runtime; per merged layer the
   weight range and the INT8 error of the layer's output against fp32 (the layer cut out of the fp32 and
   the INT8 graphs, fed the same fp32 inputs, both run in ONNX Runtime); and the calibration count.

Resumable: the compares resume, and finished INT8 measurements are kept in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from studylib.tables import table

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
STEM = "quantize-cpu"
CACHE = "int8-v2.jsonl"     # finished accuracy measurements, by key (--work/DATA/)
PARTS = ("speed", "memory", "accuracy")
SPEED_TARGET = 3.0          # INT8 paper-recipe DeiT-B over fp32 dense, batch 32 (issue 36)
DROP_TARGET = 0.5           # top-1 points lost by INT8 pruned models on the embedded benchmarks
# (label, export_int8 keyword arguments): the schemes of the study, on every model
SCHEMES = {
    "int8 per-channel": {"scheme": "int8", "per_channel": True},
    "int8 per-tensor": {"scheme": "int8", "per_channel": False},
    "int8-dynamic": {"scheme": "int8-dynamic", "per_channel": True},
}
GRAPH = {   # the graph options tried against the default (static per-channel, products only, outputs float)
    "int8 per-channel, MatMul outputs requantized": {"quantize_outputs": True},
    "int8 per-channel, every op ORT quantizes": {"ops": ("all",)},
    "int8 per-channel, ORT transformer fusions first": {"fuse": True},
}
FIXES = {   # what might undo a loss that merging brings (merged models only)
    "int8 per-tensor, merged in float": {"scheme": "int8", "per_channel": False, "float_parts": ("merged",)},
    "int8 per-channel, merged in float": {"scheme": "int8", "per_channel": True, "float_parts": ("merged",)},
    "int8 per-channel, head in float": {"scheme": "int8", "per_channel": True, "float_parts": ("head",)},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--configs", default="deit_b,deit_s", help="speed: models (deit_b, deit_s, tiny)")
    p.add_argument("--speed-batch-sizes", default="1,32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--speed-calibration", type=int, default=16, help="speed: random calibration images")
    p.add_argument("--memory-batches", default="4,8,16", help="memory: calibration batch sizes to measure")
    p.add_argument("--data", default="digits,digit-pairs", help="accuracy: embedded benchmarks")
    p.add_argument("--strategies", default="hetdpt,mix50")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--calibration-sizes", default="64,256,1024", help="accuracy: calibration counts compared")
    p.add_argument("--jobs", default="2", help="accuracy: compare rows in parallel processes")
    p.add_argument("--workers", type=int, default=2, help="accuracy: INT8 measurements in parallel processes")
    p.add_argument("--work", default="runs/quantize-study", help="compare folders, unmerged twins, kept results")
    p.add_argument("--out", default=str(OUT), help="results folder")
    p.add_argument("--name", default=STEM, help=f"results file stem (default {STEM}: OUT/{STEM}.md and .json)")
    p.add_argument("--memory-probe", type=int, help=argparse.SUPPRESS)   # internal: one export, print its memory
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(msg, flush=True)


def machine() -> dict:
    from hetprune.measure.bench.environment import cpu_flags, cpu_name, load_average

    flags = cpu_flags() or set()
    import onnxruntime

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "isa": sorted(f for f in flags if f.startswith(("avx2", "avx512", "avx_vnni", "amx")) or f == "fma"),
            "vnni": bool(flags & {"avx512_vnni", "avx_vnni"}),   # the kernels' flags (quantize.VNNI_FLAGS adds AMX)
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "platform": platform.platform(), "load": load_average()}


def cpu_seconds() -> tuple[float, float] | None:
    """``(CPU seconds every process has used, CPU seconds this process and its waited-for children have used)``:
    their difference over a part is what other work took from the machine (the load average counts our own
    two threads too). None off Linux."""
    try:
        with open("/proc/stat", encoding="utf-8") as fh:
            ticks = [int(v) for v in fh.readline().split()[1:9]]
    except OSError:
        return None
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")   # all but idle and iowait
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def random_task(shape, n_train: int, n_val: int, classes: int = 1000):
    """Random images for a random-weight model: calibration input and a metric that only proves the file runs
    (speed does not depend on the values)."""
    import hetprune

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_train, *shape, generator=gen)
    v = torch.randn(n_val, *shape, generator=gen)
    y, w = torch.randint(0, classes, (n_train,), generator=gen), torch.randint(0, classes, (n_val,), generator=gen)

    def top1(model, val):
        hits = sum(int((model(a).argmax(-1) == b).sum()) for a, b in val)
        return 100.0 * hits / sum(len(b) for _, b in val)

    return hetprune.Task(train=[(x[i:i + 8], y[i:i + 8]) for i in range(0, n_train, 8)], val=[(v, w)],
                         loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), metric=top1,
                         metric_name="top1 (random labels)", name="random images")


# -- 1. speed ------------------------------------------------------------------------------------
def speed_part(args) -> dict:
    from hetprune.measure.bench import format_table, measure
    from hetprune.measure.export import export_int8
    from speed_onnxruntime import CONFIGS, paper_pair

    sizes = [int(b) for b in args.speed_batch_sizes.split(",")]
    result = {"configs": {}, "batch_sizes": sizes}
    work = Path(tempfile.mkdtemp(prefix="hetprune-quantize-speed-"))
    try:
        for key in [c.strip() for c in args.configs.split(",") if c.strip()]:
            spec = CONFIGS[key]
            log(f"{key}: {spec.name} dense and pruned ({'deit_base_hetdpt_paper'} sites, merged) ...")
            dense, pruned = paper_pair(spec)
            shape = tuple(dense.patch_embed.proj.weight.shape[1:2]) + tuple(dense.patch_embed.img_size)
            task = random_task(shape, args.speed_calibration, 8, getattr(dense, "num_classes", 1000))
            files, checks = {}, {}
            for model_name, model, base in (("dense", dense, None), ("pruned", pruned, dense)):
                for label, kwargs in {**SCHEMES, **(GRAPH if model_name == "pruned" else {})}.items():
                    name = f"{model_name}, {label}"
                    path = work / f"{key}-{model_name}-{label.replace(' ', '-')}.onnx"
                    t0 = time.perf_counter()
                    r = export_int8(model, path, task, base=base, dynamic_batch=True, keep=True,
                                    calibration=args.speed_calibration, threads=args.threads, **kwargs)
                    files[name] = str(path)
                    checks[name] = {"seconds": time.perf_counter() - t0, "census": r["census"],
                                    "reduce_range": r["reduce_range"],
                                    "check": r["check"], "size_mb": path.stat().st_size / 2**20}
                    log(f"  {name}: {r['census']['int8_products']} of {r['census']['products']} products in INT8, "
                        f"{checks[name]['seconds']:.0f} s")
            runs = {}
            for batch in sizes:
                t = measure({"dense, fp32": dense, "pruned, fp32": pruned}, shape, [batch], reference="dense, fp32",
                            backend="onnxruntime", device="cpu", repeats=args.repeats, warmup=1, min_time_s=0.0,
                            threads=args.threads, log=log, onnx_files=files)
                log(format_table(t))
                runs[str(batch)] = t
            profile = op_profile(files["pruned, int8 per-channel"], max(sizes), args.threads) if key == "deit_b" \
                else None
            result["configs"][key] = {"model": spec.name, "files": checks, "runs": runs, "profile": profile}
    finally:
        for f in work.glob("*"):
            f.unlink()
        work.rmdir()
    return result


def op_profile(path: str, batch: int, threads: int, runs: int = 2) -> dict:
    """Where one run's time goes, per op type of the graph ONNX Runtime runs (after its own fusions)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.gettempdir()) / "hetprune-quantize-profile")
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch, *session.get_inputs()[0].shape[1:])).astype(np.float32)
    session.run(None, {session.get_inputs()[0].name: x})
    for _ in range(runs):
        session.run(None, {session.get_inputs()[0].name: x})
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    per_op: dict[str, float] = {}
    kernel = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    for e in kernel[len(kernel) // (runs + 1):]:   # the first run warms up
        per_op[e["args"]["op_name"]] = per_op.get(e["args"]["op_name"], 0.0) + e["dur"] / 1e3 / runs
    total = sum(per_op.values())
    return {"batch": batch, "total_ms": total,
            "ops": [{"op": k, "ms": v, "share": v / total} for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])]}


# -- 2. memory -----------------------------------------------------------------------------------
def memory_probe(batch: int) -> int:
    """One INT8 export of random-weight DeiT-B calibrated in runs of ``batch``; prints its peak memory."""
    from hetprune.measure.export import export_int8
    from speed_onnxruntime import CONFIGS, paper_pair

    torch.set_num_threads(2)
    dense, _ = paper_pair(CONFIGS["deit_b"])
    peak = {}

    def note(msg):
        if msg.startswith("calibrating"):
            peak["before_calibration"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        export_int8(dense, Path(tmp) / "m.onnx", random_task((3, 224, 224), 4 * batch, 8), dynamic_batch=True,
                    keep=True, calibration=4 * batch, calibration_batch=batch, threads=2, log=note)
        seconds = time.perf_counter() - t0
    peak["total"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"batch": batch, "images": 4 * batch, "seconds": seconds,
                      **{f"peak_{k}_gib": v / 2**20 for k, v in peak.items()}}))
    return 0


def memory_part(args) -> dict:
    rows = []
    for batch in [int(b) for b in args.memory_batches.split(",")]:
        log(f"memory: INT8 export of DeiT-B calibrated in runs of {batch} (a fresh process) ...")
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-probe", str(batch)],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"memory probe at batch {batch} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        log(f"  peak {rows[-1]['peak_total_gib']:.2f} GiB (fp32 export alone "
            f"{rows[-1]['peak_before_calibration_gib']:.2f} GiB), {rows[-1]['seconds']:.0f} s")
    return {"model": "deit_base_patch16_224 (dense, random weights)", "rows": rows}


# -- 3. accuracy ---------------------------------------------------------------------------------
def run_compare(data: str, args, folder: Path) -> dict:
    """``hetprune compare`` on ``data`` at the default target, keeping every model's unmerged twin."""
    from hetprune.cli import main as cli

    from quantize_unmerged import ENV, NAME

    twins = folder / "unmerged"
    twins.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(twins.resolve())
    argv = ["compare", "--data", data, "--strategies", args.strategies, "--seeds", args.seeds, "--jobs", args.jobs,
            "--plugin", "quantize_unmerged", "--set", f"mergers=[{NAME}]", "--out", str(folder / "compare")]
    if (folder / "compare" / "rows.jsonl").exists():
        argv.append("--resume")
    if not (folder / "compare" / "results.json").is_file() or "--resume" in argv:
        log(f"accuracy: hetprune {shlex.join(argv)}")
        if cli(argv):
            raise SystemExit(f"hetprune compare on {data} failed")
    return json.loads((folder / "compare" / "results.json").read_text())


def unmerged_twin(folder: Path, twins: Path):
    """The saved (merged) model of ``folder`` and its unmerged twin, the weights the merger was handed."""
    import hetprune
    from hetprune.core.io import load_weights
    from hetprune.model.spec import build, load_state_into, model_hash
    from hetprune.model.recipe import Recipe, apply_recipe, load_recipe

    merged = hetprune.load(folder)
    recipe = load_recipe(folder)
    if not recipe.merged:
        return merged, None
    path = twins / f"{model_hash(merged)}.safetensors"
    if not path.is_file():
        raise SystemExit(f"no unmerged twin of {folder} in {twins}: rerun its compare with this script")
    d = recipe.to_dict()
    d.update(merged=[], fold_norm=False)
    twin = apply_recipe(build(recipe.base), Recipe.from_dict(d), compute_merge=False)
    load_state_into(twin, load_weights(path), str(path))
    return merged, twin.eval()


def _cached(cache: Path) -> dict:
    done = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            row = json.loads(line)
            done[row["key"]] = row["value"]
    return done


@torch.inference_mode()
def val_agreement(model, session, task) -> dict:
    """Over the whole validation split: the share of images whose top-1 class INT8 and fp32 agree on, and the
    relative RMS error of INT8's logits (finer signals than a top-1 that moves by whole images)."""
    from hetprune.training.loaders import loader
    from hetprune.measure.export.ort_model import OnnxModule

    run = OnnxModule(session)
    model = model.eval()
    same = total = 0
    err = ref = 0.0
    for x, _ in loader(task.data.val, 256, shuffle=False):
        want, got = model(x), run(x)
        same += int((want.argmax(-1) == got.argmax(-1)).sum())
        total += len(x)
        err += float(((got - want) ** 2).sum())
        ref += float((want ** 2).sum())
    return {"val_agreement": same / total, "logit_error": math.sqrt(err / ref)}


def int8_row(model, task, kwargs: dict, threads: int) -> dict:
    from hetprune.measure.export import export_int8, onnx_session

    with tempfile.TemporaryDirectory() as tmp:
        r = export_int8(model, Path(tmp) / "m.onnx", task, dynamic_batch=True, keep=True, threads=threads,
                        max_drop=100.0, **kwargs)
        fine = val_agreement(model, onnx_session(Path(tmp) / "m.onnx", threads=threads), task)
    return {"fp32": r["metric"]["fp32"], "int8": r["metric"]["int8"], "drop": r["metric"]["drop"],
            "agreement": r["check"]["top1_agreement"], "int8_products": r["census"]["int8_products"],
            "products": r["census"]["products"], "calibration": (r["calibration"] or {}).get("images"), **fine}


def _job(payload: dict):
    """One measurement in a fresh single-threaded process: an INT8 row, or a model's per-layer errors."""
    from hetprune.training.data import load_data
    from hetprune.training.embedded import embedded_model
    from hetprune.training.task import classification

    torch.set_num_threads(1)
    task = classification(load_data(payload["data"]))
    if payload["model"] == "dense":
        return int8_row(embedded_model(payload["data"], log=lambda m: None, progress=False), task,
                        payload["kwargs"], 1)
    merged, twin = unmerged_twin(Path(payload["folder"]), Path(payload["twins"]))
    if payload["what"] == "layers":
        return layer_errors(merged, twin, task, 1)
    return int8_row(merged if payload["merged"] else twin, task, payload["kwargs"], 1)


def accuracy_part(args) -> dict:
    from concurrent.futures import ProcessPoolExecutor, as_completed
    import multiprocessing as mp

    work = Path(args.work)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = {"strategies": args.strategies.split(","), "seeds": seeds, "data": {}}
    plans = {}   # data -> [(row fields, cache key, job payload)]
    for data in [d.strip() for d in args.data.split(",") if d.strip()]:
        folder = work / data
        compare = run_compare(data, args, folder)
        twins = str(folder / "unmerged")
        plan = []
        for label, kwargs in {**SCHEMES, **GRAPH}.items():
            plan.append(({"model": "dense", "strategy": "dense", "seed": None, "merged": None, "variant": label},
                         f"dense|{label}", {"data": data, "model": "dense", "kwargs": kwargs}))
        for row in compare["rows"]:
            if "model_dir" not in row:
                continue
            ident, model_dir = row["id"], str(folder / "compare" / row["model_dir"])
            ident_key = f"{ident}@{row['key']}"   # the row's settings: a changed default makes a new model
            head = {"model": ident, "strategy": row["strategy"], "seed": row["seed"]}
            base = {"data": data, "model": ident, "folder": model_dir, "twins": twins, "what": "int8"}
            for which in ("merged", "unmerged"):
                variants = {**SCHEMES, **(GRAPH | FIXES if which == "merged" else {})}
                if row["seed"] == seeds[0] and which == "merged":
                    variants |= {f"calibration {n}": {"calibration": n}
                                 for n in (int(c) for c in args.calibration_sizes.split(","))}
                for label, kwargs in variants.items():
                    plan.append(({**head, "merged": which == "merged", "variant": label},
                                 f"{ident_key}|{which}|{label}",
                                 {**base, "merged": which == "merged", "kwargs": kwargs}))
            plan.append(({**head, "layers": True}, f"{ident_key}|layers", {**base, "what": "layers"}))
        plans[data] = (compare, plan)
    todo = [(data, key, job) for data, (_, plan) in plans.items()
            for _, key, job in plan if key not in _cached(work / data / CACHE)]
    log(f"accuracy: {len(todo)} measurements to make in {args.workers} processes ...")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_job, job): (data, key) for data, key, job in todo}
        for i, future in enumerate(as_completed(futures), 1):
            data, key = futures[future]
            value = future.result()
            with (work / data / CACHE).open("a") as fh:
                fh.write(json.dumps({"key": key, "value": value}) + "\n")
            log(f"  [{i}/{len(todo)}] {data} {key}")
    for data, (compare, plan) in plans.items():
        done = _cached(work / data / CACHE)
        rows = [{**fields, **done[key]} for fields, key, _ in plan if "layers" not in fields]
        layers = [{**{k: v for k, v in fields.items() if k != "layers"}, **r}
                  for fields, key, _ in plan if "layers" in fields for r in done[key]]
        out["data"][data] = {"compare": {"command": compare["meta"].get("command"),
                                         "rows": [{k: r.get(k) for k in ("id", "strategy", "seed", "n_attn",
                                                                         "n_act", "top1", "macs", "dense_macs")}
                                                  for r in compare["rows"]]},
                             "rows": rows, "layers": layers}
    return out


# -- per merged layer ----------------------------------------------------------------------------
def _scopes(node) -> list[str]:
    from hetprune.measure.export.quantize import _scopes as scopes

    return scopes(node)


def branch_tensors(graph, prefix: str) -> tuple[str, str]:
    """The MLP branch of the block at module path ``prefix`` in an fp32 graph: its input tensor (what its first
    product reads: norm2's output) and its output (the last tensor computed inside the MLP or LayerScale)."""
    inside = [n for n in graph.node if any(s in (f"{prefix}.mlp", f"{prefix}.ls2") for s in _scopes(n))]
    products = [n for n in inside if n.op_type in ("MatMul", "Gemm")]
    if not products:
        raise SystemExit(f"no MLP products found under {prefix} in the graph")
    return products[0].input[0], inside[-1].output[0]


def _weight_stats(w: torch.Tensor) -> dict:
    """The range of one weight: its largest magnitude (what a per-tensor scale covers), the median of its output
    channels' largest magnitudes (what per-channel scales cover), and their ratio."""
    rows = w.detach().abs().amax(dim=1).double()
    top, typical = float(rows.max()), float(rows.median())
    return {"max": top, "channel_median": typical, "ratio": top / typical if typical > 0 else math.inf}


def layer_errors(merged, twin, task, threads: int, n_images: int = 256) -> list[dict]:
    """Per merged MLP: the weight ranges (merged ``W``; unmerged ``W1``, ``W2``), and the relative RMS error of
    the MLP branch's output in INT8 against fp32, merged and unmerged, per-channel and per-tensor: the branch cut
    out of each graph (``onnx.utils.extract_model``), fed the same fp32 inputs, run in ONNX Runtime."""
    import onnx
    import onnx.utils

    from hetprune.model.adapters import adapter_for
    from hetprune.measure.export import export_int8, export_onnx, onnx_session
    from hetprune.measure.export.calibration import check_images
    from hetprune.model.spec import input_shape_of

    images = check_images(task, n_images, 1, input_shape_of(merged))[0].numpy()
    names = {id(m): n for n, m in merged.named_modules()}
    blocks = adapter_for(merged).blocks(merged)
    merged_blocks = [i for i, b in enumerate(blocks) if hasattr(b.mlp, "fc") and not hasattr(b.mlp, "fc1")]
    twin_blocks = adapter_for(twin).blocks(twin)
    out = {i: {"block": i, "weights": {"merged": _weight_stats(blocks[i].mlp.fc.weight),
                                       "fc1": _weight_stats(twin_blocks[i].mlp.fc1.weight),
                                       "fc2": _weight_stats(twin_blocks[i].mlp.fc2.weight)}, "error": {}}
           for i in merged_blocks}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for which, model in (("merged", merged), ("unmerged", twin)):
            fp32 = tmp / f"{which}-fp32.onnx"
            export_onnx(model, fp32, dynamic_batch=True, threads=threads)
            graph = onnx.load(str(fp32)).graph
            prefixes = {i: names[id(blocks[i])] for i in merged_blocks}
            tensors = {i: branch_tensors(graph, p) for i, p in prefixes.items()}
            feed = tmp / f"{which}-inputs.onnx"
            onnx.utils.extract_model(str(fp32), str(feed), [graph.input[0].name], [t[0] for t in tensors.values()])
            session = onnx_session(feed, threads=threads)
            inputs = dict(zip([t[0] for t in tensors.values()],
                              session.run(None, {session.get_inputs()[0].name: images})))
            for scheme, per_channel in (("per-channel", True), ("per-tensor", False)):
                int8 = tmp / f"{which}-{scheme}.onnx"
                export_int8(model, int8, task, dynamic_batch=True, keep=True, max_drop=100.0,
                            per_channel=per_channel, threads=threads)
                for i, (x_name, y_name) in tensors.items():
                    want, got = (_branch_output(path, x_name, y_name, inputs[x_name], tmp, threads)
                                 for path in (fp32, int8))
                    rel = float(np.sqrt(np.mean((got - want) ** 2)) / max(np.sqrt(np.mean(want ** 2)), 1e-12))
                    out[i]["error"][f"{which} {scheme}"] = rel
    return [out[i] for i in merged_blocks]


def _branch_output(path: Path, x_name: str, y_name: str, x: np.ndarray, tmp: Path, threads: int) -> np.ndarray:
    import onnx.utils

    from hetprune.measure.export import onnx_session

    sub = tmp / f"branch-{path.stem}-{abs(hash((x_name, y_name)))}.onnx"
    onnx.utils.extract_model(str(path), str(sub), [x_name], [y_name])
    session = onnx_session(sub, threads=threads)
    return session.run(None, {x_name: x})[0].astype(np.float64)


# -- the report ----------------------------------------------------------------------------------
def _mean_std(values) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return math.nan, math.nan
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _pm(values, digits=2) -> str:
    m, s = _mean_std(values)
    return "-" if math.isnan(m) else f"{m + 0.0:.{digits}f} ± {s:.{digits}f}".replace("-0.00 ", "0.00 ")


def render(payload: dict) -> str:
    doc = ["# INT8 after pruning, in ONNX Runtime (CPU)", "",
           "Produced by `benchmarks/quantize.py`; each part records the command, machine and load it ran with. "
           "Every INT8 file was made by `hetprune.measure.export.export_int8` (what `hetprune export --quantize` runs) and "
           "passed its checks first (onnx.checker, the op census, ONNX Runtime against PyTorch, the metric).", ""]
    for part in PARTS:
        if part in payload:
            doc += RENDER[part](payload[part])
    return "\n".join(doc)


def _header(section: dict) -> list[str]:
    m = section["machine"]
    return [f"Command: `{section['command']}`", "",
            f"Machine: {m['cpu']}, {m['cores']} cores, {section.get('threads', m['threads'])} threads; ISA "
            f"{', '.join(m['isa'])} (VNNI: {'yes' if m['vnni'] else 'no'}); torch {m['torch']}, onnxruntime "
            f"{m['onnxruntime']}; load average {m['load']} at the start, {section.get('load_end')} at the end"
            + (f"; other processes used {section['other_cpu_cores']:.2f} cores meanwhile"
               if section.get("other_cpu_cores") is not None else "") + f"; {section['minutes']:.1f} min.", ""]


def render_speed(s: dict) -> list[str]:
    from hetprune.measure.bench import format_table

    doc = ["## Speed", ""] + _header(s)
    if not _quiet(s):
        doc += [f"**Not the headline: measured on a shared 2-core machine at load {s['machine']['load']} at the start "
                f"and {s.get('load_end')} at the end (the benchmark's own two threads add about 2)"
                + (f", other processes using {s['other_cpu_cores']:.2f} cores meanwhile"
                   if s.get("other_cpu_cores") is not None else "") + "**; the headline needs a quiet one (load < "
                f"{QUIET_LOAD} at the start, other processes under {QUIET_OTHER_CORES} cores): rerun "
                "`python benchmarks/quantize.py --parts speed` then.", ""]
    columns = [(key, batch) for key, c in s["configs"].items() for batch in c["runs"]]
    doc += ["Random weights (speed does not depend on them), random calibration images; in each column every "
            "model is timed in one interleaved ONNX Runtime session (`hetprune.measure.bench.measure`); speedup over the "
            "fp32 dense model ± its spread (half the interquartile range of the per-round ratios, relative).", ""]
    rows = []
    for name in _speed_columns(s):
        cells = [name]
        for key, batch in columns:
            r = next((r for r in s["configs"][key]["runs"][batch]["results"] if r["model"] == name), None)
            cells.append(f"{r['speedup']:.2f}x ±{r['speedup_spread']:.0%}" if r else "-")
        rows.append(cells)
    doc += table(["model", *(f"{s['configs'][k]['model']} b{b}" for k, b in columns)], rows)
    doc.append("")
    b = s["configs"].get("deit_b")
    if b and "32" in b["runs"]:
        by = {r["model"]: r for r in b["runs"]["32"]["results"]}
        best = max((r for n, r in by.items() if n.startswith("pruned, int8")),
                   key=lambda r: r["speedup"])
        doc += [f"Speed target (INT8 paper-recipe DeiT-B, batch 32, >= {SPEED_TARGET:.1f}x over fp32 dense): "
                f"**{by['pruned, int8 per-channel']['speedup']:.2f}x** with the default (static per-channel); best "
                f"{best['model']} {best['speedup']:.2f}x: "
                f"{'met' if by['pruned, int8 per-channel']['speedup'] >= SPEED_TARGET else 'MISSED'}"
                + ("" if _quiet(s) else " (at this load: not the headline)") + ".", ""]
    if b and b.get("profile"):
        p = b["profile"]
        doc += [f"Where the INT8 pruned DeiT-B's time goes (static per-channel, batch {p['batch']}, ONNX Runtime's "
                f"profiler, ops as ONNX Runtime runs them after its own fusions; {p['total_ms']:.0f} ms of kernel "
                "time per run):", "",
                *table(["op", "ms", "share"], [[o["op"], f"{o['ms']:.1f}", f"{o['share']:.1%}"] for o in p["ops"][:12]])]
        doc.append("")
    doc += ["Files (the checks each passed; weights in 7 bits where ONNX Runtime's kernels need them, on x86 "
            "without VNNI: `reduce_range`, by default when the exporting CPU lacks VNNI):", ""]
    files = []
    for key, c in s["configs"].items():
        for name, f in c["files"].items():
            bits = {True: "7-bit", False: "8-bit"}.get(f.get("reduce_range"), "8-bit (not recorded then)")
            files.append([f"{c['model']}: {name}", f"{f['census']['int8_products']} of {f['census']['products']}",
                          bits, f"{f['seconds']:.0f}", f"{f['size_mb']:.0f}"])
    doc += table(["model", "INT8 products", "weights", "seconds to export", "size MB"], files)
    doc.append("")
    for key, c in s["configs"].items():
        for batch, run in c["runs"].items():
            doc += [f"### {c['model']}, batch {batch}", "", format_table(run, markdown=True), ""]
    return doc


QUIET_LOAD, QUIET_OTHER_CORES = 1.5, 0.3


def _quiet(s: dict) -> bool:
    """Whether a speed section ran on a quiet machine: the 1-minute load below 1.5 when it started (while it runs
    its own two threads add about 2), and, where measured, other processes using under 0.3 cores meanwhile."""
    start, end = (s["machine"].get("load") or [None])[0], (s.get("load_end") or [None])[0]
    other = s.get("other_cpu_cores")
    if other is None:   # not measured: the load at the end must be low too
        return start is not None and end is not None and max(start, end) < QUIET_LOAD
    return start is not None and start < QUIET_LOAD and other < QUIET_OTHER_CORES


def _speed_columns(s: dict) -> list[str]:
    names = []
    for c in s["configs"].values():
        for run in c["runs"].values():
            names += [r["model"] for r in run["results"] if r["model"] not in names]
    return names


def render_memory(m: dict) -> list[str]:
    doc = ["## Calibration memory", ""] + _header(m)
    doc += [f"Peak resident memory of one INT8 export of {m['model']} (`export_int8`, static per-channel), each "
            "in a fresh process: the fp32 export first, then the calibration in runs of the given batch.", "",
            *table(["calibration batch", "images", "peak after the fp32 export GiB", "peak of the whole export GiB", "s"],
                   [[r["batch"], r["images"], f"{r['peak_before_calibration_gib']:.2f}", f"{r['peak_total_gib']:.2f}",
                     f"{r['seconds']:.0f}"] for r in m["rows"]])]
    rows = m["rows"]
    if len(rows) > 1:
        xs, ys = [r["batch"] for r in rows], [r["peak_total_gib"] for r in rows]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        doc += ["", f"Calibration adds about {slope:.2f} GiB per image of a run (least squares over the rows): the "
                "memory follows the calibration batch, not the number of images. The seconds include the fp32 "
                "export and depend on the load."]
    return [*doc, ""]


def render_accuracy(a: dict) -> list[str]:
    doc = ["## Accuracy on the embedded benchmarks", ""] + _header(a)
    doc += [f"Top-1 % on each validation split, fp32 (PyTorch) against INT8 (ONNX Runtime), mean ± std over seeds "
            f"{a['seeds']}; drop = fp32 - INT8 per model, then averaged (one validation image is 0.22 points on "
            "digits, 0.1 on digit pairs). Finer than top-1, over the whole validation split: the share of images "
            "whose top-1 class INT8 and fp32 agree on, and the relative RMS error of INT8's logits. The pruned "
            "models are those of `hetprune compare` at its default target, merged (as saved) and their unmerged "
            "twins (the same weights before the merge).", ""]
    doc += accuracy_answers(a)
    for data, d in a["data"].items():
        groups: dict = {}
        for r in d["rows"]:
            groups.setdefault((r["strategy"], r["merged"], r["variant"]), []).append(r)
        rows = [[strategy, "-" if merged is None else ("merged" if merged else "unmerged"), variant,
                 _pm([r["fp32"] for r in rs]), _pm([r["int8"] for r in rs]), _pm([r["drop"] for r in rs]),
                 f"{max(r['drop'] for r in rs):.2f}", _pm([100 * r["val_agreement"] for r in rs]),
                 _pm([100 * r["logit_error"] for r in rs])] for (strategy, merged, variant), rs in groups.items()]
        doc += [f"### {data}", "", f"Compare: `{d['compare']['command']}`", "",
                *table(["model", "merged", "variant", "fp32 top-1", "INT8 top-1", "drop (mean ± std)", "worst drop",
                        "same top-1 as fp32 %", "logit error %"], rows), ""]
        if d["layers"]:
            doc += ["Per merged layer (every model and seed): the weight's range (largest magnitude over the median "
                    "of its output channels' largest magnitudes: how much of the INT8 range a per-tensor scale "
                    "leaves a typical channel), and the relative RMS error of the MLP branch's output in INT8 "
                    "against fp32 (the branch alone, fed the same fp32 inputs).", ""]
            layers = []
            for r in d["layers"]:
                w, e = r["weights"], r["error"]
                layers.append([r["model"], r["block"], f"{w['merged']['ratio']:.1f}", f"{w['fc1']['ratio']:.1f}",
                               f"{w['fc2']['ratio']:.1f}",
                               f"{w['merged']['max']:.2f} / {w['fc1']['max']:.2f} / {w['fc2']['max']:.2f}",
                               *(f"{e[k]:.4f}" for k in ("merged per-channel", "unmerged per-channel",
                                                        "merged per-tensor", "unmerged per-tensor"))])
            doc += table(["model", "block", "range merged W", "range W1", "range W2", "max abs merged / W1 / W2",
                          "error merged per-channel", "unmerged per-channel", "merged per-tensor",
                          "unmerged per-tensor"], layers)
            doc.append("")
    return doc


def _rows(d: dict, strategy: str, merged, variant: str) -> list[dict]:
    return [r for r in d["rows"] if r["strategy"] == strategy and r["merged"] == merged and r["variant"] == variant]


def accuracy_answers(a: dict) -> list[str]:
    """The questions of the study, answered from the rows: the drop of the default INT8, and merged against
    unmerged at the model and at the layer level."""
    default = "int8 per-channel"
    doc = ["### The answers", "",
           f"**INT8 pruned models against their fp32 versions** (the default: static QDQ, per-channel; target: at "
           f"most {DROP_TARGET} points of top-1 lost, every model):", ""]
    drops = []
    for data, d in a["data"].items():
        for strategy in ["dense", *a["strategies"]]:
            rs = _rows(d, strategy, None if strategy == "dense" else True, default)
            if not rs:
                continue
            worst = max(r["drop"] for r in rs)
            target = "-" if strategy == "dense" else ("met" if worst <= DROP_TARGET else "MISSED")
            drops.append([data, f"{strategy}{'' if strategy == 'dense' else ' (merged)'}",
                          _pm([r["fp32"] for r in rs]), _pm([r["int8"] for r in rs]), _pm([r["drop"] for r in rs]),
                          f"{worst:.2f}", target])
    doc += table(["data", "model", "fp32 top-1", "INT8 top-1", "drop (mean ± std)", "worst drop", "target"], drops)
    doc += ["", "**Merged against unmerged** (the same pruned models, quantized alike): per merged MLP, the INT8 "
            "error of the MLP branch's output, merged over unmerged (mean over every merged layer of every model "
            "and seed; above 1: merging makes INT8 worse), and the model's logit error (mean over models).", ""]
    versus = []
    for data, d in a["data"].items():
        layers = d["layers"]
        if not layers:
            continue
        for scheme in ("per-channel", "per-tensor"):
            ratios = [r["error"][f"merged {scheme}"] / r["error"][f"unmerged {scheme}"] for r in layers]
            worse = sum(x > 1 for x in ratios)
            ranges = " / ".join(f"{statistics.mean(r['weights'][w]['ratio'] for r in layers):.1f}"
                                for w in ("merged", "fc1", "fc2"))
            label = f"int8 {scheme}"
            merged = [r["logit_error"] for st in a["strategies"] for r in _rows(d, st, True, label)]
            unmerged = [r["logit_error"] for st in a["strategies"] for r in _rows(d, st, False, label)]
            versus.append([data, scheme, f"{statistics.mean(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})",
                           f"{worse} of {len(ratios)}", ranges, f"{100 * statistics.mean(merged):.2f}",
                           f"{100 * statistics.mean(unmerged):.2f}"])
    doc += table(["data", "weights", "branch error, merged / unmerged", "layers where merged is worse",
                  "weight range merged W / W1 / W2", "logit error merged %", "logit error unmerged %"], versus)
    return [*doc, ""]


RENDER = {"speed": render_speed, "memory": render_memory, "accuracy": render_accuracy}
MAKE = {"speed": speed_part, "memory": memory_part, "accuracy": accuracy_part}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_probe:
        return memory_probe(args.memory_probe)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: unknown {', '.join(unknown)}; allowed: {', '.join(PARTS)}")
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "benchmarks/quantize.py", *(sys.argv[1:] if argv is None else argv)])
    stem = Path(args.out) / args.name
    from hetprune.measure.bench import load_average
    from hetprune.core.io import write_json_atomic, write_text_atomic

    for part in parts:
        started = time.time()
        info = {"command": command, "machine": machine(), "threads": args.threads}
        before = cpu_seconds()
        section = MAKE[part](args)
        after = cpu_seconds()
        if before and after:   # cores' worth of CPU that other processes used while this part ran
            info["other_cpu_cores"] = round(((after[0] - before[0]) - (after[1] - before[1]))
                                            / max(time.time() - started, 1e-9), 2)
        # read just before writing: another part may have been written meanwhile (parts run alone)
        payload = json.loads(stem.with_suffix(".json").read_text()) if stem.with_suffix(".json").is_file() else {}
        payload[part] = {**info, **section, "load_end": load_average(),
                         "minutes": round((time.time() - started) / 60, 2)}
        write_json_atomic(stem.with_suffix(".json"), payload)
        write_text_atomic(stem.with_suffix(".md"), render(payload))
        log(f"wrote {stem}.md and .json ({part})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
