"""Counting cost: parameters and MACs (multiply-accumulates, not FLOPs; one MAC
is two FLOPs) per image, for dense and pruned models alike.

Counted: every Linear and Conv2d, and the two attention matmuls (q·kᵀ and
attn·v) wherever attention runs. Inside an attention module its adapter knows,
the adapter computes them from the module's input (heads, head dim, tokens; per
window for Swin, one query for CaiT's class attention). Everywhere else they
are counted at the function level, as they run: every
``F.scaled_dot_product_attention``, matmul and functional ``F.linear`` outside
a counted module (an attention-pool head such as SigLIP's ``global_pool='map'``,
timm's differential attention, an attention variant newer than the adapter).
An op that computes a product this cannot size (``einsum``, ``nn.MultiheadAttention``)
is refused with one error rather than counted as 0. Not counted: norms,
activations, softmax, additions (they are a small share and do not map to MACs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .adapters import adapter_for
from ..core.errors import HetpruneError

CONVENTION = "MACs per image (1 MAC = 2 FLOPs); Linear, Conv2d and attention matmuls q·kᵀ, attn·v"

# matmuls as torch functions and tensor methods: the index of the left operand (its last dim is contracted)
_MATMULS = {torch.matmul: 0, torch.Tensor.matmul: 0, torch.Tensor.__matmul__: 0, torch.Tensor.__rmatmul__: 1,
            torch.bmm: 0, torch.Tensor.bmm: 0, torch.mm: 0, torch.Tensor.mm: 0,
            torch.baddbmm: 1, torch.Tensor.baddbmm: 1, torch.addmm: 1, torch.Tensor.addmm: 1}
_MATMULS.update({getattr(torch._C.TensorBase, name): i for name, i in (("matmul", 0), ("__matmul__", 0),
                                                                       ("__rmatmul__", 1), ("bmm", 0), ("mm", 0),
                                                                       ("baddbmm", 1), ("addmm", 1))
                 if hasattr(torch._C.TensorBase, name)})
MATMUL_FUNCTIONS = frozenset(_MATMULS)   # how a torch function mode sees a matrix product (the ONNX census too)
# products whose MACs are not sized here: refused outside a counted module, never silently 0
_UNSIZED = {torch.einsum: "torch.einsum", F.multi_head_attention_forward: "nn.MultiheadAttention's attention",
            torch.bilinear: "torch.bilinear", torch.tensordot: "torch.tensordot"}


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class _FunctionalMacs(TorchFunctionMode):
    """MACs of the products that run outside every module the hooks count (Linear, Conv2d and the attention
    modules the adapter knows), so attention computed by a function call is counted, not missed."""

    def __init__(self):
        super().__init__()
        self.macs = 0
        self.inside_counted = 0  # > 0 while a counted module runs: its own matmuls are already in its count
        self.path: list[str] = []  # the modules now running, for the error message

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inside_counted:
            return func(*args, **kwargs)
        if func in _UNSIZED:
            where = self.path[-1] if self.path else "the model"
            raise HetpruneError(f"cannot count the MACs of {where}: it computes {_UNSIZED[func]}, which hetprune's "
                                "MAC count does not size; counted are Linear, Conv2d, matmuls, F.linear and "
                                "F.scaled_dot_product_attention (or an attention module its adapter counts)")
        out = func(*args, **kwargs)
        self.macs += _product_macs(func, args, kwargs, out)
        return out


def _product_macs(func, args, kwargs, out) -> int:
    """MACs of one product op from its operands and result (0 for any other op)."""
    if func is F.scaled_dot_product_attention:
        q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")[len(args):]])[:3]
        queries = out.numel() // v.shape[-1]  # batch x heads x query tokens
        return queries * k.shape[-2] * (q.shape[-1] + v.shape[-1])  # q·kᵀ and attn·v
    if func is F.linear:
        weight = args[1] if len(args) > 1 else kwargs["weight"]
        return out.numel() * weight.shape[-1]
    left = _MATMULS.get(func)
    if left is not None and isinstance(out, torch.Tensor):
        return out.numel() * args[left].shape[-1]
    return 0


@torch.no_grad()
def count_macs(model: nn.Module, example: torch.Tensor) -> int:
    """MACs of one forward pass, per image of ``example`` (a batch of inputs)."""
    total = 0
    functional = _FunctionalMacs()
    adapter = adapter_for(model)

    def counted(cost):
        def pre_hook(module, inputs):
            functional.inside_counted += 1

        def hook(module, inputs, output):
            nonlocal total
            functional.inside_counted -= 1
            total += cost(module, inputs, output)

        return pre_hook, hook

    def linear(module, inputs, output):
        return output.numel() // module.out_features * module.in_features * module.out_features

    def conv(module, inputs, output):
        k = module.kernel_size[0] * module.kernel_size[1]
        return output.numel() * (module.in_channels // module.groups) * k

    def attention(module, inputs, output):
        return adapter.attention_macs(module, inputs) or 0

    handles = []
    for name, m in model.named_modules():
        handles += _track(m, name or type(model).__name__, functional.path)
        cost = (linear if isinstance(m, nn.Linear) else conv if isinstance(m, nn.Conv2d)
                else attention if adapter.is_attention(m) else None)
        if cost is not None:
            pre_hook, hook = counted(cost)
            handles += [m.register_forward_pre_hook(pre_hook), m.register_forward_hook(hook)]
    with functional:
        hooked_forward(model, example, handles)
    return (total + functional.macs) // example.shape[0]


def _track(module: nn.Module, name: str, path: list) -> list:
    """Hooks that keep ``path`` the stack of modules now running (``name (Type)``), for error messages."""
    label = f"{name} ({type(module).__name__})"

    def enter(m, inputs):
        path.append(label)

    def leave(m, inputs, output):  # returns None: a forward hook's return value would replace the output
        path.pop()

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


def hooked_forward(model: nn.Module, x: torch.Tensor, handles: list) -> None:
    """One forward pass of ``model`` on ``x`` in eval mode, for the hooks behind ``handles`` to observe; the
    hooks are removed and the model's train/eval mode restored afterwards, also on error."""
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


def cost_summary(model: nn.Module, example: torch.Tensor) -> dict:
    return {"params": count_params(model), "macs": count_macs(model, example), "macs_convention": CONVENTION}


def human(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"
