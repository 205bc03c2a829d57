"""Options shared by the commands that need a base model and data.

Heavy modules (torch, timm) are imported inside the functions, so that
``hetprune CMD --help`` stays fast.
"""

from __future__ import annotations

import json
import os

from ..errors import HetpruneError


def add_model_arguments(p, data: bool = True) -> None:
    g = p.add_argument_group("base model")
    g.add_argument("--model", metavar="NAME",
                   help="timm model name, or LIBRARY:NAME for an adapter's own models (e.g. "
                        "hf-vit:ViTForImageClassification); default: the embedded digits ViT, trained once and cached")
    g.add_argument("--model-kwargs", metavar="JSON", default=None,
                   help='extra timm.create_model arguments as JSON, e.g. \'{"num_classes": 100}\'')
    w = g.add_mutually_exclusive_group()
    w.add_argument("--pretrained", action="store_true", help="load timm's pretrained weights (needs the hub)")
    w.add_argument("--checkpoint", metavar="FILE", help="weights file: .safetensors, or .pth (weights_only)")
    if data:
        g.add_argument("--data", metavar="digits|PATH", default=None,
                       help="'digits' (embedded default) or an ImageFolder root with train/ and val/")
        s = g.add_mutually_exclusive_group()
        s.add_argument("--subset", type=int, metavar="N",
                       help="training images for the short fine-tunes of MAP points (sets short_finetune.subset)")
        s.add_argument("--subset-frac", type=float, metavar="F",
                       help="the same as a fraction of the training set, e.g. 0.01")
        g.add_argument("--workers", type=int, metavar="N",
                       help="data-loading worker processes for every fine-tune (default 0)")


def model_spec(args):
    from ..models import DIGITS_SPEC, ModelSpec

    if not args.model:
        if args.model_kwargs or args.pretrained or args.checkpoint:
            raise HetpruneError("--model-kwargs, --pretrained and --checkpoint need --model NAME")
        return DIGITS_SPEC
    kwargs = {}
    if args.model_kwargs:
        try:
            kwargs = json.loads(args.model_kwargs)
        except json.JSONDecodeError as exc:
            raise HetpruneError(f"--model-kwargs is not valid JSON: {exc}") from exc
        if not isinstance(kwargs, dict):
            raise HetpruneError("--model-kwargs must be a JSON object")
    return ModelSpec.parse(args.model, kwargs)


def base_model(args, log=print, device: str = "cpu"):
    """``(dense_model, spec, base_info)`` from the command's model options (the embedded default is trained
    on ``device`` the first time)."""
    from ..embedded import digits_model, digits_model_info
    from ..models import build_with_weights, model_hash

    spec = model_spec(args)
    if not args.model:
        model = digits_model(log=log, progress=not os.environ.get("HETPRUNE_NO_PROGRESS"), device=device)
        info = {"source": "embedded digits ViT", **({"top1": m["val_top1"]} if (m := digits_model_info()) else {})}
    else:
        model = build_with_weights(spec, pretrained=args.pretrained, checkpoint=args.checkpoint)
        source = "pretrained" if args.pretrained else (f"checkpoint {args.checkpoint}" if args.checkpoint else "random")
        info = {"source": source}
    info["hash"] = model_hash(model)
    return model, spec, info


def data_for(args, model, seed: int = 0):
    from ..data import DIGITS, load_data

    spec = args.data or DIGITS
    if args.model and spec == DIGITS and not args.checkpoint:
        raise HetpruneError("--model NAME needs --data PATH (an ImageFolder) or a --checkpoint trained on digits")
    return load_data(spec, model, seed=seed)


def apply_data_options(args, settings: dict, data) -> None:
    """Turn --subset/--subset-frac/--workers into settings, now that the data set's size is known."""
    if getattr(args, "subset", None) is not None:
        if args.subset < 1:
            raise HetpruneError(f"--subset must be >= 1, got {args.subset}")
        settings["short_finetune"]["subset"] = args.subset
    if getattr(args, "subset_frac", None) is not None:
        if not 0 < args.subset_frac <= 1:
            raise HetpruneError(f"--subset-frac must be within (0, 1], got {args.subset_frac}")
        settings["short_finetune"]["subset"] = max(1, round(args.subset_frac * len(data.train)))
    if getattr(args, "workers", None) is not None:
        if args.workers < 0:
            raise HetpruneError(f"--workers must be >= 0, got {args.workers}")
        for section in ("finetune", "short_finetune"):
            settings[section]["workers"] = args.workers


def run_device(settings: dict):
    """Resolve the run's device and mixed precision once, at the command's start.

    ``settings["device"]`` becomes the checked, rank-independent name (``auto``
    resolved) and ``settings["amp"]`` the precision that will run; under
    torchrun this process joins the process group (nccl on CUDA, gloo on CPU).
    Returns this process's ``torch.device``.
    """
    from .. import devices
    from .. import distributed as dist

    settings["device"] = devices.canonical(settings["device"])
    device = devices.resolve(settings["device"])
    settings["amp"] = devices.resolve_amp(settings["amp"], device)
    dist.init_from_env(device)
    return device


def command_line(args) -> str | None:
    """The command as typed (``hetprune ...``), for provenance; None when not run from the CLI."""
    import shlex

    argv = getattr(args, "argv", None)
    return "hetprune " + shlex.join(argv) if argv else None
