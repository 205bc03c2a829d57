"""Deploy what was pruned: ONNX and ``torch.export`` files checked in their
runtime, and hub-style model folders.

Why each choice:

* ONNX goes through torch's ``dynamo=True`` exporter (``torch.export`` +
  onnxscript), torch's supported path. The TorchScript exporter also works on
  these models but is deprecated and leaves ``Identity`` nodes in the graph;
  the dynamo exporter's graph holds only the ops that compute.
* Every file is verified before it is renamed into place: ``onnx.checker``;
  an op census against the graph of the unpruned base model (each removed site
  takes exactly one attention or activation op away, matrix products drop by
  the linear layers removed or merged and two per attention, and nothing else
  changes: a removed site leaves no trace, and ops outside the sites, such as
  CaiT's class attention, need no family knowledge); and a run in the target
  runtime on a seeded batch compared with the PyTorch model. Anything wrong
  raises :class:`HetpruneError` and leaves no file.
* The exporter silently falls back to another opset when it cannot convert;
  we check the opset it wrote and refuse instead.
* A hub folder is a saved model folder (``recipe.json`` +
  ``model.safetensors``, so :func:`hetprune.load` reads it as is) plus what a
  model hub expects: a ``README.md`` card and a ``config.json`` shaped for the
  model's library: timm-style for a timm model; for a Hugging Face transformers
  model its own config (``architectures``, ``model_type``) and a
  ``preprocessor_config.json`` with its image processor's mean/std.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from .errors import HetpruneError

FORMATS = ("onnx", "pt2", "hub")
DTYPES = ("fp32", "fp16")
DEFAULT_OPSET = 18
# relative tolerance: max |runtime - torch| <= TOLERANCE * max |torch output| (torch output in fp32)
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}
INPUT_NAME, OUTPUT_NAME = "pixel_values", "logits"
VERIFY_SEED = 0
# ONNX ops that stand for one piece of a ViT (the exporter spells GELU as Erf before opset 20, and
# attention as MatMul/Softmax/MatMul before opset 23, as one fused Attention op from 23 on)
ATTENTION_OPS = ("Softmax", "Attention")
# GELU is Erf (Gelu from opset 20), tanh-GELU Tanh, SiLU / SwiGLU's gate and QuickGELU Sigmoid: one op each
ACTIVATION_OPS = ("Erf", "Gelu", "Tanh", "Sigmoid", "Relu")
MATMUL_OPS = ("MatMul", "Gemm")


def need(module: str, what: str):
    """Import an optional dependency, or say which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HetpruneError(f"{what} needs the Python package {module!r}, which is not installed; "
                            "install the export extra: pip install 'hetprune[export]'") from None


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise HetpruneError(f"--dtype {dtype!r} is not supported for export; allowed: {', '.join(DTYPES)}")


def verify_input(model: nn.Module, batch: int) -> torch.Tensor:
    """The seeded batch every export is checked on."""
    from .models import input_shape_of

    gen = torch.Generator().manual_seed(VERIFY_SEED)
    return torch.randn(batch, *input_shape_of(model), generator=gen)


def compare_outputs(got, reference: torch.Tensor, dtype: str, where: str) -> dict:
    """Max abs error of ``got`` against the fp32 torch ``reference``; raise above the tolerance."""
    got = torch.as_tensor(got).float()
    if tuple(got.shape) != tuple(reference.shape):
        raise HetpruneError(f"{where} gives output shape {tuple(got.shape)}, torch gives {tuple(reference.shape)}")
    err = (got - reference).abs().max().item()
    scale = max(reference.abs().max().item(), 1e-12)
    result = {"max_abs_error": err, "relative_error": err / scale, "tolerance": TOLERANCE[dtype], "dtype": dtype}
    if not result["relative_error"] <= TOLERANCE[dtype]:  # also catches NaN
        raise HetpruneError(f"{where} does not match the PyTorch model: max abs error {err:.3g} is "
                            f"{result['relative_error']:.3g} of the largest output, above the {dtype} tolerance "
                            f"{TOLERANCE[dtype]:g}; no file was written")
    return result


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter logs tracebacks and warnings for things it recovers from (or that we check ourselves)."""
    loggers = [logging.getLogger(n) for n in ("onnxscript", "torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _prepared(model: nn.Module, dtype: str) -> nn.Module:
    """An eval-mode CPU copy of ``model`` in the export dtype (the caller's model is left alone)."""
    m = copy.deepcopy(model).eval().cpu()
    return m.half() if dtype == "fp16" else m.float()


def _dynamic_shapes(dynamic_batch: bool):
    return ({0: torch.export.Dim("batch", min=1, max=4096)},) if dynamic_batch else None


def _example(model: nn.Module, batch: int, dtype: str, dynamic_batch: bool) -> torch.Tensor:
    """The tracing input; a dynamic batch is traced at 2 or more (torch.export specialises a batch of 1)."""
    x = verify_input(model, max(batch, 2) if dynamic_batch else batch)
    return x.half() if dtype == "fp16" else x


def _verify_batch(batch: int, dynamic_batch: bool) -> int:
    """A dynamic batch is checked at a batch size other than the one traced."""
    return max(batch, 2) + 1 if dynamic_batch else batch


def _publish(tmp: Path, out: Path) -> None:
    """Give the temporary file ordinary permissions (mkstemp makes it private) and rename it into place."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, out)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _temp_path(out: Path) -> Path:
    """A temporary file beside ``out`` (same file system, so the final rename is atomic)."""
    blocker = next((p for p in out.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise HetpruneError(f"cannot write {out}: {blocker} is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.partial-", suffix=out.suffix, dir=out.parent)
    except OSError as exc:
        raise HetpruneError(f"cannot write {out}: {exc.strerror or exc}") from None
    os.close(fd)
    return Path(tmp)


def check_output(out: Path, overwrite: bool, folder: bool = False) -> None:
    """Refuse an output that exists (without overwrite) or cannot be written, before any work."""
    if out.exists():
        if folder != out.is_dir():
            raise HetpruneError(f"output {out} exists and is {'not ' if folder else ''}a folder")
        if not overwrite and (not folder or any(out.iterdir())):
            raise HetpruneError(f"output {out} already exists; pass --overwrite to replace it")
    tmp = _temp_path(out)  # proves the folder is writable
    tmp.unlink()


# -- ONNX -------------------------------------------------------------------------------
def op_census(onnx_model) -> dict[str, int]:
    """How many attention, activation and matrix-product computations an ONNX graph holds."""
    ops = Counter(node.op_type for node in onnx_model.graph.node)
    return {
        "attention": sum(ops[o] for o in ATTENTION_OPS),
        "activation": sum(ops[o] for o in ACTIVATION_OPS),
        # a fused Attention op holds the two attention products q·kᵀ and attn·v
        "matmul": sum(ops[o] for o in MATMUL_OPS) + 2 * ops["Attention"],
    }


@torch.no_grad()
def _linears(model: nn.Module) -> int:
    """Linear layers that become a matrix product in the graph: every one, less those fed only constants.

    A Linear fed only constants (relpos attention's bias MLP over fixed token
    offsets) is folded away by the exporter: it is found by running two
    different inputs and seeing which outputs do not change. (A layer applied
    with ``F.linear`` instead of being called, like BEiT's qkv, still counts.)
    """
    calls: list[list[torch.Tensor]] = [[], []]
    run = [0]
    handles = [m.register_forward_hook(lambda mod, i, o: calls[run[0]].append(o.detach().clone()))
               for m in model.modules() if isinstance(m, nn.Linear)]
    param = next(model.parameters())
    gen = torch.Generator().manual_seed(0)
    shape = _example(model, 2, "fp32", False).shape
    was_training = model.training
    model.eval()
    try:
        for r in range(2):
            run[0] = r
            model(torch.randn(shape, generator=gen).to(param.device, param.dtype))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    constant = sum(1 for a, b in zip(*calls) if torch.equal(a, b))
    return sum(isinstance(m, nn.Linear) for m in model.modules()) - constant


def expected_census(model: nn.Module, base: nn.Module, base_census: dict[str, int]) -> dict[str, int]:
    """What the pruned graph must hold, given the unpruned ``base`` model and its graph's census.

    Every removed site takes exactly one attention (or activation) op out of
    the base graph, and nothing else changes: matrix products change by the
    linear layers removed or merged plus two per attention removed. Ops outside
    the sites (CaiT's class attention, a family's extra heads) stay as they are.
    """
    from .sites import sites

    removed = {kind: len(sites(base, kind)) - len(sites(model, kind)) for kind in ("attn", "act")}
    attention = base_census["attention"] - removed["attn"]
    return {"attention": attention, "activation": base_census["activation"] - removed["act"],
            "matmul": base_census["matmul"] + _linears(model) - _linears(base) - 2 * removed["attn"]}


def _to_onnx(model: nn.Module, example: torch.Tensor, opset: int, dynamic_batch: bool):
    """torch's dynamo exporter, quietly; its failures become one clear error.

    Where it cannot decompose a fused attention kernel (timm's BEiT and relpos
    attention, torch 2.14), the export is retried with the adapter's explicit
    attention (the same function as plain matmuls and a softmax).
    """
    from .adapters import adapter_for

    def run():
        return torch.onnx.export(model, (example,), None, dynamo=True, opset_version=opset,
                                 input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                 dynamic_shapes=_dynamic_shapes(dynamic_batch), verbose=False)

    with _quiet_exporter():
        try:
            return run()
        except Exception as first:  # the exporter's own errors are many types; say which step failed
            try:
                with adapter_for(model).explicit_attention(model):
                    return run()
            except Exception:
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(first)).strip()  # it colours its messages
                raise HetpruneError(f"torch {torch.__version__}'s ONNX exporter failed at opset {opset}: "
                                    f"{text.splitlines()[0] if text else type(first).__name__}") from first


def check_census(onnx_model, model: nn.Module, base: nn.Module | None, opset: int) -> dict:
    """The graph's census, checked against the base model's graph when there is a base."""
    got = op_census(onnx_model)
    if base is None:
        return got
    base_graph = _to_onnx(_prepared(base, "fp32"), _example(base, 2, "fp32", False), opset, False)
    want = expected_census(model, base, op_census(base_graph.model_proto))
    if got != want:
        diff = ", ".join(f"{k}: graph {got[k]}, expected {want[k]}" for k in want if got[k] != want[k])
        raise HetpruneError(f"the exported graph does not hold what the removed sites leave ({diff}): "
                            "a removed site left a trace or a present one was lost; no file was written")
    return got


def onnx_session(path: str | Path, threads: int | None = None, device: str = "cpu"):
    """An ONNX Runtime session on the CPU (or CUDA) execution provider."""
    ort = need("onnxruntime", "running ONNX models")
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), opts, providers=providers)


def export_onnx(model: nn.Module, out: str | Path, opset: int = DEFAULT_OPSET, dynamic_batch: bool = False,
                dtype: str = "fp32", batch: int = 1, threads: int | None = None,
                base: nn.Module | None = None) -> dict:
    """Write ``model`` as ONNX to ``out``, verified; return what was checked.

    The file appears only once ``onnx.checker``, the op census (against the
    graph of ``base``, the unpruned model, when given) and an ONNX Runtime run
    compared with the PyTorch model have passed.
    """
    onnx = need("onnx", "--format onnx")
    need("onnxscript", "--format onnx (torch's exporter)")
    need("onnxruntime", "--format onnx (verification)")
    check_dtype(dtype)
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not 1 <= opset <= newest:
        raise HetpruneError(f"--opset {opset!r} does not exist; onnx {onnx.__version__} knows opsets 1..{newest} "
                            f"(default {DEFAULT_OPSET})")
    out = Path(out)
    m = _prepared(model, dtype)
    tmp = _temp_path(out)
    try:
        program = _to_onnx(m, _example(model, batch, dtype, dynamic_batch), opset, dynamic_batch)
        written = {imp.version for imp in program.model_proto.opset_import if imp.domain in ("", "ai.onnx")}
        if written != {opset}:
            raise HetpruneError(f"--opset {opset} is not supported by torch {torch.__version__}'s ONNX exporter "
                                f"(it wrote opset {', '.join(map(str, sorted(written)))}); "
                                f"use the default {DEFAULT_OPSET} (17 to 25 were verified with torch 2.14)")
        with _quiet_exporter():
            program.save(str(tmp))
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as exc:
            raise HetpruneError(f"the exported graph fails onnx.checker at opset {opset}: {exc}") from exc
        census = check_census(onnx.load(str(tmp), load_external_data=False), model, base, opset)
        check = verify_onnx(tmp, model, dtype, batch=_verify_batch(batch, dynamic_batch), threads=threads)
        _publish(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"format": "onnx", "path": str(out), "opset": opset, "dtype": dtype, "dynamic_batch": dynamic_batch,
            "census": census, **check}


def verify_onnx(path: str | Path, model: nn.Module, dtype: str = "fp32", batch: int = 2,
                threads: int | None = None) -> dict:
    """Run the ONNX file in ONNX Runtime on the seeded batch and compare with ``model`` in fp32."""
    try:
        session = onnx_session(path, threads=threads)
    except HetpruneError:
        raise
    except Exception as exc:
        raise HetpruneError(f"ONNX Runtime cannot load the exported graph: {str(exc).splitlines()[0]}") from exc
    x = verify_input(model, batch)
    feed = x.half().numpy() if dtype == "fp16" else x.numpy()
    got = session.run(None, {session.get_inputs()[0].name: feed})[0]
    with torch.inference_mode():
        reference = _prepared(model, "fp32")(x)
    return {"verified_batch": batch, **compare_outputs(got, reference, dtype, "ONNX Runtime's output")}


# -- torch.export (.pt2) ----------------------------------------------------------------
def export_pt2(model: nn.Module, out: str | Path, dynamic_batch: bool = False, dtype: str = "fp32",
               batch: int = 1) -> dict:
    """Write ``model`` as a ``torch.export`` program (``.pt2``), read back and compared before the rename."""
    check_dtype(dtype)
    out = Path(out)
    m = _prepared(model, dtype)
    tmp = _temp_path(out)
    try:
        with _quiet_exporter():
            try:
                program = torch.export.export(m, (_example(model, batch, dtype, dynamic_batch),),
                                              dynamic_shapes=_dynamic_shapes(dynamic_batch))
            except Exception as exc:
                raise HetpruneError(f"torch.export failed on this model: {str(exc).strip().splitlines()[0]}") from exc
            torch.export.save(program, str(tmp))
            loaded = torch.export.load(str(tmp)).module()
        vbatch = _verify_batch(batch, dynamic_batch)
        x = verify_input(model, vbatch)
        with torch.inference_mode():
            got = loaded(x.half() if dtype == "fp16" else x)
            reference = _prepared(model, "fp32")(x)
        check = compare_outputs(got, reference, dtype, "the reloaded .pt2 program's output")
        _publish(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"format": "pt2", "path": str(out), "dtype": dtype, "dynamic_batch": dynamic_batch,
            "verified_batch": vbatch, **check}


# -- hub folder ---------------------------------------------------------------------------
CONFIG_FILE, CARD_FILE, REPORT_FILE = "config.json", "README.md", "report.json"
PREPROCESSOR_FILE = "preprocessor_config.json"  # transformers' image processor (a transformers model's folder)


def pretrained_cfg(model: nn.Module, recipe) -> dict:
    """Input size, mean/std and the rest of timm's data config, for what the model was trained on."""
    from timm.data import resolve_data_config

    from .data import EMBEDDED
    from .models import input_shape_of

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
    """``preprocessor_config.json``: the model type's own image processor and its mean/std (not timm's), at
    this model's input size; hetprune's embedded data sets are normalised as (x - 0.5) / 0.5."""
    from .data import EMBEDDED
    from .models import input_shape_of

    channels, height, width = input_shape_of(model)
    processor = _image_processor(inner.config)
    cfg = json.loads(processor.to_json_string())
    data = (recipe.provenance.get("data") or {}) if recipe is not None else {}
    mean, std = list(processor.image_mean), list(processor.image_std)
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
    recipe (the pruned architecture is rebuilt by :func:`hetprune.load`, not by transformers)."""
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


def model_card(recipe, report: dict | None, costs: dict, speed: list[dict] | None, commands: dict,
               label: str) -> str:
    """A README.md model card from the recipe, the pruning report and measured costs."""
    from .costs import human

    report = report or {}
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
              f"| top-1 | {_fmt_top1(report.get('top1_dense'))} | {_fmt_top1(report.get('top1'))} "
              f"(before fine-tune: {_fmt_top1(report.get('top1_before_finetune'))}) |",
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
    lines += ["", "## Use it", "", "```python", "import hetprune", "", 'model = hetprune.load(".")  '
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
    from .io import read_json

    data = read_json(bench_json, "--bench-json file")
    try:
        env = data["environment"]
        rows = [r for r in data["results"] if r.get("speedup") is not None and r["model"] != data["reference"]]
        return [{"backend": env.get("backend", "torch"), "device": r["device"], "dtype": r["dtype"],
                 "batch_size": r["batch_size"], "speedup": r["speedup"], "mac_ratio": r["mac_ratio"]}
                for r in rows]
    except (KeyError, TypeError) as exc:
        raise HetpruneError(f"--bench-json {bench_json} is not a `hetprune bench --json` result "
                            f"with a reference model (missing {exc})") from None


def export_hub(model: nn.Module, recipe, out: str | Path, label: str, source: Path | None = None,
               report: dict | None = None, overwrite: bool = False, bench_json: str | None = None,
               export_command: str = "", allow_kwargs=()) -> dict:
    """Write a hub-style folder and check that :func:`hetprune.load` reads it back bit-identically.

    The folder is shaped for the model's library: timm's ``config.json``, or for a transformers model its own
    ``config.json`` and ``preprocessor_config.json``. The recipe's base is built (for the dense costs) and
    read back, so its kwargs are checked as :func:`hetprune.load` checks them (``allow_kwargs``: the names
    the caller passes itself).
    """
    from .costs import CONVENTION, count_macs, count_params
    from .io import atomic_folder, save_weights, state_dict_for_saving, write_json_atomic, write_text_atomic
    from .models import build, check_kwargs
    from .recipe import RECIPE_FILE, SCHEMA_VERSION, WEIGHTS_FILE, load

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
    with atomic_folder(out, overwrite=overwrite) as tmp:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; a model folder is for sharing
        if source is not None and (source / WEIGHTS_FILE).is_file():
            shutil.copyfile(source / WEIGHTS_FILE, tmp / WEIGHTS_FILE)  # the very bytes that were saved
        else:
            save_weights(tmp / WEIGHTS_FILE, state, metadata={"format": "hetprune", "schema": SCHEMA_VERSION})
        recipe.write(tmp / RECIPE_FILE)
        for name, data in hub_files(model, recipe, label).items():
            write_json_atomic(tmp / name, data)
        if report:
            write_json_atomic(tmp / REPORT_FILE, report)
        write_text_atomic(tmp / CARD_FILE, model_card(recipe, report, costs, speed,
                                                      {"made": made, "export": export_command}, label))
        for f in tmp.iterdir():  # the JSON writers' temporary files are private too
            os.chmod(f, 0o666 & ~_umask())
        back = load(tmp, allow_kwargs=allow_kwargs)
        got = back.state_dict()
        if got.keys() != state.keys() or not all(torch.equal(got[k], state[k]) for k in state):
            raise HetpruneError("the hub folder does not load back to the same weights; nothing was written")
    return {"format": "hub", "path": str(out), "files": sorted(p.name for p in out.iterdir()), **costs}


def quote_command(argv: list[str]) -> str:
    return "hetprune " + shlex.join(argv)
