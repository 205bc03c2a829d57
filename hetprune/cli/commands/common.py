"""Options shared by the commands that need a base model and data.

Heavy modules (torch, timm) are imported inside the functions, so that
``hetprune CMD --help`` stays fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...core.config import AUGMENT_HELP, AUGMENTATIONS, BASE_SCHEDULES
from ...core.errors import HetpruneError

BASE_MODES = tuple(BASE_SCHEDULES)   # --base scratch | finetune


def add_model_arguments(p, data: bool = True) -> None:
    g = p.add_argument_group("base model")
    g.add_argument("--model", metavar="NAME",
                   help="timm model name, or LIBRARY:NAME for an adapter's own models (e.g. "
                        "hf-vit:ViTForImageClassification); default: the embedded ViT of --data (digits, "
                        "digit-pairs or digit-grid), whose weights ship with hetprune")
    g.add_argument("--model-kwargs", metavar="JSON", default=None,
                   help='extra timm.create_model arguments as JSON, e.g. \'{"num_classes": 100}\'')
    w = g.add_mutually_exclusive_group()
    w.add_argument("--pretrained", nargs="?", const=True, default=False, metavar="FILE",
                   help="load pretrained weights as timm loads them (a new head where num_classes differs, the "
                        "first convolution adapted to in_chans, position embeddings resized): timm's hub, or a "
                        "local weights file (.safetensors, or .pth read with weights_only)")
    w.add_argument("--checkpoint", metavar="FILE", help="this very model's weights: .safetensors, or .pth "
                                                       "(weights_only); every weight must fit")
    w.add_argument("--retrain-base", action="store_true",
                   help="train the embedded base model here instead of reading the shipped weights (once; "
                        "then cached; the same thread count gives the shipped weights)")
    if data:
        g.add_argument("--base", choices=BASE_MODES, default=None,
                       help="make the dense base on --data before pruning: scratch trains --model from random "
                            "weights, finetune fine-tunes its --pretrained weights with a new head; with the run's "
                            "transforms, split and augmentation, on the base_scratch or base_finetune schedule "
                            "(base_scratch.* / base_finetune.* settings; --config small-folder sizes both); stored "
                            "in the cache under a key of its inputs and reused")
    if data:
        g.add_argument("--data", metavar="digits|digit-pairs|digit-grid|PATH", default=None,
                       help="an embedded data set: 'digits' (the default; scikit-learn's digits), "
                            "'digit-pairs' (two digits side by side, labelled by their sum) or 'digit-grid' (two "
                            "digits on a 4x4 grid of patches, labelled by their sum mod 10: 17 tokens), or an "
                            "ImageFolder root with train/ and val/")
        g.add_argument("--augment", default=None, choices=tuple(AUGMENTATIONS),
                       help="training augmentation of an ImageFolder --data (default: the settings' augment, else "
                            "light). " + AUGMENT_HELP.replace("%", "%%") + ". The embedded data sets shift by a "
                            "pixel or two, always")
        g.add_argument("--data-fingerprint", default="sizes", choices=("sizes", "content"),
                       help="what keys an ImageFolder --data's stored results (MAP points, checkpoints, compare "
                            "rows): each image's name and size (default sizes: one listing of the folder, on rank "
                            "0 alone under torchrun), or its bytes too (content: reads every image once)")
        s = g.add_mutually_exclusive_group()
        s.add_argument("--subset", type=int, metavar="N",
                       help="training images for the short fine-tunes (sets short_finetune.subset; hetdpt's MAP "
                            "points use it unless hetdpt.point_finetune picks the final schedule)")
        s.add_argument("--subset-frac", type=float, metavar="F",
                       help="the same as a fraction of the training set, e.g. 0.01")
        g.add_argument("--workers", type=int, metavar="N",
                       help="data-loading worker processes for every fine-tune, evaluation and scoring (default: "
                            "none for the embedded data sets; for an ImageFolder the CPUs each local process may "
                            "use, less one for the process itself; 0 turns them off)")


def embedded_name(args) -> str:
    """The embedded data set the command's options name: ``--data`` when it is one, else digits.

    A ``--data`` value that is neither an embedded name nor a folder is an error listing what is allowed.
    """

    from ...training.embedded_data import DIGITS, EMBEDDED

    data = getattr(args, "data", None)
    if data is None or data in EMBEDDED:
        return data or DIGITS
    if not Path(data).is_dir():
        raise HetpruneError(f"--data {data!r} is neither an embedded data set ({', '.join(EMBEDDED)}) "
                            f"nor a folder: no train/ folder at {Path(data) / 'train'}; expected an ImageFolder "
                            f"root with train/<class>/* and val/<class>/*")
    return DIGITS


def model_spec(args):
    from ...training.embedded import benchmark
    from ...model.spec import ModelSpec

    if not args.model:
        if args.model_kwargs or args.pretrained or args.checkpoint:
            raise HetpruneError("--model-kwargs, --pretrained and --checkpoint need --model NAME")
        if getattr(args, "base", None):
            raise HetpruneError(f"--base {args.base} makes the base of --model NAME on --data: the embedded data sets "
                                "ship their own base model (--retrain-base trains it here)")
        return benchmark(embedded_name(args)).spec
    if getattr(args, "retrain_base", False):
        raise HetpruneError("--retrain-base retrains the embedded base model: it cannot go with --model")
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
    from ...training.embedded import embedded_model, embedded_model_info
    from ...model.spec import build_with_weights, model_hash

    spec = model_spec(args)
    if not args.model:
        name = embedded_name(args)
        retrain = getattr(args, "retrain_base", False)
        model = embedded_model(name, log=log, progress=not os.environ.get("HETPRUNE_NO_PROGRESS"), device=device,
                               retrain=retrain)
        info = {"source": f"embedded {name} ViT"}
        if made := embedded_model_info(name, retrain=retrain):
            info["top1"] = made["val_top1"]
            info["weights"] = (f"shipped, sha256 {made['sha256'][:16]}, made by `{made['made_by']}`"
                               if made.get("shipped") else f"retrained here on {made.get('threads', '?')} threads")
    else:
        if getattr(args, "base", None):   # a base starts from the same weights (or head) whatever the run's seed
            import torch

            from ...training.base_stage import SEED

            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(SEED)
                model = build_with_weights(spec, pretrained=args.pretrained, checkpoint=args.checkpoint)
        else:
            model = build_with_weights(spec, pretrained=args.pretrained, checkpoint=args.checkpoint)
        info = {"source": weights_source(args)}
    info["hash"] = model_hash(model)
    return model, spec, info


def weights_source(args) -> str:
    """Where a --model's weights come from, in words (the report's ``source``; a base's provenance)."""
    from ...core.io import file_sha256

    if args.pretrained is True:
        return "pretrained (timm's hub)"
    if args.pretrained:
        return f"pretrained file {args.pretrained} (sha256 {file_sha256(args.pretrained)[:16]})"
    if args.checkpoint:
        return f"checkpoint {args.checkpoint}"
    return "random weights"


def data_line(args, command: str, defaulted: bool | None = None) -> str:
    """The first line a command prints: which data it runs on, and how to pick another. The embedded
    defaults differ: ``prune`` and ``ablate`` take digits, ``compare`` digit pairs (where the split between
    the kinds is a real question), so a row of the default compare is rerun with ``--data digit-pairs``."""
    from ...training.embedded_data import DIGITS, EMBEDDED

    data = args.data or DIGITS
    if data not in EMBEDDED:
        augment = getattr(args, "augment", None) or "light"
        flips = (": it flips images horizontally, wrong for digits and text (--augment crop does not)"
                 if AUGMENTATIONS[augment].hflip else "")
        return f"hetprune {command}: data {data} (ImageFolder, --augment {augment}{flips})"
    other = ", ".join(f"--data {name}" for name in EMBEDDED if name != data)
    defaulted = not args.data if defaulted is None else defaulted
    why = f", the default of hetprune {command}" if defaulted else ""
    where = "the checkpoint's" if getattr(args, "checkpoint", None) else f"embedded {data} ViT"
    return (f"hetprune {command}: data {data} (embedded{why}; base model: {where}); "
            f"{other} or --data PATH for another")


def data_for(args, model, seed: int = 0):
    from ...training.data import load_data
    from ...training.embedded_data import DIGITS, EMBEDDED

    spec = args.data or DIGITS
    embedded_name(args)  # a bad value: one error listing the allowed names
    if args.model and spec in EMBEDDED and not (args.checkpoint or getattr(args, "base", None)):
        raise HetpruneError(f"--model NAME needs --data PATH (an ImageFolder), a --checkpoint trained on {spec}, "
                            f"or --base scratch to train it on {spec} first")
    return load_data(spec, model, seed=seed, augment=getattr(args, "augment", None) or "light",
                     fingerprint_by=getattr(args, "data_fingerprint", "sizes"), selection=getattr(args, "selection", None))


def augment_from(args, start) -> None:
    """``--augment``, else the run's ``augment`` setting (a shipped config's), else light, and the ``selection``
    setting's split size: before the data is loaded and its first line printed."""
    if hasattr(args, "augment"):
        args.augment = args.augment or start.config.augment or "light"
    args.selection = start.config.selection   # the selection split's size (None: the data set's default)


def apply_data_options(args, start, data) -> None:
    """Turn --subset/--subset-frac/--workers into settings, now that the data set's size is known: the run's
    start gets the changed settings object (`Settings.replace_in`, each change checked as ``--set`` would)."""
    if getattr(args, "subset", None) is not None:
        if args.subset < 1:
            raise HetpruneError(f"--subset must be >= 1, got {args.subset}")
        start.settings = start.settings.replace_in("short_finetune", subset=args.subset)
    if getattr(args, "subset_frac", None) is not None:
        if not 0 < args.subset_frac <= 1:
            raise HetpruneError(f"--subset-frac must be within (0, 1], got {args.subset_frac}")
        subset = max(1, round(args.subset_frac * len(data.train)))
        start.settings = start.settings.replace_in("short_finetune", subset=subset)
    if getattr(args, "workers", None) is not None:
        if args.workers < 0:
            raise HetpruneError(f"--workers must be >= 0, got {args.workers}")
        for schedule in ("finetune", "short_finetune"):
            start.settings = start.settings.replace_in(schedule, workers=args.workers)
        if hasattr(data, "workers"):
            data.workers = args.workers   # --workers 0 also turns off an ImageFolder's default workers


def base_and_data(args, start, command: str, defaulted: bool | None = None) -> tuple:
    """The start-up ``prune``, ``compare`` and ``ablate`` share once their run has started: the first line, the
    base model (built from the run's seed, read, or made by hetprune with ``--base``), its data, and the data
    options. Returns ``(dense, spec, base_info, data)``."""
    import torch

    from ...core import distributed as dist
    from ...training.image_folders import channels_note, image_mode
    from ...training.embedded_data import EMBEDDED

    augment_from(args, start)
    if dist.is_main():   # the output folder was checked when the run started, before the base model is built
        print(data_line(args, command, defaulted), flush=True)
    torch.manual_seed(start.config.seed)   # a --model without weights is built from this seed
    dense, spec, info = base_model(args, device=start.config.device)
    data = data_for(args, dense, seed=0)
    if dist.is_main() and args.data not in EMBEDDED and args.data is not None:
        for note in (data.reading(), channels_note(Path(args.data), image_mode(data.in_chans))):
            if note:
                print(note, flush=True)
    apply_data_options(args, start, data)
    if getattr(args, "base", None):
        dense, info = made_base(args, start, dense, spec, info, data)
    return dense, spec, info, data


def made_base(args, start, dense, spec, info: dict, data) -> tuple:
    """``--base``: the dense base made on the run's data (or read where it was made before), before the run; under
    ``--plan`` its cost, as the plan's first row. Returns the model and its provenance."""
    import os

    from ...model.spec import model_hash
    from ...pruning.plan import BASE_STAGE, PlanStep
    from ...training.base_stage import base_info, make_base, plan_base, request_for

    schedule = start.config.schedule(BASE_SCHEDULES[args.base])
    request = request_for(args.base, spec, dense, info["source"], data, schedule)
    start.remember_base(request.key(), request.inputs())   # --resume onto results of another base: refused now
    if args.plan:
        cost = plan_base(request, data)
        what = "train from scratch" if args.base == "scratch" else "fine-tune the pretrained model"
        start.before.append(PlanStep(f"{BASE_STAGE} {what}", cost.what, 0 if cost.cached else 1, cost.train_images,
                                     cost.eval_images))
        return dense, info
    record = make_base(dense, data, request, progress=not os.environ.get("HETPRUNE_NO_PROGRESS"))
    return dense, {**base_info(record, request.folder()), "hash": model_hash(dense)}


def command_line(args) -> str | None:
    """The command as typed (``hetprune ...``), for provenance; None when not run from the CLI."""
    import shlex

    argv = getattr(args, "argv", None)
    return "hetprune " + shlex.join(argv) if argv else None


def print_plan(plan, work) -> int:
    """``--plan``'s output, on rank 0: the plan, and the file it was written to in the work folder ``work``.
    Returns the command's exit code."""
    from ...core import distributed as dist
    from ...pruning.plan import PLAN_FILE

    if dist.is_main():
        print(plan.text())
        print(f"wrote {Path(work) / PLAN_FILE}")
    return 0
