"""Hub folders: a saved model folder (recipe + weights, so [`hetprune.load`][hetprune.model.recipe.load] reads it) plus what a
model hub expects, shaped for the model's library (a timm ``config.json``; a transformers model's own
config and image-processor file) and a model card that quotes the commands that made it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from ...core.errors import HetpruneError, option
from ...core.io import ResultFolder
from ...model.recipe import RECIPE_FILE, WEIGHTS_FILE
from ...pruning.report import legacy_metric
from .common import verify_input

CONFIG_FILE, CARD_FILE, REPORT_FILE = "config.json", "README.md", "report.json"
INT8_FILE = "model.int8.onnx"   # the checked INT8 ONNX file a hub folder may carry (export --quantize)
PREPROCESSOR_FILE = "preprocessor_config.json"  # transformers' image processor (a transformers model's folder)
# what hetprune writes in a hub folder (--overwrite replaces these and never anything else)
HUB_FOLDER = ResultFolder("hub folder", frozenset({CONFIG_FILE, CARD_FILE, REPORT_FILE, PREPROCESSOR_FILE,
                                                   RECIPE_FILE, WEIGHTS_FILE, INT8_FILE}))


def pretrained_cfg(model: nn.Module, recipe) -> dict:
    """Input size, mean/std and the rest of timm's data config, for what the model was trained on."""
    from timm.data import resolve_data_config

    from ...training.embedded_data import EMBEDDED
    from ...model.spec import input_shape_of

    cfg = resolve_data_config({}, model=model)
    cfg["input_size"] = list(input_shape_of(model))
    data = (recipe.provenance.get("data") or {}) if recipe is not None else {}
    channels = cfg["input_size"][0]
    if data.get("name") in EMBEDDED:  # the embedded data sets are normalised as (x - 0.5) / 0.5
        cfg["mean"], cfg["std"] = [0.5] * channels, [0.5] * channels
    for key in ("mean", "std"):  # a model built with another in_chans: one value per channel, averaged
        if len(cfg[key]) != channels:
            cfg[key] = [round(sum(cfg[key]) / len(cfg[key]), 6)] * channels
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


def _hetprune_section(recipe) -> dict:
    import hetprune

    return {"version": hetprune.__version__, "recipe": recipe.to_dict(),
            "load": "hetprune.load(folder) rebuilds the pruned architecture from recipe.json"}


def hub_config(model: nn.Module, recipe, label: str) -> dict:
    """timm-style ``config.json``: architecture, num_classes, model_args, pretrained_cfg, and the recipe."""
    return {
        "architecture": recipe.base.name,
        "num_classes": int(getattr(model, "num_classes", 0)),
        "num_features": int(getattr(model, "num_features", 0)),
        "global_pool": getattr(model, "global_pool", None),
        "model_args": dict(recipe.base.kwargs),
        "pretrained_cfg": {**pretrained_cfg(model, recipe), "source": label},
        "hetprune": _hetprune_section(recipe),
    }


def transformers_model(model: nn.Module) -> nn.Module | None:
    """The Hugging Face transformers model in ``model`` (hetprune_hf wraps one so that it returns logits), or
    None: its hub folder is shaped for transformers, not timm."""
    for m in (model, getattr(model, "model", None)):
        config = getattr(m, "config", None)
        if isinstance(m, nn.Module) and type(config).__module__.startswith("transformers.") \
                and hasattr(config, "to_json_string"):
            return m
    return None


def _image_processor(config):
    """An instance of the image processor transformers pairs with ``config``'s model type (its defaults)."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING

    try:
        found = IMAGE_PROCESSOR_MAPPING[type(config)]
    except KeyError:
        raise HetpruneError(f"transformers knows no image processor for model type {config.model_type!r}; "
                            "a hub folder needs its preprocessing") from None
    # transformers 5 maps a config to {backend: class}, 4.x to (slow, fast) or one class
    choices = found.values() if isinstance(found, dict) else found if isinstance(found, tuple) else [found]
    cls = next((c for c in choices if c is not None), None)
    if cls is None:
        raise HetpruneError(f"no image processor class is installed for model type {config.model_type!r}")
    return cls()


def hf_preprocessor_config(model: nn.Module, inner: nn.Module, recipe) -> dict:
    """``preprocessor_config.json``: the model type's own image processor at this model's input size, with the
    mean/std the model was run with (a wrapper's ``pretrained_cfg``, e.g. ``hetprune_hf.wrap(model, image_mean,
    image_std)``; else the processor's own, not timm's); hetprune's embedded data sets are normalised as
    (x - 0.5) / 0.5."""
    from ...training.embedded_data import EMBEDDED
    from ...model.spec import input_shape_of

    channels, height, width = input_shape_of(model)
    processor = _image_processor(inner.config)
    cfg = json.loads(processor.to_json_string())
    data = (recipe.provenance.get("data") or {}) if recipe is not None else {}
    mean, std = list(processor.image_mean), list(processor.image_std)
    own = getattr(model, "pretrained_cfg", None) or {}
    if own.get("mean") is not None and own.get("std") is not None:   # what the wrapped model was trained with
        mean, std = list(own["mean"]), list(own["std"])
    if data.get("name") in EMBEDDED:
        mean, std = [0.5] * channels, [0.5] * channels
    if len(mean) != channels:  # a model built with another number of channels: one value each, averaged
        mean, std = ([round(sum(v) / len(v), 6)] * channels for v in (mean, std))
    cfg.update(image_mean=mean, image_std=std)
    if isinstance(cfg.get("size"), dict) and {"height", "width"} <= set(cfg["size"]):
        cfg["size"] = {"height": height, "width": width}
    return cfg


def hf_hub_config(inner: nn.Module, recipe) -> dict:
    """transformers-style ``config.json``: the model's own config, its class under ``architectures``, and the
    recipe (the pruned architecture is rebuilt by [`hetprune.load`][hetprune.model.recipe.load], not by transformers)."""
    config = json.loads(inner.config.to_json_string(use_diff=False))
    return {**config, "architectures": [type(inner).__name__], "hetprune": _hetprune_section(recipe)}


def hub_files(model: nn.Module, recipe, label: str) -> dict[str, dict]:
    """The JSON files of a hub folder, shaped for the library the model comes from."""
    inner = transformers_model(model)
    if inner is None:
        return {CONFIG_FILE: hub_config(model, recipe, label)}
    return {CONFIG_FILE: hf_hub_config(inner, recipe),
            PREPROCESSOR_FILE: hf_preprocessor_config(model, inner, recipe)}


def _fmt_top1(value) -> str:
    return f"{value:.2f} %" if isinstance(value, (int, float)) else "not measured"


def _fmt_metric(value) -> str:
    return f"{value:.5g}" if isinstance(value, (int, float)) else "not measured"


def int8_section(result: dict) -> list[str]:
    """The model card's INT8 section: the scheme, how it was calibrated, and its metric against fp32."""
    from .quantize import describe_int8

    s, m, chk, cal = result["settings"], result["metric"], result["check"], result["calibration"]
    how = "static QDQ" if s["scheme"] == "int8" else "dynamic (activation ranges measured at run time)"
    lines = ["## INT8 (ONNX Runtime)", "",
             f"`{INT8_FILE}`: {how}, {'per-channel' if s['per_channel'] else 'per-tensor'} int8 weights"
             + (" in 7 bits (`reduce_range`, which ONNX Runtime needs on x86 CPUs without VNNI)"
                if s.get("reduce_range") else "") + ", made with "
             "ONNX Runtime's quantization tools and checked before it was written.", "",
             "| | fp32 (PyTorch) | INT8 (ONNX Runtime) | drop |", "|---|---|---|---|",
             f"| {m['name']} (validation data) | {m['fp32']:.2f} | {m['int8']:.2f} | {m['drop']:.2f} |", ""]
    if cal:
        lines.append(f"Calibrated on {cal['images']} images ({cal['source']}, seed {cal['seed']}) in runs of "
                     f"{cal['batch']}, {cal['method']} ranges.")
    floated = ", ".join(p for p, n in result["float_parts"].items() if n) or "none"
    c = result["census"]
    ops = ", ".join(s["ops"]) if s["scheme"] == "int8" else "those with a constant weight"
    lines.append(f"{describe_int8(c)} ({ops}; parts kept "
                 f"in float: {floated}). On a seeded batch of {chk['images']} validation images the INT8 file agrees "
                 f"with the fp32 model on "
                 + (f"{chk['top1_agreement']:.1%} of top-1 predictions" if chk["top1_agreement"] is not None
                    else "its outputs") + f" (max abs output error {chk['max_abs_error']:.3g}).")
    if result.get("kept_over_max_drop"):
        lines.append(f"**The drop is above the allowed {result['max_drop']:g}**: the file was kept on request.")
    return [*lines, ""]


def model_card(recipe, report: dict | None, costs: dict, speed: list[dict] | None, commands: dict,
               label: str, int8: dict | None = None) -> str:
    """A README.md model card from the recipe, the pruning report and measured costs."""
    from ...model.macs import human

    report = report or {}
    name = report.get("metric_name", "top1")
    metric_label, fmt = ("top-1", _fmt_top1) if name == "top1" else (name, _fmt_metric)
    prov = recipe.provenance or {}
    strategy = report.get("strategy") or prov.get("strategy") or ("none (dense)" if not recipe.removed_sites
                                                                  else "recipe")
    attn = sorted(recipe.attn_removed)
    act = sorted(recipe.act_removed)
    front = ["---", "library_name: hetprune", "pipeline_tag: image-classification",
             "tags:", "- vision-transformer", "- pruned", "- hetprune"]
    if report.get("strategy") or prov.get("strategy"):
        front.append(f"- {strategy}")
    if not recipe.base.kwargs and recipe.base.library == "timm":  # a stock timm architecture: name its hub model
        front.append(f"base_model: timm/{recipe.base.name}")
    front.append("---")
    lines = [*front, "", f"# {label}: {recipe.base.name}, pruned with hetprune", "",
             f"A structurally pruned `{recipe.base.name}` made with [hetprune](https://pypi.org/project/hetprune/) "
             f"(strategy: **{strategy}**). The architecture is the base model with the sites below removed; "
             "`recipe.json` rebuilds it and `model.safetensors` holds the weights.", "",
             "## What was removed", "",
             f"* Base model: `{recipe.base.name}`" + (f" with `{json.dumps(recipe.base.kwargs)}`"
                                                      if recipe.base.kwargs else ""),
             f"* Attention sub-blocks removed ({len(attn)}): {', '.join(f'attn{b}' for b in attn) or 'none'}"
             f" (mode `{recipe.attn_mode}`)",
             f"* MLP activations removed ({len(act)}): {', '.join(f'act{b}' for b in act) or 'none'}",
             f"* MLPs merged into one linear layer: {', '.join(map(str, recipe.merged)) or 'none'}",
             f"* Whole blocks dropped: {', '.join(map(str, recipe.dropped)) or 'none'}",
             f"* Widths changed: {'yes (see recipe.json)' if recipe.widths else 'no'}"]
    if report.get("budget"):
        lines.append(f"* Budget: `{json.dumps(report['budget'])}`, seed {report.get('seed')}")
    lines += ["", "## Accuracy and cost", "", "| | dense base | pruned |", "|---|---|---|",
              f"| {metric_label} | {fmt(legacy_metric(report, '_dense'))} | {fmt(legacy_metric(report))} "
              f"(before fine-tune: {fmt(legacy_metric(report, '_before_finetune'))}) |",
              f"| params | {human(costs['dense_params'])} | {human(costs['params'])} |",
              f"| MACs per image | {human(costs['dense_macs'])} | {human(costs['macs'])} "
              f"({costs['dense_macs'] / costs['macs']:.2f}x fewer) |", "",
              f"MACs: {costs['macs_convention']}."]
    data = prov.get("data")
    if isinstance(data, dict) and data.get("name"):
        lines.append(f"Accuracy on `{data['name']}` (validation split, {data.get('val', '?')} images).")
    lines += ["", "## Measured speed", ""]
    if speed:
        lines += ["| backend | device | dtype | batch | speedup over dense | MAC ratio |", "|---|---|---|---|---|---|"]
        lines += [f"| {r.get('backend', 'torch')} | {r['device']} | {r['dtype']} | {r['batch_size']} | "
                  f"{r['speedup']:.2f}x | {r['mac_ratio']:.2f}x |" for r in speed]
        lines += ["", "Measured with `hetprune bench` (interleaved with the dense base model)."]
    else:
        lines.append(f"Not measured for this card; `hetprune bench {label}` measures it "
                     "(`--backend onnxruntime` for ONNX Runtime).")
    lines.append("")
    if int8:
        lines += int8_section(int8)
    lines += ["## Use it", "", "```python", "import hetprune", "", 'model = hetprune.load(".")  '
              "# this folder: rebuilds the pruned architecture and loads the weights", "```", "",
              "Export it for ONNX Runtime, TensorRT or OpenVINO:", "", "```bash",
              "hetprune export . --format onnx --out model.onnx --dynamic-batch", "```", "",
              "## How it was made", "", "```bash"]
    if commands.get("made"):
        lines.append(commands["made"])
    else:
        lines.append("hetprune apply --recipe recipe.json --out pruned/  "
                     "# rebuilds the architecture from its base model (the pruning command was not recorded)")
    lines += [commands["export"], "```", "",
              "Upload with your own tools, e.g. `huggingface-cli upload YOUR_NAME/MODEL_NAME .`", ""]
    return "\n".join(lines)


def _speed_rows(bench_json: str | Path | None) -> list[dict] | None:
    """The rows of a ``hetprune bench --json`` result for the pruned model, or None."""
    if not bench_json:
        return None
    from ...core.io import read_json

    data = read_json(bench_json, f"{option('bench-json')} file")
    try:
        env = data["environment"]
        rows = [r for r in data["results"] if r.get("speedup") is not None and r["model"] != data["reference"]]
        return [{"backend": env.get("backend", "torch"), "device": r["device"], "dtype": r["dtype"],
                 "batch_size": r["batch_size"], "speedup": r["speedup"], "mac_ratio": r["mac_ratio"]}
                for r in rows]
    except (KeyError, TypeError) as exc:
        raise HetpruneError(f"{option('bench-json', str(bench_json))} is not a `hetprune bench --json` result "
                            f"with a reference model (missing {exc})") from None


def export_hub(model: nn.Module, recipe, out: str | Path, label: str, source: Path | None = None,
               report: dict | None = None, overwrite: bool = False, bench_json: str | None = None,
               export_command: str = "", allow_kwargs=(), int8: tuple[Path, dict] | None = None) -> dict:
    """Write a hub-style folder and check that [`hetprune.load`][hetprune.model.recipe.load] reads it back bit-identically.

    The folder is shaped for the model's library: timm's ``config.json``, or for a transformers model its own
    ``config.json`` and ``preprocessor_config.json``. The recipe's base is built (for the dense costs) and
    read back, so its kwargs are checked as [`hetprune.load`][hetprune.model.recipe.load] checks them (``allow_kwargs``: the names
    the caller passes itself). ``int8``: ``(file, result)`` of [`export_int8`][hetprune.measure.export.export_int8], a
    checked INT8 file the folder carries as ``model.int8.onnx``, its metric and calibration stated in the card.
    """
    from ...model.macs import CONVENTION, count_macs, count_params
    from ...core.io import atomic_folder, save_weights, state_dict_for_saving, write_json_atomic, write_text_atomic
    from ...model.spec import build, check_kwargs
    from ...model.recipe import SCHEMA_VERSION, load

    check_kwargs(recipe.base, allow_kwargs, "recipe")
    out = Path(out)
    speed = _speed_rows(bench_json)
    model = model.eval()
    x = verify_input(model, 1)
    dense = build(recipe.base)
    costs = {"params": count_params(model), "macs": count_macs(model, x), "dense_params": count_params(dense),
             "dense_macs": count_macs(dense, x), "macs_convention": CONVENTION}
    del dense
    made = (recipe.provenance or {}).get("command")
    state = state_dict_for_saving(model)
    with atomic_folder(out, overwrite=overwrite, kind=HUB_FOLDER) as tmp:
        if source is not None and (source / WEIGHTS_FILE).is_file():
            shutil.copyfile(source / WEIGHTS_FILE, tmp / WEIGHTS_FILE)  # the very bytes that were saved
        else:
            save_weights(tmp / WEIGHTS_FILE, state, metadata={"format": "hetprune", "schema": SCHEMA_VERSION})
        recipe.write(tmp / RECIPE_FILE)
        for name, data in hub_files(model, recipe, label).items():
            write_json_atomic(tmp / name, data)
        if report:
            write_json_atomic(tmp / REPORT_FILE, report)
        if int8 is not None:
            shutil.copyfile(int8[0], tmp / INT8_FILE)
        write_text_atomic(tmp / CARD_FILE, model_card(recipe, report, costs, speed,
                                                      {"made": made, "export": export_command}, label,
                                                      int8=int8[1] if int8 is not None else None))
        back = load(tmp, allow_kwargs=allow_kwargs)
        got = back.state_dict()
        if got.keys() != state.keys() or not all(torch.equal(got[k], state[k]) for k in state):
            raise HetpruneError("the hub folder does not load back to the same weights; nothing was written")
    return {"format": "hub", "path": str(out), "files": sorted(p.name for p in out.iterdir()), **costs}
