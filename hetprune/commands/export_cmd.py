"""Export a saved pruned model (or a dense timm model) for deployment, verified.

    hetprune export runs/prune-hetdpt-sites12 --format onnx --dynamic-batch     # -> runs/prune-hetdpt-sites12.onnx
    hetprune export deitb-pruned/ --format onnx --out deitb.onnx --opset 18 --dtype fp16
    hetprune export deitb-pruned/ --format pt2                                  # torch.export program
    hetprune export deitb-pruned/ --format hub --out deitb-hub/                 # config.json, README.md, weights
    hetprune export deit_small_patch16_224 --format onnx                        # a dense timm model by name

Formats: `onnx` (torch's dynamo exporter; checked with onnx.checker, its op
census against the model's remaining sites, and a run in ONNX Runtime compared
with PyTorch), `pt2` (torch.export, read back and compared) and `hub` (a model
folder with a model card and a config.json shaped for the model's library: timm-style, or for a Hugging
Face transformers model its own config plus preprocessor_config.json; `hetprune.load` reads it).
A file that fails a check is not written. The tolerance is relative to the
largest output: 1e-4 in fp32, 1e-2 in fp16 (compared with the fp32 model).
ONNX needs the export extra: pip install 'hetprune[export]'.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import HetpruneError

HELP = "export a pruned model to ONNX (verified in ONNX Runtime), torch.export or a hub-style folder"
SUFFIX = {"onnx": ".onnx", "pt2": ".pt2", "hub": "-hub"}
DEFAULT_OPSET = 18  # the same as hetprune.export.DEFAULT_OPSET (a test checks), which --help must not import


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


def _target(args):
    """``(label, model, recipe, folder_or_None, report_or_None)``."""
    from ..io import read_json
    from ..models import ModelSpec, build_with_weights
    from ..recipe import Recipe, arch_of, default_provenance
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


def _default_out(target: str, fmt: str) -> Path:
    path = Path(target)
    stem = path.name if path.is_dir() else target.replace("/", "_").replace(":", "_")
    return (path.parent if path.is_dir() else Path(".")) / f"{stem}{SUFFIX[fmt]}"


def run(args) -> int:
    import torch

    from ..export import FORMATS, check_dtype, check_output, export_hub, export_onnx, export_pt2, quote_command
    from ..models import build

    if args.format not in FORMATS:
        raise HetpruneError(f"--format {args.format!r} is not supported; allowed: {', '.join(FORMATS)}")
    check_dtype(args.dtype)
    if args.batch < 1:
        raise HetpruneError(f"--batch must be >= 1, got {args.batch}")
    if args.threads is not None and args.threads < 1:
        raise HetpruneError(f"--threads must be >= 1, got {args.threads}")
    if args.format == "hub" and (args.dtype != "fp32" or args.dynamic_batch):
        raise HetpruneError("--dtype and --dynamic-batch are for onnx and pt2; a hub folder holds the saved weights")
    if args.format == "onnx":  # say what is missing before any work
        from ..export import need

        for module in ("onnx", "onnxscript", "onnxruntime"):
            need(module, "--format onnx")
    out = Path(args.out) if args.out else _default_out(args.target, args.format)
    check_output(out, args.overwrite, folder=args.format == "hub")
    if args.format == "hub":   # a folder: refused when it holds anything hetprune did not write, overwrite or not
        from ..export.hub import HUB_FOLDER
        from ..io import check_result_folder

        check_result_folder(out, HUB_FOLDER, overwrite=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    label, model, recipe, folder, report = _target(args)
    if args.format == "onnx":
        base = build(recipe.base) if folder is not None else None  # its graph is what the census is checked against
        result = export_onnx(model, out, opset=args.opset, dynamic_batch=args.dynamic_batch, dtype=args.dtype,
                             batch=args.batch, threads=args.threads, base=base)
    elif args.format == "pt2":
        result = export_pt2(model, out, dynamic_batch=args.dynamic_batch, dtype=args.dtype, batch=args.batch)
    else:
        argv = getattr(args, "argv", None) or ["export", args.target, "--format", "hub", "--out", str(out)]
        typed = tuple(recipe.base.kwargs) if folder is None else ()  # a model name's --model-kwargs: the user's
        result = export_hub(model, recipe, out, label, source=folder, report=report, overwrite=args.overwrite,
                            bench_json=args.bench_json, export_command=quote_command(argv), allow_kwargs=typed)
    seconds = time.perf_counter() - started
    if args.format == "hub":
        print(f"wrote {out}/ ({', '.join(result['files'])}) in {seconds:.1f}s; hetprune.load reads it back "
              "bit-identically")
        print(f"next: huggingface-cli upload YOUR_NAME/MODEL_NAME {out}")
        return 0
    what = f"opset {result['opset']}, " if args.format == "onnx" else ""
    batch = "dynamic batch" if args.dynamic_batch else f"batch {args.batch}"
    print(f"wrote {out} ({what}{args.dtype}, {batch}) in {seconds:.1f}s")
    if args.format == "onnx":
        c = result["census"]
        checked = "what the base model's graph minus the removed sites leaves" if folder is not None else \
            "a dense model: nothing removed"
        print(f"graph: {c['attention']} attention, {c['activation']} activation, {c['matmul']} matrix products "
              f"({checked})")
    runtime = "ONNX Runtime" if args.format == "onnx" else "torch.export.load"
    print(f"verified in {runtime} on a seeded batch of {result['verified_batch']}: max abs error "
          f"{result['max_abs_error']:.3g} ({result['relative_error']:.2g} of the largest output; "
          f"tolerance {result['tolerance']:g})")
    return 0
