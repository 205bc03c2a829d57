"""Measure the speed of a pruned model (a saved folder) or a timm model.

    hetprune bench runs/prune-hetdpt-sites12                  # vs its dense base
    hetprune bench pruned/ --against deit_base_patch16_224 --device cuda --dtype bf16 --batch-sizes 1,64,256
    hetprune bench deit_small_patch16_224 --batch-sizes 1,32 --json speed.json
    hetprune bench pruned/ --backend onnxruntime --batch-sizes 1,32             # in ONNX Runtime (CPU)
    hetprune bench pruned/ --backend onnxruntime --onnx pruned.int8.onnx        # its INT8 file beside fp32

Models are timed interleaved in one process (A, B, A, B, ...) after a
warm-up; the table gives the median latency per batch, its spread (IQR),
images/s, params, MACs and, with a reference, speedup beside the MAC ratio.
A folder's reference defaults to the dense base model of its recipe, freshly
built: weights are random, which does not change speed. bf16 and fp16 run under
autocast over fp32 weights, or with `--cast weights` in that dtype's weights (bf16
on CPU is fast only on CPUs with native bf16; fp16 is for CUDA only); fp32
matmuls run in TF32 on GPUs that have it unless `--tf32 off`.
`--backend onnxruntime` exports every model to ONNX (verified against
PyTorch) and times the ONNX Runtime sessions the same way (needs the export
extra: pip install 'hetprune[export]'; CUDA needs onnxruntime-gpu); `--onnx FILE`
adds ONNX files as they are (an INT8 export) to the same interleaved session.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core.errors import HetpruneError

HELP = "measure latency, throughput and speedup (CPU or GPU), interleaved with a reference"


def add_arguments(p) -> None:
    p.add_argument("target", metavar="DIR_OR_MODEL", help="a saved pruned model folder, or a timm model name")
    p.add_argument("--against", metavar="MODEL_OR_DIR",
                   help="reference for the speedup (default for a folder: the dense base model of its recipe)")
    p.add_argument("--batch-sizes", default="1,64", metavar="B,B,...", help="batch sizes to time (default 1,64)")
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N", help="default auto: cuda if present")
    p.add_argument("--backend", default="torch", metavar="torch|onnxruntime",
                   help="what runs the models: PyTorch (default) or ONNX Runtime on the exported ONNX graphs")
    p.add_argument("--onnx", metavar="FILE,...",
                   help="also time these ONNX files as they are (e.g. `hetprune export --quantize int8`'s), in the "
                        "same interleaved session (--backend onnxruntime)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"),
                   help="fp32, or autocast to bf16 / fp16 (fp16: CUDA only)")
    p.add_argument("--cast", default="autocast", choices=("autocast", "weights"),
                   help="with --dtype bf16/fp16: autocast over fp32 weights (default; what training runs), or "
                        "weights: the models' weights cast to that dtype (what one deploys; no casts per call)")
    p.add_argument("--tf32", default="on", choices=("on", "off"),
                   help="fp32 matmuls in TF32 on GPUs that have it (default on, as timm's trainers do); the "
                        "environment line says what ran")
    p.add_argument("--compile", action="store_true", help="torch.compile every model first (warm-up absorbs it)")
    p.add_argument("--model-kwargs", metavar="JSON",
                   help="timm.create_model arguments for model names, e.g. '{\"img_size\": 384}'")
    p.add_argument("--repeats", type=int, default=7, metavar="N", help="timed repeats per model (default 7)")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed calls per model first (default 2)")
    p.add_argument("--min-time", type=float, default=0.2, metavar="S",
                   help="each repeat runs the forward enough times to last S seconds (default 0.2)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's own)")
    p.add_argument("--json", metavar="FILE", help="also write the full result as JSON")
    p.add_argument("--per-block", action="store_true",
                   help="also show where the time goes per block (attention, MLP, the rest) at the largest "
                        "batch size, for every model timed (torch backend)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise HetpruneError(f"--batch-sizes must be positive integers separated by commas (e.g. 1,64,256), "
                            f"got {text!r}")
    return sizes


def parse_model_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HetpruneError(f"--model-kwargs is not valid JSON: {exc}") from exc
    if not isinstance(kwargs, dict):
        raise HetpruneError("--model-kwargs must be a JSON object")
    return kwargs


def load_model(what: str, kwargs: dict):
    """``(label, model, recipe_or_None)`` for a saved folder or a timm name."""
    from ...model.spec import ModelSpec, build
    from ...model.recipe import RECIPE_FILE, load, load_recipe

    path = Path(what)
    if path.is_dir():
        if not (path / RECIPE_FILE).is_file():
            raise HetpruneError(f"{path} is a folder but holds no {RECIPE_FILE}: not a saved pruned model")
        return path.name or str(path), load(path), load_recipe(path)
    if path.exists():
        extra = (" (an ONNX file is timed with --onnx FILE --backend onnxruntime, beside the folder it was exported "
                 "from)") if path.suffix == ".onnx" else ""
        raise HetpruneError(f"{what} is a file; give a saved pruned model folder or a timm model name{extra}")
    return what, build(ModelSpec(what, kwargs)), None


def run(args) -> int:
    from ...measure.bench import BACKENDS, format_table, measure
    from ...measure.bench.timing import check_onnx_file
    from ...core.io import write_json_atomic
    from ...model.spec import build, input_shape_of

    if args.backend not in BACKENDS:
        raise HetpruneError(f"--backend {args.backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
    if args.per_block and args.backend != "torch":
        raise HetpruneError("--per-block times PyTorch modules: use it with --backend torch")
    if args.cast != "autocast" and args.dtype not in ("bf16", "fp16"):   # it would time fp32 weights as they are
        raise HetpruneError(f"--cast {args.cast} casts the models' weights to --dtype bf16 or fp16: give one of them "
                            f"(--dtype is {args.dtype}), or drop --cast")
    files = {f.strip(): f.strip() for f in (args.onnx or "").split(",") if f.strip()}   # named as given
    if args.onnx is not None and not files:
        raise HetpruneError("--onnx is empty: give ONNX files separated by commas")
    if files and args.backend != "onnxruntime":
        raise HetpruneError("--onnx files run in ONNX Runtime: add --backend onnxruntime")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise HetpruneError(f"--onnx {missing[0]}: no such file")
    if args.backend == "onnxruntime":  # say what is missing before building models
        from ...measure.export import need

        for module in ("onnx", "onnxscript", "onnxruntime"):
            need(module, "--backend onnxruntime")
    sizes = parse_batch_sizes(args.batch_sizes)
    kwargs = parse_model_kwargs(args.model_kwargs)
    label, model, recipe = load_model(args.target, kwargs)
    for path in files:   # before anything is built, exported or timed (exporting DeiT-B takes minutes)
        check_onnx_file(path, input_shape_of(model), sizes)
    models = {label: model}
    reference = None
    if args.against:
        ref_label, ref_model, _ = load_model(args.against, kwargs)
    elif recipe is not None:
        ref_label, ref_model = f"{recipe.base.name} (dense)", build(recipe.base)
    else:
        ref_label = ref_model = None
    if ref_model is not None:
        if ref_label == label:
            ref_label += " (reference)"
        shape, ref_shape = input_shape_of(model), input_shape_of(ref_model)
        if shape != ref_shape:
            raise HetpruneError(f"{label} takes input {shape} but {ref_label} takes {ref_shape}; "
                                "compare models of the same input size")
        models = {ref_label: ref_model, label: model}  # reference first: it is timed first in every round
        reference = ref_label
    shape = input_shape_of(model)
    print(f"timing {', '.join([*models, *files])} on input {shape}, batch sizes {sizes}, backend {args.backend} ...")
    result = measure(models, shape, sizes, device=args.device, dtype=args.dtype, compile=args.compile,
                     repeats=args.repeats, warmup=args.warmup, min_time_s=args.min_time, reference=reference,
                     threads=args.threads, log=print, backend=args.backend, onnx_files=files, cast=args.cast,
                     tf32=args.tf32 == "on")
    result["command"] = {"target": args.target, "against": args.against, "recipe": recipe.to_dict() if recipe else None}
    print(format_table(result, markdown=args.markdown))
    if args.per_block:
        from ...measure.bench import format_per_block, per_block

        result["per_block"] = {}
        for name, m in models.items():
            result["per_block"][name] = per_block(m, shape, max(sizes), device=args.device, repeats=args.repeats,
                                                  warmup=args.warmup)
            print(format_per_block(name, result["per_block"][name]))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"wrote {args.json}")
    return 0
