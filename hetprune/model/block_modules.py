"""The modules surgery puts into a model, and the arithmetic of a merge.

A [`BlockLayout`][hetprune.model.block_modules.BlockLayout] (given by the
family's adapter) names the children of a pre-norm block, and a block with
its attention removed keeps them under those names, so the state-dict keys of
what is kept never change and a recipe replayed on a fresh base model loads
the saved weights. `HetBlock` and `DroppedBlock` stand in timm's blocks and
script with TorchScript (fixed children, named arguments); `EagerHetBlock` and
`EagerDroppedBlock` serve any other family (any names, any arguments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..core.config import ATTN_MODES  # noqa: F401 - re-exported: hetprune.model.block_modules.ATTN_MODES
from ..core.errors import HetpruneError


@dataclass(frozen=True)
class BlockLayout:
    """Child names of a pre-norm block ``x + s1·attn(norm1(x)); x + s2·mlp(norm2(x))``.

    ``attn_scale``/``mlp_scale`` name a LayerScale module (with ``gamma``), a
    gamma parameter, or ``None`` (no scale); a name whose attribute is
    ``None`` on the block also means no scale.
    """

    norm1: str = "norm1"
    attn: str = "attn"
    attn_scale: str | None = "ls1"
    norm2: str = "norm2"
    mlp: str = "mlp"
    mlp_scale: str | None = "ls2"
    drop_path2: str | None = "drop_path2"
    drop_path1: str | None = "drop_path1"   # the attention branch's stochastic depth (a fine-tune's drop_path)
    act: str = "act"            # the activation, a child of the MLP (which has ``fc1`` and ``fc2``)


def apply_scale(owner: nn.Module, name: str | None, x: torch.Tensor) -> torch.Tensor:
    scale = getattr(owner, name, None) if name else None
    if scale is None:
        return x
    if isinstance(scale, nn.Module):
        return scale(x)
    return scale * x


class HetBlock(nn.Module):
    """A pre-norm block whose attention branch is gone, TorchScript-able.

    ``identity`` (default): the block is ``x + s2·mlp(norm2(x))``.
    ``ln-residual`` (the reference release): ``x + norm1(x)`` first.
    The kept children keep their names, so their state-dict keys do not
    change. The forward reads them under timm's names (``norm1``, ``norm2``,
    ``mlp``, a scale ``ls2`` or ``gamma_2``, a drop path ``drop_path2`` or
    ``drop_path``) and takes, by name, the arguments timm's families pass to
    a block (``attn_mask``, ``is_causal``, ``rope``, ``shared_rel_pos_bias``,
    ``shared_rel_pos``), unused: they only fed the attention that is gone.
    So a scripted model calls it as it called the block. A family with other
    names or arguments uses `EagerHetBlock`.
    """

    #: the names a layout may give each kept child here (None: no such child)
    NAMES = {"norm1": ("norm1",), "norm2": ("norm2",), "mlp": ("mlp",), "mlp_scale": ("ls2", "gamma_2", None),
             "drop_path2": ("drop_path2", "drop_path", None)}

    def __init__(self, block: nn.Module, layout: BlockLayout, attn_mode: str = "identity"):
        super().__init__()
        if attn_mode not in ATTN_MODES:
            raise HetpruneError(f"attention removal mode must be one of {ATTN_MODES}, got {attn_mode!r}")
        self._check_names(layout)
        self.attn_mode = attn_mode
        self.layout = layout
        names = [layout.norm2, layout.mlp, layout.mlp_scale, layout.drop_path2]
        if attn_mode == "ln-residual":
            names.append(layout.norm1)
        for name in names:
            if name and getattr(block, name, None) is not None:
                value = getattr(block, name)
                if isinstance(value, (nn.Module, nn.Parameter)):
                    setattr(self, name, value)
                else:
                    self.register_buffer(name, value)

    @classmethod
    def _check_names(cls, layout: BlockLayout) -> None:
        odd = [f"{field}={getattr(layout, field)!r}" for field, names in cls.NAMES.items()
               if getattr(layout, field) not in names]
        if odd:
            raise HetpruneError(f"HetBlock reads its children under timm's names; this layout has {', '.join(odd)}: "
                                "use EagerHetBlock")

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                rope: Optional[torch.Tensor] = None, shared_rel_pos_bias: Optional[torch.Tensor] = None,
                shared_rel_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        # hasattr on a module is decided when scripting: each branch is there only for the children this block has
        if hasattr(self, "norm1"):   # ln-residual
            x = x + self.norm1(x)
        y = self.mlp(self.norm2(x))
        if hasattr(self, "ls2"):
            y = self.ls2(y)
        if hasattr(self, "gamma_2"):
            y = self.gamma_2 * y
        if hasattr(self, "drop_path2"):
            y = self.drop_path2(y)
        if hasattr(self, "drop_path"):
            y = self.drop_path(y)
        return x + y

    def set_input_size(self, *args, **kwargs) -> None:
        """Nothing here depends on the input size (timm's Swin sets it on every block of a stage)."""

    def extra_repr(self) -> str:
        return f"attention removed ({self.attn_mode})"


class EagerHetBlock(HetBlock):
    """A `HetBlock` for any `BlockLayout` and any call: it finds the kept children by the layout's names and
    takes whatever arguments the family passes its blocks (a user's own transformer, Hugging Face's ViT).
    Not TorchScript-able: scripting it is refused."""

    @classmethod
    def _check_names(cls, layout: BlockLayout) -> None:
        pass

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        L = self.layout
        if self.attn_mode == "ln-residual":
            x = x + getattr(self, L.norm1)(x)
        y = apply_scale(self, L.mlp_scale, getattr(self, L.mlp)(getattr(self, L.norm2)(x)))
        drop = getattr(self, L.drop_path2, None) if L.drop_path2 else None
        return x + (drop(y) if drop is not None else y)

    def __prepare_scriptable__(self):
        raise _not_scriptable(self)


class DroppedBlock(nn.Module):
    """A whole block removed (classic depth pruning): the block is the identity.

    Takes the arguments timm's families pass to a block, by name, so a scripted
    model calls it as it called the block (`EagerDroppedBlock` takes any).
    """

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                rope: Optional[torch.Tensor] = None, shared_rel_pos_bias: Optional[torch.Tensor] = None,
                shared_rel_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x

    def set_input_size(self, *args, **kwargs) -> None:
        """Nothing here depends on the input size (timm's Swin sets it on every block of a stage)."""


class EagerDroppedBlock(DroppedBlock):
    """A `DroppedBlock` that takes any arguments; not TorchScript-able: scripting it is refused."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return x

    def __prepare_scriptable__(self):
        raise _not_scriptable(self)


def _not_scriptable(module: nn.Module) -> HetpruneError:
    return HetpruneError(f"torch.jit.script cannot compile a {type(module).__name__}: it takes any arguments, as the "
                         "blocks of this family are called (a user's own transformer, Hugging Face's ViT); "
                         "only timm's families get TorchScript-able blocks (docs/adapters.md)")


class RemovedActivation(nn.Identity):
    """Marks an MLP whose activation was removed: the MLP is now linear."""


class LinearMlp(nn.Module):
    """``fc2(norm(fc1(x)))``: what a gated MLP becomes when its gate is removed.

    ``act`` is a `RemovedActivation`, so it reads like any MLP whose
    activation was removed and merges the same way (when ``norm`` is the
    identity).
    """

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, norm: nn.Module | None = None):
        super().__init__()
        self.fc1 = fc1
        self.act = RemovedActivation()
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.fc1(x)))


class MergedMlp(nn.Module):
    """``fc2(fc1(x))`` folded into one linear layer (``fc``)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def is_linear_mlp(mlp: nn.Module, act: str = "act") -> bool:
    """An MLP with ``fc1``/``fc2`` whose activation (child ``act``) was removed and with no norm between them."""
    return (isinstance(getattr(mlp, act, None), RemovedActivation)
            and isinstance(getattr(mlp, "norm", None) or nn.Identity(), nn.Identity)
            and isinstance(getattr(mlp, "fc1", None), nn.Linear) and isinstance(getattr(mlp, "fc2", None), nn.Linear))


def merge_pays(mlp: nn.Module) -> bool:
    """True when one ``in x out`` linear costs fewer MACs than ``fc1`` + ``fc2``."""
    d_in, hidden, d_out = mlp.fc1.in_features, mlp.fc1.out_features, mlp.fc2.out_features
    return d_in * d_out < hidden * (d_in + d_out)


@torch.no_grad()
def merged_weights(fc1: nn.Linear, fc2: nn.Linear, scale: torch.Tensor | None = None,
                   norm: nn.LayerNorm | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W, b)`` of ``scale * fc2(fc1(norm_affine(x)))`` in float64.

    ``scale`` is a LayerScale gamma folded in; ``norm`` an affine LayerNorm
    whose ``weight``/``bias`` are folded in (the norm itself stays, without
    affine).
    """
    device = fc1.weight.device
    w1, w2 = fc1.weight.double(), fc2.weight.double()
    zeros = lambda n: torch.zeros(n, dtype=torch.float64, device=device)  # noqa: E731
    b1 = fc1.bias.double() if fc1.bias is not None else zeros(w1.shape[0])
    b2 = fc2.bias.double() if fc2.bias is not None else zeros(w2.shape[0])
    weight, bias = w2 @ w1, w2 @ b1 + b2
    if scale is not None:
        g = scale.double()
        weight, bias = g[:, None] * weight, g * bias
    if norm is not None:
        gamma = norm.weight.double()
        beta = norm.bias.double() if norm.bias is not None else torch.zeros_like(gamma)
        bias = weight @ beta + bias
        weight = weight * gamma[None, :]
    return weight, bias


def plain_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    """The same normalisation without its affine (what remains after folding it)."""
    ref = norm.weight
    return nn.LayerNorm(norm.normalized_shape, eps=norm.eps, elementwise_affine=False).to(device=ref.device)


def foldable_norm(norm: nn.Module) -> bool:
    return isinstance(norm, nn.LayerNorm) and norm.elementwise_affine


def merged_mlp(weight: torch.Tensor, bias: torch.Tensor, like: nn.Linear) -> MergedMlp:
    merged = MergedMlp(weight.shape[1], weight.shape[0]).to(device=like.weight.device, dtype=like.weight.dtype)
    with torch.no_grad():
        merged.fc.weight.copy_(weight.to(like.weight.dtype))
        merged.fc.bias.copy_(bias.to(like.weight.dtype))
    return merged
