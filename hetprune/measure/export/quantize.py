"""INT8 ONNX through ONNX Runtime's own quantization tools, checked, or no file.

The verified fp32 export (`hetprune.measure.export.export_onnx`, census against the base model included) is
quantized, then checked as every export is:

* ``onnx.checker``; the op census equal to the fp32 graph's (the pruned structure survives), with the
  products now in INT8 counted and equal to what was asked for;
* a run in ONNX Runtime on a seeded batch of validation images against the fp32 PyTorch model: the top-1
  agreement and the output error are reported (INT8 is not exact, so they are not a pass/fail tolerance);
* the task's own metric on its validation data, measured through ONNX Runtime, against the fp32 PyTorch
  model's: a drop beyond ``max_drop`` is an error and leaves no file, unless ``keep``.

Why each choice:

* ``int8`` is static QDQ (``quantize_static``, ``QuantFormat.QDQ``): the format ONNX Runtime's CPU kernels
  are built for; activations uint8 (asymmetric), weights int8 (symmetric), per output channel by default
  (per-tensor on request), MinMax ranges. ``int8-dynamic`` is ``quantize_dynamic``: int8 weights, activation
  ranges measured at run time, so no calibration.
* Calibration reads the task's training images (`calibration`) in small batches: ONNX Runtime's
  calibration session keeps every intermediate tensor of a batch alive (about 0.3 GiB per DeiT-B image with
  every op calibrated), so the memory grows with the batch, not with the number of images.
* Which ops are quantized (``ops``: the products, or ``all`` that ONNX Runtime quantizes), whether a
  product's output is requantized to INT8 (``quantize_outputs``) and which parts of the model stay in float
  (``float_parts``: the classifier head, the patch embedding, the merged MLPs) are settings; their defaults
  come from ``benchmarks/quantize.py`` (``benchmarks/results/quantize-cpu.md``). By default a MatMul's
  output stays float: ONNX Runtime then runs it as ``MatMulIntegerToFloat`` (INT8 inputs, float output),
  which skips a requantization and a dequantization per product.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import logging
import math
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...core import tensors
from ...core.errors import HetpruneError, on_command_line, option, switch
from ..bench.environment import cpu_flags
from .calibration import calibration_images, check_count, check_images
from .common import DEFAULT_OPSET, _publish, _temp_path, check_batch, check_output, need
from .ort_model import OnnxModule, fixed_batch
from .to_onnx import export_onnx, onnx_session, op_census

SCHEMES = ("int8", "int8-dynamic")
DEFAULT_CALIBRATION = 256    # training images; 1347 in digits' training split
CALIBRATION_BATCH = 8        # images per calibration run: the memory calibration needs grows with it
DEFAULT_MAX_DROP = 1.0       # in the metric's own units (top-1 points for classification)
CHECK_IMAGES = 32            # the seeded validation batch the INT8 file is compared with the fp32 model on
PRODUCT_OPS = ("MatMul", "Gemm", "Conv")
ALL_OPS = "all"              # every op type ONNX Runtime's static quantizer knows (Add, Mul, Softmax, norms, ...)
DEFAULT_OPS = PRODUCT_OPS    # the products in INT8, everything between them float (see the module docstring)
FLOAT_PARTS = ("head", "patch", "merged")
DEFAULT_FLOAT: tuple[str, ...] = ()
INT8_PRODUCT_OPS = ("MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "QGemm")
CONV_OPS = ("Conv", "ConvInteger", "QLinearConv")
METADATA_KEY = "hetprune.int8"


@dataclass(frozen=True)
class Int8Settings:
    """How a model is quantized; `checked` says what is wrong with a bad value, and what is allowed."""

    scheme: str = "int8"
    per_channel: bool = True
    calibration: int = DEFAULT_CALIBRATION
    calibration_batch: int = CALIBRATION_BATCH
    seed: int = 0
    ops: tuple[str, ...] = DEFAULT_OPS
    float_parts: tuple[str, ...] = DEFAULT_FLOAT
    max_drop: float = DEFAULT_MAX_DROP
    keep: bool = False
    quantize_outputs: bool = False
    fuse: bool = False
    reduce_range: bool | None = None   # 7-bit weights; None: when this CPU lacks VNNI (`lacks_vnni`)

    def checked(self) -> "Int8Settings":
        if self.scheme not in SCHEMES:
            raise HetpruneError(f"{option('quantize', repr(self.scheme), arg='scheme')} is not a quantization scheme; "
                                f"allowed: {', '.join(SCHEMES)}")
        check_count(self.calibration)
        if isinstance(self.calibration_batch, bool) or not isinstance(self.calibration_batch, int) \
                or self.calibration_batch < 1:
            raise HetpruneError(f"{option('calibration-batch')} must be a whole number >= 1, got "
                                f"{self.calibration_batch!r}")
        ops, parts = _names(self.ops, "int8-ops", "ops"), _names(self.float_parts, "float", "float_parts")
        bad = [o for o in ops if o not in PRODUCT_OPS]
        if (bad or not ops) and ops != (ALL_OPS,):
            what = f"{option('int8-ops', _listed(bad), arg='ops')} " + (
                "is not a product" if len(bad) == 1 else "are not products") + " ONNX Runtime quantizes here" \
                if bad else f"{option('int8-ops', arg='ops')} names no op"
            raise HetpruneError(f"{what}; allowed: {_list_of(PRODUCT_OPS)}, or {_listed([ALL_OPS])} (every op its "
                                "quantizer knows)")
        bad = [p for p in parts if p not in FLOAT_PARTS]
        if bad:
            raise HetpruneError(f"{option('float', _listed(bad), arg='float_parts')} "
                                f"{'is not a part' if len(bad) == 1 else 'are not parts'} of the model; "
                                f"allowed: {_list_of(FLOAT_PARTS)}")
        if isinstance(self.max_drop, bool) or not isinstance(self.max_drop, (int, float)) \
                or not math.isfinite(self.max_drop) or self.max_drop < 0:
            raise HetpruneError(f"{option('max-drop')} must be a number >= 0 (in the metric's units), got "
                                f"{self.max_drop!r}")
        if self.reduce_range is not None and not isinstance(self.reduce_range, bool):
            raise HetpruneError(f"reduce_range must be True, False or None (None: when this CPU lacks VNNI), got "
                                f"{self.reduce_range!r}")
        return Int8Settings(self.scheme, bool(self.per_channel), self.calibration, self.calibration_batch,
                            int(self.seed), ops, parts, float(self.max_drop), bool(self.keep),
                            bool(self.quantize_outputs), bool(self.fuse),
                            lacks_vnni() if self.reduce_range is None else self.reduce_range)

    @property
    def product_ops(self) -> tuple[str, ...]:
        """The product op types put in INT8."""
        return PRODUCT_OPS if self.ops == (ALL_OPS,) else self.ops

    @property
    def static(self) -> bool:
        return self.scheme == "int8"

    def describe(self) -> str:
        weights = "per-channel" if self.per_channel else "per-tensor"
        how = "static QDQ" if self.static else "dynamic"
        return f"{self.scheme} ({how}, {weights} int8 weights)"


VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})   # x86 flags of an INT8 dot product in 32 bits


def lacks_vnni(flags: set[str] | None = None) -> bool:
    """Whether ONNX Runtime's INT8 products here need 7-bit weights (``reduce_range``): on an x86 CPU
    without VNNI its u8 x s8 kernels add pairs of products in 16 bits, which full-range weights can
    saturate (seen here: one logit off by a third on an AVX2 machine). ``flags``: the CPU's (default:
    this one's, `cpu_flags`); where they cannot be read (not Linux) an x86 CPU is assumed to lack it;
    other CPUs (ARM) do not need it."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    flags = cpu_flags() if flags is None else flags
    return flags is None or not flags & VNNI_FLAGS


def _names(value, flag: str, arg: str) -> tuple[str, ...]:
    """A list of names as a tuple; one name given as a string is that name (``ops="MatMul"``), not its letters."""
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise HetpruneError(f"{option(flag, repr(value), arg=arg)} is not a list of names") from None


def _listed(names) -> str:
    """Names as the caller writes them: ``head,merged`` on the command line; ``['head', 'merged']`` (one name:
    ``'head'``) in a Python call."""
    names = list(names)
    if on_command_line():
        return ",".join(names)
    return repr(names[0]) if len(names) == 1 else repr(names)


def _list_of(allowed) -> str:
    """What a list option allows, as the caller writes it."""
    if on_command_line():
        return f"a comma list of {', '.join(allowed)}"
    return f"a list (or one name) of {', '.join(map(repr, allowed))}"


# -- which nodes are which part of the model -----------------------------------------------------
def _scopes(node) -> list[str]:
    """The module paths the dynamo exporter recorded for ``node`` (``pkg.torch.onnx.name_scopes``)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                return [s for s in ast.literal_eval(prop.value) if isinstance(s, str)]
            except (ValueError, SyntaxError):
                return []
    return []


def _products(graph) -> list:
    return [n for n in graph.node if n.op_type in PRODUCT_OPS]


def _nearest_products(graph, start: list[str], downstream: bool) -> list[str]:
    """The product nodes nearest to the tensors ``start``: walking from the graph's input (``downstream``) or
    back from its output, through every node that is not a product (nor a ``Shape``, whose output is the
    tensor's size, not its values)."""
    init = {t.name for t in graph.initializer}
    by_input: dict[str, list] = {}
    by_output = {}
    for n in graph.node:
        for t in n.input:
            by_input.setdefault(t, []).append(n)
        for t in n.output:
            by_output[t] = n
    seen, found, todo = set(), [], list(start)
    while todo:
        t = todo.pop()
        nodes = by_input.get(t, []) if downstream else [by_output[t]] if t in by_output else []
        for n in nodes:
            if n.name in seen:
                continue
            seen.add(n.name)
            if n.op_type in ("Shape", "Size"):
                continue
            if n.op_type in PRODUCT_OPS:
                found.append(n.name)
            else:
                todo.extend(n.output if downstream else [i for i in n.input if i and i not in init])
    return sorted(found)


def merged_modules(model: nn.Module) -> list[str]:
    """The module paths of the merged MLPs (``fc2·fc1`` folded into one layer) in ``model``."""
    from ...model.block_modules import MergedMlp

    return [name for name, m in model.named_modules() if isinstance(m, MergedMlp)]


def part_nodes(graph, model: nn.Module, parts) -> dict[str, list[str]]:
    """The product nodes of each part in ``parts``: ``head`` (the products nearest the output), ``patch`` (those
    nearest the input) and ``merged`` (those inside a merged MLP, by the module scopes the exporter records)."""
    found: dict[str, list[str]] = {}
    if "head" in parts:
        found["head"] = _nearest_products(graph, [o.name for o in graph.output], downstream=False)
    if "patch" in parts:
        found["patch"] = _nearest_products(graph, [i.name for i in graph.input], downstream=True)
    if "merged" in parts:
        paths = merged_modules(model)
        nodes = [n.name for n in _products(graph) if any(p in _scopes(n) for p in paths)]
        if paths and len(nodes) < len(paths):
            raise HetpruneError(f"cannot find the {len(paths)} merged MLPs in the ONNX graph (its nodes carry no "
                                "module scopes from the exporter); drop 'merged' from "
                                f"{option('float', arg='float_parts')}")
        found["merged"] = sorted(nodes)
    return found


# -- census of an INT8 graph ---------------------------------------------------------------------
def int8_census(onnx_model) -> dict[str, int]:
    """The products of a graph and how many of them compute in INT8: an integer op (dynamic quantization), or
    a product whose two inputs are both dequantized INT8 tensors (QDQ). ``products`` are the matrix products
    the op census counts (`op_census`'s ``matmul``: two inside each fused ``Attention`` op, which stays
    float) plus the convolutions (the patch embedding), also counted alone (``convolutions``,
    ``int8_convolutions``), so that a summary of both reads the same numbers (`describe_int8`)."""
    dq = {t for n in onnx_model.graph.node if n.op_type == "DequantizeLinear" for t in n.output}
    nodes = [n for n in onnx_model.graph.node if n.op_type in PRODUCT_OPS + INT8_PRODUCT_OPS]
    convs = [n for n in nodes if n.op_type in CONV_OPS]

    def in_int8(n) -> bool:
        return n.op_type in INT8_PRODUCT_OPS or all(t in dq for t in n.input[:2])

    return {"products": op_census(onnx_model)["matmul"] + len(convs), "int8": sum(map(in_int8, nodes)),
            "convolutions": len(convs), "int8_convolutions": sum(map(in_int8, convs))}


def describe_int8(census: dict) -> str:
    """``19 of 19 matrix products and 1 of 1 convolution in INT8``: the matrix products are the graph census's
    (``matmul``), the convolutions counted apart, so the two lines of a summary agree."""
    def count(n: int, of: int, what: str) -> str:
        return f"{n} of {of} {what}{'' if of == 1 else 's'}"

    convs, int8_convs = census.get("convolutions", 0), census.get("int8_convolutions", 0)
    text = count(census["int8_products"] - int8_convs, census["products"] - convs, "matrix product")
    return text + (f" and {count(int8_convs, convs, 'convolution')}" if convs else "") + " in INT8"


def _expected_int8(graph, settings: Int8Settings, excluded: set[str]) -> int:
    """How many products the quantizer is asked to put in INT8: those of the ``ops`` types not kept in float
    (dynamic quantization: products with a constant weight, ``MatMul`` and ``Gemm``, which ONNX Runtime
    rewrites as ``MatMulInteger``; it is asked for them with ``MatMul`` in ``ops``)."""
    init = {t.name for t in graph.initializer}
    want = 0
    for n in _products(graph):
        if n.name in excluded:
            continue
        if settings.static:
            want += n.op_type in settings.product_ops
        else:
            want += "MatMul" in settings.product_ops and n.op_type in ("MatMul", "Gemm") and n.input[1] in init
    return want


def _check_int8_graph(path: Path, fp32_census: dict, expected: int) -> dict:
    onnx = need("onnx", "INT8 export")
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise HetpruneError(f"the INT8 graph fails onnx.checker: {str(exc).splitlines()[0]}") from exc
    graph = onnx.load(str(path))
    census, int8 = op_census(graph), int8_census(graph)
    if census != fp32_census:
        diff = ", ".join(f"{k}: INT8 graph {census[k]}, fp32 graph {fp32_census[k]}" for k in census
                         if census[k] != fp32_census.get(k))
        raise HetpruneError(f"quantization changed the graph's structure ({diff}); no file was written")
    if int8["int8"] != expected:
        raise HetpruneError(f"the INT8 graph computes {int8['int8']} of its {int8['products']} products in INT8, "
                            f"but {expected} were asked for; no file was written")
    return {**census, **{f"{k}_products" if k == "int8" else k: v for k, v in int8.items()}}


# -- quantizing ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_quantizer():
    """ONNX Runtime's quantization tools log warnings on the root logger (pre-processing advice, per-channel
    axes of tensors they then skip); what matters is checked afterwards."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _reader(images: np.ndarray, input_name: str, batch: int, fixed: int | None):
    """A ``CalibrationDataReader`` over ``images`` in runs of ``batch`` (or exactly the file's fixed batch: the
    last run then wraps round to the first images, which leaves MinMax ranges as they are)."""
    from onnxruntime.quantization import CalibrationDataReader

    size = fixed or batch
    if fixed and len(images) % fixed:
        images = np.concatenate([images, images[:fixed - len(images) % fixed]])

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.runs = iter(range(0, len(images), size))

        def get_next(self):
            start = next(self.runs, None)
            return None if start is None else {input_name: images[start:start + size]}

    return Reader()


def quantize_file(source: Path, out: Path, settings: Int8Settings, excluded: list[str],
                  images: np.ndarray | None = None) -> None:
    """Quantize the fp32 ONNX file ``source`` into ``out`` with ONNX Runtime's tools, as ``settings`` say."""
    quantization = need("onnxruntime.quantization", "INT8 export")
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    with _quiet_quantizer():
        if settings.static:
            import onnxruntime as ort

            session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
            reader = _reader(images, session.get_inputs()[0].name, settings.calibration_batch, fixed_batch(session))
            del session
            # a Conv with a float output would run in float: its output is always requantized
            extra = {} if settings.quantize_outputs else {"OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"]}
            quantization.quantize_static(
                str(source), str(out), reader, quant_format=QuantFormat.QDQ,
                op_types_to_quantize=None if settings.ops == (ALL_OPS,) else list(settings.ops),
                per_channel=settings.per_channel, reduce_range=settings.reduce_range, activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8, nodes_to_exclude=list(excluded),
                calibrate_method=CalibrationMethod.MinMax, extra_options=extra)
        else:   # it rewrites a Gemm as a MatMul named NAME_MatMul (and an Add) before it reads the exclusions
            quantization.quantize_dynamic(
                str(source), str(out), op_types_to_quantize=[o for o in settings.product_ops if o == "MatMul"],
                per_channel=settings.per_channel, reduce_range=settings.reduce_range, weight_type=QuantType.QInt8,
                nodes_to_exclude=[*excluded, *(f"{n}_MatMul" for n in excluded)],
                extra_options={"MatMulConstBOnly": True})


def fuse_file(source: Path, out: Path, model: nn.Module, verify_batch: int, threads: int | None) -> None:
    """ONNX Runtime's transformer fusions on the fp32 graph (LayerNorm with the residual add, bias with GELU),
    then the fused graph checked against the PyTorch model as the export was. Attention is left unfused: a
    fused ``Attention`` op would keep its products out of QDQ quantization."""
    need("onnxruntime.transformers", "INT8 export with fusions")
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from .to_onnx import verify_onnx

    options = FusionOptions("vit")
    options.enable_attention = False
    with _quiet_quantizer():
        optimize_model(str(source), model_type="vit", optimization_options=options, opt_level=0).save_model_to_file(
            str(out))
    verify_onnx(out, model, "fp32", batch=verify_batch, threads=threads)


# -- checking ------------------------------------------------------------------------------------
@torch.inference_mode()
def compare_int8(got, reference, images: int) -> dict:
    """The INT8 file's outputs (``got``, nested as the model nests them, `OnnxModule`) against the fp32 PyTorch
    model's on ``images`` images, output by output: top-1 agreement (over the last dimension) and error. The
    figures are the worst output's (lowest agreement, largest relative error); with several outputs each one's
    are listed under ``outputs``. Outputs of other shapes, or not finite, are an error."""
    refs, gots = dict(tensors.leaves(reference)), dict(tensors.leaves(got))
    if tensors.shapes(got) != tensors.shapes(reference):
        raise HetpruneError(f"the INT8 file gives outputs {tensors.describe(tensors.shapes(got))}, torch gives "
                            f"{tensors.describe(tensors.shapes(reference))}; no file was written")
    outputs = []
    for where, ref in refs.items():
        ref, out = ref.float(), gots[where].float()
        if not torch.isfinite(out).all():
            raise HetpruneError(f"the INT8 file's output{' ' + where if where else ''} is not finite (NaN or inf) "
                                "on the check batch; no file was written")
        err = (out - ref).abs().max().item() if ref.numel() else 0.0
        scale = max(ref.abs().max().item(), 1e-12) if ref.numel() else 1.0
        agreement = (out.argmax(-1) == ref.argmax(-1)).float().mean().item() if ref.dim() > 1 and ref.numel() \
            else None
        outputs.append({"output": where, "top1_agreement": agreement, "max_abs_error": err,
                        "relative_error": err / scale})
    worst = max(outputs, key=lambda o: o["relative_error"])
    agreements = [o["top1_agreement"] for o in outputs if o["top1_agreement"] is not None]
    result = {"images": images, "top1_agreement": min(agreements) if agreements else None,
              "max_abs_error": worst["max_abs_error"], "relative_error": worst["relative_error"]}
    if len(outputs) > 1:
        result["outputs"] = outputs
    return result


def metric_drop(task, fp32: nn.Module, int8: nn.Module) -> dict:
    """The task's metric of the fp32 PyTorch model and of the INT8 file (an `OnnxModule`: through ONNX
    Runtime), each measured by the task's own metric on its own validation data, and the drop (positive:
    INT8 is worse, whichever way the metric goes)."""
    fp32_value = task.evaluate(fp32, device="cpu")
    int8_value = task.evaluate(int8, device="cpu")
    drop = (fp32_value - int8_value) if task.higher_is_better else (int8_value - fp32_value)
    return {"name": task.metric_name, "fp32": fp32_value, "int8": int8_value, "drop": drop,
            "higher_is_better": task.higher_is_better}


def _write_metadata(path: Path, info: dict) -> None:
    """What was checked, in the file itself (``metadata_props``): scheme, calibration, metric, costs."""
    onnx = need("onnx", "INT8 export")
    graph = onnx.load(str(path))
    for prop in list(graph.metadata_props):
        if prop.key == METADATA_KEY:
            graph.metadata_props.remove(prop)
    graph.metadata_props.add(key=METADATA_KEY, value=json.dumps(info, sort_keys=True))
    onnx.save(graph, str(path))


def read_metadata(path: str | Path) -> dict | None:
    """The ``hetprune.int8`` metadata of an ONNX file written by `export_int8`, or None."""
    onnx = need("onnx", "reading ONNX files")
    graph = onnx.load(str(path), load_external_data=False)
    value = next((p.value for p in graph.metadata_props if p.key == METADATA_KEY), None)
    return json.loads(value) if value else None


def _task_of(task):
    from ...training.task import as_task

    if task is None:
        how = "pass --data digits, digit-pairs or PATH" if on_command_line() else \
            "pass task=: a hetprune.Task, or a DataBundle such as hetprune.training.embedded_data.digits()"
        raise HetpruneError("INT8 export needs the model's task: its training images to calibrate on and its "
                            f"validation data for the metric check; {how}")
    return as_task(task)


def _fp32_then_int8(tmp: Path, model: nn.Module, base, settings: Int8Settings, calib, log, **export) -> tuple:
    """The checked fp32 export (in a temporary folder), quantized into ``tmp``: ``(fp32 check, float parts,
    INT8 products asked for, seconds)``."""
    onnx = need("onnx", "INT8 export")
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="hetprune-int8-") as work:
        fp32_path = Path(work) / "fp32.onnx"
        log("exporting the fp32 graph and checking it (census, ONNX Runtime against PyTorch) ...")
        t0 = time.perf_counter()
        fp32 = export_onnx(model, fp32_path, base=base, **export)
        seconds["fp32_export"] = time.perf_counter() - t0
        graph = onnx.load(str(fp32_path)).graph
        parts = part_nodes(graph, model, settings.float_parts)
        excluded = sorted({n for nodes in parts.values() for n in nodes})
        expected = _expected_int8(graph, settings, set(excluded))
        del graph
        t0 = time.perf_counter()
        log(f"calibrating on {len(calib)} images in runs of {settings.calibration_batch} and quantizing "
            f"({settings.describe()}) ..." if settings.static else f"quantizing ({settings.describe()}) ...")
        source = fp32_path
        if settings.fuse:
            source = Path(work) / "fused.onnx"
            fuse_file(fp32_path, source, model, fp32["verified_batch"], export.get("threads"))
        quantize_file(source, tmp, settings, excluded, calib.numpy() if calib is not None else None)
        seconds["quantize"] = time.perf_counter() - t0
    return fp32, parts, expected, seconds


def export_int8(model: nn.Module, out: str | Path, task, *, images=None, base: nn.Module | None = None,
                scheme: str = "int8", per_channel: bool = True, calibration: int = DEFAULT_CALIBRATION,
                calibration_batch: int = CALIBRATION_BATCH, seed: int = 0, ops=DEFAULT_OPS,
                float_parts=DEFAULT_FLOAT, max_drop: float = DEFAULT_MAX_DROP, keep: bool = False,
                quantize_outputs: bool = False, fuse: bool = False, reduce_range: bool | None = None,
                opset: int = DEFAULT_OPSET,
                dynamic_batch: bool = False, batch: int = 1, threads: int | None = None,
                metadata: dict | None = None, log=None, overwrite: bool = False) -> dict:
    """Write ``model`` as an INT8 ONNX file at ``out``, checked; return what was checked.

    ``task`` (a `hetprune.Task` or a DataBundle) gives the calibration images (its training data, or
    ``images``: then they are also the batch the file is compared with the fp32 model on) and the metric,
    measured by the task's own metric function on its own validation data, the INT8 file run through ONNX
    Runtime as a module that returns what the model returns (a tuple or dict for a model with several
    outputs); ``base`` (the unpruned model) is what the fp32 graph's census is checked against, as in
    `export_onnx`. ``scheme``: ``int8`` (static QDQ, calibrated on ``calibration`` images in runs of
    ``calibration_batch``, seeded by ``seed``) or ``int8-dynamic``; ``per_channel``: weight scales per output
    channel (else one per tensor); ``ops``: the product types put in INT8 (``"all"``: every op type ONNX
    Runtime's quantizer knows); ``quantize_outputs``: requantize each MatMul's output to INT8 (default: it
    stays float); ``fuse``: ONNX Runtime's transformer fusions on the fp32 graph first; ``float_parts``:
    parts of the model kept in float (``head``, ``patch``, ``merged``). ``ops`` and ``float_parts`` take a
    list, or one name as a string. ``batch`` (a whole number >= 1) is the file's batch unless
    ``dynamic_batch``. The file is written only when every check passes and the metric drops by at most
    ``max_drop`` (``keep``: write it anyway, and say so); an existing ``out`` is refused before any work
    unless ``overwrite``. ``reduce_range``: 7-bit weights, which ONNX Runtime's kernels need on an x86 CPU
    without VNNI (None, the default: when the CPU running the export lacks it, `lacks_vnni`; pass True for
    a file that will run on such a CPU). ``metadata``: more to record in the file.
    """
    log = log or (lambda msg: None)
    settings = Int8Settings(scheme, per_channel, calibration, calibration_batch, seed, ops, float_parts, max_drop,
                            keep, quantize_outputs, fuse, reduce_range).checked()
    check_batch(batch)
    out = Path(out)
    check_output(out, overwrite)
    for module in ("onnx", "onnxruntime", "onnxruntime.quantization"):
        need(module, "INT8 export")
    task = _task_of(task)
    from ...model.macs import count_macs, count_params
    from ...model.spec import input_shape_of
    from ...training.task import check_data_fits

    shape = input_shape_of(model)
    fp32_model = copy.deepcopy(model).eval().cpu().float()
    check_data_fits(task, fp32_model)
    started = time.perf_counter()
    calib = calibration_images(task, settings.calibration, settings.seed, shape, images) if settings.static \
        else None
    check_x, check_source = check_images(task, CHECK_IMAGES, settings.seed, shape, images)
    with torch.inference_mode():
        reference = fp32_model(check_x)
    tmp = _temp_path(out)
    try:
        fp32, parts, expected, seconds = _fp32_then_int8(tmp, model, base, settings, calib, log, opset=opset,
                                                         dynamic_batch=dynamic_batch, batch=batch, threads=threads)
        census = _check_int8_graph(tmp, fp32["census"], expected)
        int8_model = OnnxModule(onnx_session(tmp, threads=threads), like=reference)
        check = {**compare_int8(int8_model(check_x), reference, len(check_x)), "source": check_source}
        log(f"measuring the task's metric ({task.metric_name}) on its validation data through ONNX Runtime ...")
        metric = metric_drop(task, fp32_model, int8_model)
        del int8_model
        over = metric["drop"] > settings.max_drop
        if over and not settings.keep:
            raise HetpruneError(f"INT8 loses {metric['drop']:.2f} of {metric['name']} ({metric['fp32']:.2f} fp32 -> "
                                f"{metric['int8']:.2f} INT8), more than {option('max-drop', f'{settings.max_drop:g}')}"
                                f"; no file was written ({switch('keep')} writes it anyway; "
                                f"{option('quantize', _listed(['int8-dynamic']), arg='scheme')}, or "
                                f"{option('float', _listed(['head', 'merged']), arg='float_parts')}, may lose less)")
        calibration_info = ({"images": len(calib), "source": "images given" if images is not None else
                             f"training data of {task.name}", "seed": settings.seed,
                             "batch": settings.calibration_batch, "method": "MinMax"} if settings.static else None)
        info = {"scheme": settings.scheme, "per_channel": settings.per_channel,
                "reduce_range": settings.reduce_range, "ops": list(settings.ops),
                "float_parts": {p: len(n) for p, n in parts.items()}, "calibration": calibration_info,
                "metric": metric, "max_drop": settings.max_drop, "kept_over_max_drop": over,
                "check": check, "census": census, "params": count_params(model),
                "macs": count_macs(fp32_model, check_x[:1]), **(metadata or {})}
        _write_metadata(tmp, info)
        _publish(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    seconds["total"] = time.perf_counter() - started
    return {"format": "onnx", "path": str(out), "opset": opset, "dynamic_batch": dynamic_batch, "batch": batch,
            "settings": asdict(settings), "fp32": fp32, "seconds": seconds, **info}
