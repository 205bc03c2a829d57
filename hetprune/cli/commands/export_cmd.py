"""Export a saved pruned model (or a dense timm model) for deployment, verified.

    hetprune export runs/prune-hetdpt-sites12 --format onnx --dynamic-batch     # -> runs/prune-hetdpt-sites12.onnx
    hetprune export deitb-pruned/ --format onnx --out deitb.onnx --opset 18 --dtype fp16
    hetprune export deitb-pruned/ --format pt2                                  # torch.export program
    hetprune export deitb-pruned/ --format hub --out deitb-hub/                 # config.json, README.md, weights
    hetprune export deit_small_patch16_224 --format onnx                        # a dense timm model by name
    hetprune export runs/prune-hetdpt-sites12 --quantize int8 --dynamic-batch    # -> ...sites12.int8.onnx

Formats: `onnx` (torch's dynamo exporter; checked with onnx.checker, its op
census against the model's remaining sites, and a run in ONNX Runtime compared
with PyTorch), `pt2` (torch.export, read back and compared) and `hub` (a model
folder with a model card and a config.json shaped for the model's library: timm-style, or for a Hugging
Face transformers model its own config plus preprocessor_config.json; `hetprune.load` reads it).
A file that fails a check is not written. The tolerance is relative to the
largest output: 1e-4 in fp32, 1e-2 in fp16 (compared with the fp32 model).
`--quantize int8` (static QDQ, calibrated on the training images of the model's
data) or `int8-dynamic` writes an INT8 file through ONNX Runtime's quantization
tools, checked the same way plus the task's metric measured through ONNX Runtime:
a drop beyond --max-drop leaves no file (unless --keep). With --format hub the
folder carries the INT8 file too.
ONNX needs the export extra: pip install 'hetprune[export]'.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...core.errors import HetpruneError

HELP = "export a pruned model to ONNX (verified in ONNX Runtime), torch.export or a hub-style folder"
SUFFIX = {"onnx": ".onnx", "pt2": ".pt2", "hub": "-hub"}
DEFAULT_OPSET = 18  # the same as hetprune.measure.export.DEFAULT_OPSET (a test checks), which --help must not import
# the same as hetprune.measure.export.quantize's defaults (a test checks)
SCHEMES = ("int8", "int8-dynamic")
DEFAULT_CALIBRATION, CALIBRATION_BATCH, DEFAULT_MAX_DROP = 256, 8, 1.0
DEFAULT_OPS, DEFAULT_FLOAT = "MatMul,Gemm,Conv", ""
INT8_OPTIONS = ("per_tensor", "calibration", "calibration_batch", "seed", "data", "int8_ops", "float_parts",
                "max_drop", "keep", "reduce_range")
REDUCE_RANGE = {"auto": None, "on": True, "off": False}   # --reduce-range: 7-bit weights (None: when this CPU lacks VNNI)


def add_arguments(p) -> None:
    p.add_argument("target", metavar="DIR_OR_MODEL", help="a saved pruned model folder, or a timm model name "
                                                           "(LIBRARY:NAME for an adapter's, e.g. hf-vit:...)")
    p.add_argument("--format", default="onnx", metavar="onnx|pt2|hub", help="what to write (default onnx)")
    p.add_argument("--out", metavar="PATH", help="output file (onnx, pt2) or folder (hub); "
                                                 "default: the target's name with .onnx, .pt2 or -hub")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, metavar="N",
                   help=f"ONNX opset (default {DEFAULT_OPSET}; 17 and up; from 23 attention is one fused op)")
    p.add_argument("--dynamic-batch", action="store_true", help="leave the batch dimension free (onnx, pt2)")
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="batch size of the export (fixed unless --dynamic-batch; default 1)")
    p.add_argument("--dtype", default="fp32", metavar="fp32|fp16", help="weights and input dtype (default fp32)")
    p.add_argument("--model-kwargs", metavar="JSON",
                   help="timm.create_model arguments for a model name, e.g. '{\"num_classes\": 100}'")
    p.add_argument("--checkpoint", metavar="FILE", help="weights for a model name (.safetensors or .pth)")
    p.add_argument("--bench-json", metavar="FILE",
                   help="hub: a `hetprune bench --json` result to quote as the measured speedup in the card")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for the verification run")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    q = p.add_argument_group("INT8 (with --format onnx or hub; see docs/guides/deploy.md)")
    q.add_argument("--quantize", metavar="|".join(SCHEMES),
                   help="write INT8 through ONNX Runtime's quantization tools: int8 (static QDQ, calibrated on "
                        "training images) or int8-dynamic (activation ranges at run time)")
    q.add_argument("--per-tensor", action="store_true",
                   help="one INT8 scale per weight tensor (default: one per output channel)")
    q.add_argument("--calibration", type=int, metavar="N",
                   help=f"int8: training images to calibrate on (default {DEFAULT_CALIBRATION}, a seeded subset)")
    q.add_argument("--calibration-batch", type=int, metavar="N",
                   help=f"int8: images per calibration run (default {CALIBRATION_BATCH}); the memory calibration "
                        "needs grows with it")
    q.add_argument("--seed", type=int, metavar="N", help="seed of the calibration subset and check batch (default 0)")
    q.add_argument("--data", metavar="digits|digit-pairs|digit-grid|PATH",
                   help="the data set to calibrate on and measure the metric on (default: the one the model was "
                        "pruned on, from its recipe; needed for a model name)")
    q.add_argument("--int8-ops", metavar="OPS",
                   help=f"product ops put in INT8, a comma list of MatMul, Gemm, Conv, or all (every op ONNX "
                        f"Runtime quantizes: also Add, Mul, Softmax, norms; default {DEFAULT_OPS})")
    q.add_argument("--float", dest="float_parts", metavar="PARTS",
                   help="parts of the model kept in float, a comma list of head, patch, merged (default: "
                        f"{DEFAULT_FLOAT or 'none'})")
    q.add_argument("--max-drop", type=float, metavar="X",
                   help=f"largest metric drop against the fp32 model allowed (default {DEFAULT_MAX_DROP:g}, in the "
                        "metric's units: top-1 points)")
    q.add_argument("--keep", action="store_true", help="write the INT8 file even when it drops more than --max-drop")
    q.add_argument("--reduce-range", metavar="|".join(REDUCE_RANGE),
                   help="7-bit int8 weights, which ONNX Runtime needs on an x86 CPU without VNNI (its kernels "
                        "saturate full-range weights there): auto (default) turns it on when the exporting CPU "
                        "lacks VNNI; on for a file meant for such a CPU; off for full-range weights")


def _target(args):
    """``(label, model, recipe, folder_or_None, report_or_None)``."""
    from ...core.io import read_json
    from ...model.spec import ModelSpec, build_with_weights
    from ...model.recipe import Recipe, arch_of, default_provenance
    from .bench_cmd import load_model, parse_model_kwargs

    path = Path(args.target)
    if path.is_dir():
        if args.model_kwargs or args.checkpoint:
            raise HetpruneError("--model-kwargs and --checkpoint are for a model name; a saved folder has its own")
        label, model, recipe = load_model(args.target, {})
        report = path / "report.json"
        return label, model, recipe, path, read_json(report, "report") if report.is_file() else None
    if path.exists():
        raise HetpruneError(f"{args.target} is a file; give a saved pruned model folder or a timm model name")
    spec = ModelSpec.parse(args.target, parse_model_kwargs(args.model_kwargs))  # timm, or LIBRARY:NAME
    model = build_with_weights(spec, checkpoint=args.checkpoint)
    source = f"checkpoint {args.checkpoint}" if args.checkpoint else "random weights"
    recipe = Recipe(base=spec, arch=arch_of(model),
                    provenance={**default_provenance(), "applied_to": {"source": source}})
    return args.target, model.eval(), recipe, None, None


def _default_out(target: str, fmt: str, quantize: str | None = None) -> Path:
    path = Path(target)
    stem = path.name if path.is_dir() else target.replace("/", "_").replace(":", "_")
    scheme = f".{quantize}" if quantize and fmt == "onnx" else ""
    return (path.parent if path.is_dir() else Path(".")) / f"{stem}{scheme}{SUFFIX[fmt]}"


def _check_int8_options(args) -> None:
    """One error for an INT8 option that cannot go with the rest of the command."""
    given = [o for o in INT8_OPTIONS if getattr(args, o, None) not in (None, False)]
    flag = lambda o: "--" + {"float_parts": "float"}.get(o, o).replace("_", "-")  # noqa: E731
    if not args.quantize:
        if given:
            raise HetpruneError(f"{flag(given[0])} is an INT8 option: use it with --quantize int8 (or int8-dynamic)")
        return
    if args.quantize not in SCHEMES:
        raise HetpruneError(f"--quantize {args.quantize!r} is not a quantization scheme; allowed: {', '.join(SCHEMES)}")
    if args.format not in ("onnx", "hub"):
        raise HetpruneError(f"--quantize writes ONNX: use it with --format onnx or hub, not {args.format}")
    if args.dtype != "fp32":
        raise HetpruneError(f"--dtype {args.dtype} and --quantize cannot go together: INT8 is quantized from the fp32 "
                            "graph; drop --dtype")
    if args.quantize == "int8-dynamic":
        static = [o for o in ("calibration", "calibration_batch") if getattr(args, o) is not None]
        if static:
            raise HetpruneError(f"{flag(static[0])} is for --quantize int8: int8-dynamic measures activation ranges "
                                "at run time and needs no calibration")
    if args.reduce_range is not None and args.reduce_range not in REDUCE_RANGE:
        raise HetpruneError(f"--reduce-range {args.reduce_range!r} is not a choice; allowed: {', '.join(REDUCE_RANGE)}")
    for name in ("calibration", "calibration_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise HetpruneError(f"{flag(name)} must be >= 1, got {value}")


def _comma_list(text: str | None, default: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in (default if text is None else text).split(",") if t.strip())


def _int8_task(args, recipe, model):
    """The classification task INT8 calibrates on and checks against: --data, else the recipe's data set."""
    from ...training.data import load_data
    from ...training.embedded_data import EMBEDDED
    from ...training.task import classification

    recorded = ((recipe.provenance or {}).get("data") or {}).get("name") if recipe is not None else None
    name = args.data or recorded
    if not name:
        raise HetpruneError("--quantize needs the data to calibrate on and to measure the metric on: pass --data "
                            "digits, digit-pairs, digit-grid or PATH (an ImageFolder root with train/ and val/)")
    if name not in EMBEDDED and not Path(name).is_dir():
        where = "--data" if args.data else "the model's recipe (the data it was pruned on)"
        raise HetpruneError(f"{where} names {name!r}, which is neither an embedded data set ({', '.join(EMBEDDED)}) "
                            "nor a folder here; pass --data PATH (an ImageFolder root with train/ and val/)")
    return classification(load_data(name, model, selection=0))   # nothing is chosen: calibrate on all of train


def _int8_kwargs(args) -> dict:
    return {"scheme": args.quantize, "per_channel": not args.per_tensor,
            "calibration": args.calibration if args.calibration is not None else DEFAULT_CALIBRATION,
            "calibration_batch": args.calibration_batch if args.calibration_batch is not None else CALIBRATION_BATCH,
            "seed": args.seed or 0, "ops": _comma_list(args.int8_ops, DEFAULT_OPS),
            "float_parts": _comma_list(args.float_parts, DEFAULT_FLOAT),
            "max_drop": args.max_drop if args.max_drop is not None else DEFAULT_MAX_DROP, "keep": args.keep,
            "reduce_range": REDUCE_RANGE[args.reduce_range or "auto"]}


def run(args) -> int:
    import torch

    from ...measure.export import (FORMATS, check_dtype, check_output, export_hub, export_onnx, export_pt2,
                                   quote_command)
    from ...model.spec import build

    if args.format not in FORMATS:
        raise HetpruneError(f"--format {args.format!r} is not supported; allowed: {', '.join(FORMATS)}")
    check_dtype(args.dtype)
    _check_int8_options(args)
    if args.batch < 1:
        raise HetpruneError(f"--batch must be >= 1, got {args.batch}")
    if args.threads is not None and args.threads < 1:
        raise HetpruneError(f"--threads must be >= 1, got {args.threads}")
    if args.format == "hub" and (args.dtype != "fp32" or args.dynamic_batch):
        raise HetpruneError("--dtype and --dynamic-batch are for onnx and pt2; a hub folder holds the saved weights")
    if args.format == "onnx" or args.quantize:  # say what is missing before any work
        from ...measure.export import need

        for module in ("onnx", "onnxscript", "onnxruntime") + (("onnxruntime.quantization",) if args.quantize else ()):
            need(module, "--quantize" if args.quantize else "--format onnx")
    out = Path(args.out) if args.out else _default_out(args.target, args.format, args.quantize)
    check_output(out, args.overwrite, folder=args.format == "hub")
    if args.format == "hub":   # a folder: refused when it holds anything hetprune did not write, overwrite or not
        from ...measure.export.hub import HUB_FOLDER
        from ...core.io import check_result_folder

        check_result_folder(out, HUB_FOLDER, overwrite=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    label, model, recipe, folder, report = _target(args)
    base = build(recipe.base) if folder is not None else None  # its graph is what the census is checked against
    argv = getattr(args, "argv", None) or ["export", args.target, "--format", args.format, "--out", str(out)]
    if args.quantize:
        return _run_int8(args, out, label, model, recipe, folder, report, base, quote_command(argv), started)
    if args.format == "onnx":
        result = export_onnx(model, out, opset=args.opset, dynamic_batch=args.dynamic_batch, dtype=args.dtype,
                             batch=args.batch, threads=args.threads, base=base, overwrite=args.overwrite)
    elif args.format == "pt2":
        result = export_pt2(model, out, dynamic_batch=args.dynamic_batch, dtype=args.dtype, batch=args.batch,
                            overwrite=args.overwrite)
    else:
        typed = tuple(recipe.base.kwargs) if folder is None else ()  # a model name's --model-kwargs: the user's
        result = export_hub(model, recipe, out, label, source=folder, report=report, overwrite=args.overwrite,
                            bench_json=args.bench_json, export_command=quote_command(argv), allow_kwargs=typed)
    seconds = time.perf_counter() - started
    if args.format == "hub":
        _print_hub(out, result, seconds)
        return 0
    what = f"opset {result['opset']}, " if args.format == "onnx" else ""
    batch = "dynamic batch" if args.dynamic_batch else f"batch {args.batch}"
    print(f"wrote {out} ({what}{args.dtype}, {batch}) in {seconds:.1f}s")
    if args.format == "onnx":
        _print_census(result["census"], folder)
    runtime = "ONNX Runtime" if args.format == "onnx" else "torch.export.load"
    print(f"verified in {runtime} on a seeded batch of {result['verified_batch']}: max abs error "
          f"{result['max_abs_error']:.3g} ({result['relative_error']:.2g} of the largest output; "
          f"tolerance {result['tolerance']:g})")
    return 0


def _print_hub(out: Path, result: dict, seconds: float) -> None:
    print(f"wrote {out}/ ({', '.join(result['files'])}) in {seconds:.1f}s; hetprune.load reads it back "
          "bit-identically")
    print(f"next: huggingface-cli upload YOUR_NAME/MODEL_NAME {out}")


def _print_census(c: dict, folder, int8: str = "") -> None:
    checked = "what the base model's graph minus the removed sites leaves" if folder is not None else \
        "a dense model: nothing removed"
    print(f"graph: {c['attention']} attention, {c['activation']} activation, {c['matmul']} matrix products "
          f"({checked}){int8}")


def _run_int8(args, out: Path, label, model, recipe, folder, report, base, command: str, started: float) -> int:
    """``--quantize``: the INT8 file (or a hub folder that carries it), checked, and what was checked."""
    import tempfile

    from ...measure.export import INT8_FILE, export_hub, export_int8
    from ...measure.export.quantize import describe_int8

    task = _int8_task(args, recipe, model)
    kwargs = _int8_kwargs(args)
    meta = {"model": label, "recipe": recipe.to_dict() if recipe is not None else None, "command": command}
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if args.format == "onnx":
        result = export_int8(model, out, task, base=base, opset=args.opset, dynamic_batch=args.dynamic_batch,
                             batch=args.batch, threads=args.threads, metadata=meta, log=log,
                             overwrite=args.overwrite, **kwargs)
    else:
        with tempfile.TemporaryDirectory(prefix="hetprune-hub-int8-") as work:
            result = export_int8(model, Path(work) / INT8_FILE, task, base=base, opset=args.opset,
                                 dynamic_batch=True, threads=args.threads, metadata=meta, log=log, **kwargs)
            typed = tuple(recipe.base.kwargs) if folder is None else ()
            hub = export_hub(model, recipe, out, label, source=folder, report=report, overwrite=args.overwrite,
                             bench_json=args.bench_json, export_command=command, allow_kwargs=typed,
                             int8=(Path(work) / INT8_FILE, result))
    seconds = time.perf_counter() - started
    settings = result["settings"]
    batch = "dynamic batch" if result["dynamic_batch"] else f"batch {result['batch']}"
    file = out if args.format == "onnx" else out / INT8_FILE
    how = "static QDQ" if settings["scheme"] == "int8" else "dynamic"
    weights = ("per-channel" if settings["per_channel"] else "per-tensor") + (
        " 7-bit" if settings["reduce_range"] else "")
    print(f"wrote {file} ({settings['scheme']}: {how}, {weights} int8 weights; opset {result['opset']}, {batch}) "
          f"in {seconds:.1f}s")
    c = result["census"]
    floated = ", ".join(f"{p} ({n})" for p, n in result["float_parts"].items())
    _print_census(c, folder, f"; {describe_int8(c)}" + (f", kept in float: {floated}" if floated else ""))
    cal = result["calibration"]
    if cal:
        print(f"calibrated on {cal['images']} images ({cal['source']}; seed {cal['seed']}, runs of {cal['batch']}, "
              f"{cal['method']} ranges)")
    chk = result["check"]
    agree = f"top-1 agreement {chk['top1_agreement']:.1%} with the fp32 PyTorch model, " \
        if chk["top1_agreement"] is not None else ""
    worst = f"; the worst of its {len(chk['outputs'])} outputs" if "outputs" in chk else ""
    print(f"checked in ONNX Runtime on a seeded batch of {chk['images']} validation images: {agree}max abs error "
          f"{chk['max_abs_error']:.3g} ({chk['relative_error']:.2g} of the largest output{worst})")
    m = result["metric"]
    print(f"{m['name']} on the validation data through ONNX Runtime: {m['fp32']:.2f} fp32 -> {m['int8']:.2f} INT8 "
          f"(drop {m['drop']:.2f}; --max-drop {result['max_drop']:g})")
    if result["kept_over_max_drop"]:
        print(f"warning: the drop is above --max-drop {result['max_drop']:g}; the file was kept because of --keep")
    if args.format == "hub":
        _print_hub(out, hub, seconds)
    return 0
