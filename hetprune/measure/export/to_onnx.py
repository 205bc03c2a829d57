"""ONNX through torch's dynamo exporter, checked three ways before it is kept: ``onnx.checker``, an op
census against the unpruned base model's graph (each removed site takes exactly its ops away), and a run
in ONNX Runtime compared with PyTorch.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from ...model.macs import MATMUL_FUNCTIONS
from ...core.errors import HetpruneError, option
from .common import (DEFAULT_OPSET, INPUT_NAME, _dynamic_shapes, _example, _prepared, _publish, _quiet_exporter,
                     _temp_path, _verify_batch, check_batch, check_dtype, check_output, compare_outputs, need,
                     output_names, verify_input)

# ONNX ops that stand for one piece of a ViT (the exporter spells GELU as Erf before opset 20, and
# attention as MatMul/Softmax/MatMul before opset 23, as one fused Attention op from 23 on)
ATTENTION_OPS = ("Softmax", "Attention")


# GELU is Erf (Gelu from opset 20), tanh-GELU Tanh, SiLU / SwiGLU's gate and QuickGELU Sigmoid: one op each
# (ONNX Runtime's fusions write BiasGelu / FastGelu, one per GELU)
ACTIVATION_OPS = ("Erf", "Gelu", "Tanh", "Sigmoid", "Relu", "BiasGelu", "FastGelu")


# a product as ONNX writes it, and as ONNX Runtime's quantization rewrites it (MatMulInteger; QLinearMatMul and
# QGemm in its QOperator format)
MATMUL_OPS = ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "QGemm")


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


class _AttentionOps(torch.overrides.TorchFunctionMode):
    """Counts, inside the modules it is told to watch, the calls that become attention ops (a softmax; a
    fused attention kernel is a softmax and two products) and products that are not a Linear layer (q·kᵀ,
    attn·v). The mode is off inside its own handler, so a call counts once, not again for what it calls."""

    SOFTMAX = {torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax, torch._C.TensorBase.softmax}
    PRODUCTS = MATMUL_FUNCTIONS | {torch.einsum}

    def __init__(self):
        super().__init__()
        self.inside, self.softmax, self.products = 0, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.inside:
            if func is torch.nn.functional.scaled_dot_product_attention:
                self.softmax, self.products = self.softmax + 1, self.products + 2
            elif func in self.SOFTMAX:
                self.softmax += 1
            elif func in self.PRODUCTS:
                self.products += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def _attention_ops(base: nn.Module, blocks: list[int]) -> dict[str, int]:
    """The attention ops and the products outside Linear layers that the attention modules of ``blocks``
    compute in one forward pass of ``base``: what removing those attention sites takes out of its graph
    (one softmax and two products for a ViT's attention, two and four for differential attention)."""
    from ...model.adapters import adapter_for

    adapter = adapter_for(base)
    every = adapter.blocks(base)
    # the attention branch of each block (with its norm: no softmax, no product), else its attention modules
    watched = [m for i in blocks for m in (adapter.time_parts(base, i).get("attention")
                                           or [m for m in every[i].modules() if adapter.is_attention(m)])]
    count = _AttentionOps()

    def enter(*_):
        count.inside += 1

    def leave(*_):
        count.inside -= 1

    handles = [h for m in watched for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    param = next(base.parameters())
    was_training = base.training
    base.eval()
    try:
        with count:
            base(_example(base, 2, "fp32", False).to(param.device, param.dtype))
    finally:
        for h in handles:
            h.remove()
        base.train(was_training)
    return {"attention": count.softmax, "matmul": count.products}


def expected_census(model: nn.Module, base: nn.Module, base_census: dict[str, int]) -> dict[str, int]:
    """What the pruned graph must hold, given the unpruned ``base`` model and its graph's census.

    Every removed site takes exactly its own ops out of the base graph, and
    nothing else changes: an activation site one activation op; an attention
    site the attention ops and products its attention module computes in
    ``base`` (counted in a forward pass, `_attention_ops`); and matrix
    products change by the linear layers removed or merged. Ops outside the
    sites (CaiT's class attention, a family's extra heads) stay as they are.
    """
    from ...model.sites import sites

    removed = {kind: len(sites(base, kind)) - len(sites(model, kind)) for kind in ("attn", "act")}
    gone = sorted({s.block for s in sites(base, "attn")} - {s.block for s in sites(model, "attn")})
    attention = _attention_ops(base, gone) if gone else {"attention": 0, "matmul": 0}
    return {"attention": base_census["attention"] - attention["attention"],
            "activation": base_census["activation"] - removed["act"],
            "matmul": base_census["matmul"] + _linears(model) - _linears(base) - attention["matmul"]}


def _to_onnx(model: nn.Module, example: torch.Tensor, opset: int, dynamic_batch: bool):
    """torch's dynamo exporter, quietly; its failures become one clear error.

    Where it cannot decompose a fused attention kernel (timm's BEiT and relpos
    attention, torch 2.14), the export is retried with the adapter's explicit
    attention (the same function as plain matmuls and a softmax).
    """
    from ...model.adapters import adapter_for

    names = output_names(model, example)   # logits, or output_0, output_1, ... for a model with several

    def run():
        return torch.onnx.export(model, (example,), None, dynamo=True, opset_version=opset,
                                 input_names=[INPUT_NAME], output_names=names,
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


def check_census(onnx_model, model: nn.Module, base: nn.Module | None, opset: int,
                 dynamic_batch: bool = False) -> dict:
    """The graph's census, checked against the base model's graph when there is a base. The base is exported
    as the model was (``dynamic_batch``): with a free batch the exporter keeps a product of constants that a
    fixed batch folds away (SigLIP's attention-pool query, expanded to the batch)."""
    got = op_census(onnx_model)
    if base is None:
        return got
    base_graph = _to_onnx(_prepared(base, "fp32"), _example(base, 2, "fp32", False), opset, dynamic_batch)
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
                base: nn.Module | None = None, overwrite: bool = False) -> dict:
    """Write ``model`` as ONNX to ``out``, verified; return what was checked.

    The file appears only once ``onnx.checker``, the op census (against the
    graph of ``base``, the unpruned model, when given) and an ONNX Runtime run
    compared with the PyTorch model have passed. ``batch`` (a whole number >= 1)
    is the file's batch, or the traced one with ``dynamic_batch``. An existing
    ``out`` is refused before any work unless ``overwrite``.
    """
    onnx = need("onnx", "ONNX export")
    need("onnxscript", "ONNX export (torch's exporter)")
    need("onnxruntime", "ONNX export (its verification)")
    check_dtype(dtype)
    check_batch(batch)
    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not 1 <= opset <= newest:
        raise HetpruneError(f"{option('opset', repr(opset))} does not exist; onnx {onnx.__version__} knows opsets "
                            f"1..{newest} (default {DEFAULT_OPSET})")
    out = Path(out)
    check_output(out, overwrite)
    m = _prepared(model, dtype)
    tmp = _temp_path(out)
    try:
        program = _to_onnx(m, _example(model, batch, dtype, dynamic_batch), opset, dynamic_batch)
        written = {imp.version for imp in program.model_proto.opset_import if imp.domain in ("", "ai.onnx")}
        if written != {opset}:
            raise HetpruneError(f"{option('opset', str(opset))} is not supported by torch {torch.__version__}'s "
                                f"ONNX exporter (it wrote opset {', '.join(map(str, sorted(written)))}); "
                                f"use the default {DEFAULT_OPSET} (17 to 25 were verified with torch 2.14)")
        with _quiet_exporter():
            program.save(str(tmp))
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as exc:
            raise HetpruneError(f"the exported graph fails onnx.checker at opset {opset}: {exc}") from exc
        census = check_census(onnx.load(str(tmp), load_external_data=False), model, base, opset, dynamic_batch)
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
    got = session.run(None, {session.get_inputs()[0].name: feed})   # every output, in the exporter's order
    with torch.inference_mode():
        reference = _prepared(model, "fp32")(x)
    return {"verified_batch": batch, **compare_outputs(got, reference, dtype, "ONNX Runtime's output")}
