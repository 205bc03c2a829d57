"""Apply a recipe to a timm model and save the pruned model.

    hetprune apply --model deit_base_patch16_224 --recipe deit_base_hetdpt_paper --out pruned/

Without --checkpoint or --pretrained the weights are random: fine for speed
studies, useless for accuracy. Without --model the recipe's own base model is
built, and a recipe is data: base kwargs that would read a file or the network
(checkpoint_path, pretrained, a pretrained_cfg_overlay with a file or URL, ...)
are refused; give --model and --model-kwargs yourself to build otherwise.
"""

from __future__ import annotations

from .common import add_model_arguments, base_model, command_line

HELP = "apply a recipe (file or shipped name) to a model and save it"


def add_arguments(p) -> None:
    add_model_arguments(p, data=False)
    p.add_argument("--recipe", required=True, metavar="FILE|NAME", help="recipe file, or a shipped recipe name")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (recipe.json + model.safetensors)")
    p.add_argument("--overwrite", action="store_true", help="replace an output folder holding another result")


def run(args) -> int:
    import torch

    from ...model.macs import cost_summary, human
    from ...model.spec import check_kwargs, input_shape_of
    from ...model.recipe import apply_recipe, resolve_recipe, save

    from ...core.io import check_writable

    check_writable(args.out)  # before any work
    recipe = resolve_recipe(args.recipe)
    typed = bool(args.model)  # the base model as typed here; else the recipe's, which is data: checked
    if not typed:
        check_kwargs(recipe.base, (), f"--recipe {args.recipe}")
        base = recipe.base
        args.model = base.name if base.library == "timm" else f"{base.library}:{base.name}"
        if recipe.base.kwargs:
            import json
            args.model_kwargs = json.dumps(recipe.base.kwargs)
    model, spec, info = base_model(args)
    recipe.check_fits(model)
    example = torch.randn(2, *input_shape_of(model))
    dense = cost_summary(model, example)
    recipe.base = spec
    apply_recipe(model, recipe, compute_merge=True, allow_kwargs=tuple(spec.kwargs) if typed else ())
    recipe.provenance = {**recipe.provenance, "applied_to": info, "fine_tuned": False,
                         "command": command_line(args)}
    pruned = cost_summary(model, example)
    save(args.out, model, recipe, overwrite=args.overwrite)
    print(f"saved {args.out}: {recipe.n_attn} attention + {recipe.n_act} activation sites removed, "
          f"{len(recipe.merged)} MLPs merged")
    print(f"params {human(dense['params'])} -> {human(pruned['params'])}, "
          f"MACs {human(dense['macs'])} -> {human(pruned['macs'])} ({dense['macs'] / pruned['macs']:.2f}x); "
          f"{pruned['macs_convention']}")
    print("note: not fine-tuned: this is the base weights with the recipe's structure (removed sites lose "
          "accuracy until fine-tuned); use `hetprune prune` for the whole pipeline, or fine-tune it yourself")
    return 0
